"""SQuAD v1.1 and v2.0 as span-head tasks, following Google BERT's `run_squad.py`: the official JSON files (or
TFDS `squad`), document-stride windows `[CLS] question [SEP] document piece [SEP]`, the n-best span decoding back
to the context's text, the official metrics and the official prediction files.

Splits: `train-v1.1.json` (train), `dev-v1.1.json` (dev), and `<split>-v1.1.json` for any test split named to the
task (the same layout, answers optional); `-v2.0` for v2.0. Without a data directory the task reads TFDS
`squad/v1.1` or `squad/v2.0` (train, and validation as dev).

Tokenizers: the context is split on whitespace into words as run_squad does, and each word is tokenized on its
own, so every piece belongs to one word. WordPiece answers are cut back out of the context with run_squad's
`get_final_text` alignment (which undoes lower-casing and accent stripping). SentencePiece pieces keep the case;
the characters each piece covers in its word are found when encoding (an `[UNK]` piece covers the
characters up to the next known piece, since SentencePiece merges a run of unknown characters into one), and an
answer is cut out of its words at those piece boundaries; a word whose pieces do not spell it (NFKC changed a
character) is taken whole.
"""

import dataclasses
import functools
import json
import re

import numpy as np
from absl import logging
from etils import epath

from bert_jax import paths
from bert_jax.finetune import metrics as metrics_lib
from bert_jax.finetune.task import Encoded, Task, pad_row
from bert_jax.tokenizer import wordpiece

_WORD = re.compile("[^ \t\r\n\u202f]+")  # Between run_squad's whitespace characters (`is_whitespace`).
_WORD_START = "\u2581"  # SentencePiece's word-start mark.
_TFDS_SPLITS = {"train": "train", "dev": "validation"}
_LOGGED_SKIPS = 5  # Skipped training questions logged one by one; the rest only counted.
# The no-answer score difference of a question for which no span could be predicted at all: certainly no answer.
NO_SPAN_SCORE_DIFF = 1e6


@dataclasses.dataclass(frozen=True)
class SquadExample:
  """One question on its paragraph.

  `words`: the context split on whitespace (shared by the paragraph's questions). `answers`: every gold
  (text, answer_start), as in the file. `start_word`, `end_word`: the word span of `answer_text`, the first answer
  that matches the context (-1 and '' when there is none, or the question is impossible): what training learns.
  `labelled`: read from a split with answers (not a test split).
  """

  qid: str
  question: str
  context: str
  title: str
  words: tuple[str, ...]
  answers: tuple[tuple[str, int], ...]
  is_impossible: bool
  start_word: int
  end_word: int
  answer_text: str
  labelled: bool


@dataclasses.dataclass(frozen=True)
class Document:
  """A context's word pieces: `ids`, `pieces` (their strings), `tok_to_orig` [pieces] (each piece's word),
  `orig_to_tok` [words] (each word's first piece), and for SentencePiece `char_spans` [pieces, 2], the characters
  of its word each piece covers (-1 where the word's pieces could not be aligned to it)."""

  ids: list[int]
  pieces: list[str]
  tok_to_orig: np.ndarray
  orig_to_tok: np.ndarray
  char_spans: np.ndarray | None


@dataclasses.dataclass(frozen=True)
class Windows:
  """`Encoded.extra` of SQuAD: what decoding needs besides the logits.

  Per row: `doc_start` (the example's first document piece in the window), `doc_length` (its pieces in the window),
  `doc_offset` (the row position of the first, after [CLS] question [SEP]), all [rows] int32, and
  `token_is_max_context` [rows, seq] bool (run_squad's: the window where this piece has the most context on both
  sides). Per example: `documents`. `kind` and `lower_case`: the tokenizer's, for the de-tokenisation.
  """

  documents: list[Document]
  doc_start: np.ndarray
  doc_length: np.ndarray
  doc_offset: np.ndarray
  token_is_max_context: np.ndarray
  kind: str
  lower_case: bool

  def token_to_orig_map(self, row: int, document: Document) -> np.ndarray:
    """[seq] int32: run_squad's token_to_orig_map of a row, the context word at each position (-1 off the
    document); `document`: that of the row's example, `documents[row_example[row]]`."""
    mapping = np.full(self.token_is_max_context.shape[1], -1, np.int32)
    start, length, offset = self.doc_start[row], self.doc_length[row], self.doc_offset[row]
    mapping[offset : offset + length] = document.tok_to_orig[start : start + length]
    return mapping


@dataclasses.dataclass(frozen=True)
class SquadPredictions:
  """Decoded predictions, per question id: `answers` (the text predictions.json holds: '' for no answer in v2.0,
  at the task's threshold), `best_non_null` (the best non-empty text), `nbest` (run_squad's n-best entries: text,
  probability, start_logit, end_logit) and for v2.0 `null_odds` (null score - best non-null score)."""

  answers: dict[str, str]
  best_non_null: dict[str, str]
  nbest: dict[str, list[dict]]
  null_odds: dict[str, float] | None


class _Squad(Task):
  """SQuAD of one version. `data_dir`: the official JSON files (local or gs://); None reads TFDS (from
  `tfds_data_dir`). `test_splits`: unlabelled splits `<split>-v<version>.json` to predict. `max_query_length`,
  `doc_stride`: run_squad's windowing; `n_best_size`, `max_answer_length`: its decoding."""

  head = "span"
  train_split = "train"
  eval_splits = ("dev",)
  version: str
  with_negative: bool

  def __init__(
    self,
    data_dir: str | None = None,
    *,
    tfds_data_dir: str | None = None,
    test_splits: tuple[str, ...] = (),
    max_query_length: int = 64,
    doc_stride: int = 128,
    n_best_size: int = 20,
    max_answer_length: int = 30,
  ):
    if min(max_query_length, doc_stride, n_best_size, max_answer_length) < 1:
      raise ValueError(
        f"max_query_length={max_query_length}, doc_stride={doc_stride}, n_best_size={n_best_size} and "
        f"max_answer_length={max_answer_length} must all be positive."
      )
    if test_splits and data_dir is None:
      raise ValueError(f"TFDS squad has no test split; test_splits={test_splits} need data_dir.")
    self.data_dir, self.tfds_data_dir = data_dir, tfds_data_dir
    self.test_splits = tuple(test_splits)
    self.max_query_length, self.doc_stride = max_query_length, doc_stride
    self.n_best_size, self.max_answer_length = n_best_size, max_answer_length

  @property
  def tfds_name(self) -> str:
    return f"squad/v{self.version}"

  def split_path(self, split: str) -> epath.Path:
    self._check_split(split)
    return epath.Path(self.data_dir) / f"{split}-v{self.version}.json"

  def _check_split(self, split: str) -> None:
    splits = (self.train_split, *self.eval_splits, *self.test_splits)
    if split not in splits:
      raise ValueError(f"Unknown split {split!r} for {self.name}; expected one of {list(splits)}.")

  def read(self, split: str) -> list[SquadExample]:
    self._check_split(split)
    train, labelled = split == self.train_split, split not in self.test_splits
    if self.data_dir is None:
      return read_tfds(self.tfds_name, _TFDS_SPLITS[split], self.tfds_data_dir, self.with_negative, train)
    path = self.split_path(split)
    if not path.exists():
      raise FileNotFoundError(f"No {split} file {path} for {self.name}.")
    return read_json(path, self.with_negative, labelled=labelled, train=train)

  def encode(self, examples: list[SquadExample], tokenizer, max_seq_length: int) -> Encoded:
    """Windows of every example (see `encode_examples`)."""
    return encode_examples(examples, tokenizer, max_seq_length, self.max_query_length, self.doc_stride)

  def predictions(
    self, encoded: Encoded, logits: np.ndarray, n_best_size: int | None = None, max_answer_length: int | None = None
  ) -> SquadPredictions:
    """run_squad's `write_predictions` decoding of `logits` [rows, seq, 2]; sizes default to the task's."""
    return decode(
      encoded,
      logits,
      n_best_size or self.n_best_size,
      max_answer_length or self.max_answer_length,
      self._null_threshold(),
    )

  def _null_threshold(self) -> float | None:
    return None

  def write_predictions(self, encoded: Encoded, logits: np.ndarray, path: str) -> None:
    """`path` (predictions.json: {question id: answer text}) and beside it nbest_predictions.json and, for v2.0,
    null_odds.json (a file named otherwise than predictions.json prefixes its stem to theirs: dev.json ->
    dev_nbest_predictions.json)."""
    result = self.predictions(encoded, logits)
    path = epath.Path(path)
    prefix = "" if path.name == "predictions.json" else f"{path.stem}_"
    path.parent.mkdir(parents=True, exist_ok=True)
    paths.write_text(path, json.dumps(result.answers, indent=2) + "\n")
    paths.write_text(path.parent / f"{prefix}nbest_predictions.json", json.dumps(result.nbest, indent=2) + "\n")
    if result.null_odds is not None:
      paths.write_text(path.parent / f"{prefix}null_odds.json", json.dumps(result.null_odds, indent=2) + "\n")


class SquadV1(_Squad):
  """SQuAD v1.1: every question has an answer in its paragraph. Metrics: evaluate-v1.1.py's exact_match, f1."""

  name = "squad_v1"
  main_metric = "f1"
  version = "1.1"
  with_negative = False

  def metrics(self, encoded: Encoded, logits: np.ndarray) -> dict[str, float]:
    _check_labelled(encoded.examples, self.name)
    return metrics_lib.squad_v1(official_dataset(encoded.examples), self.predictions(encoded, logits).answers)


class SquadV2(_Squad):
  """SQuAD v2.0: questions may have no answer (`is_impossible`). A question is answered '' when its null score
  (start + end logit of [CLS], the least over its windows) exceeds its best span's by more than
  `null_score_diff_threshold`.

  Metrics: evaluate-v2.0.py's, with the score differences as its no-answer probabilities: exact, f1 (at the task's
  threshold), their HasAns_ / NoAns_ breakdowns, and best_exact, best_f1 with the thresholds that reach them on
  this split (best_f1_thresh is the null_score_diff_threshold to use for test predictions).
  """

  name = "squad_v2"
  main_metric = "best_f1"
  version = "2.0"
  with_negative = True

  def __init__(self, data_dir: str | None = None, *, null_score_diff_threshold: float = 0.0, **kwargs):
    super().__init__(data_dir, **kwargs)
    self.null_score_diff_threshold = null_score_diff_threshold

  def _null_threshold(self) -> float:
    return self.null_score_diff_threshold

  def calibrate(self, encoded: Encoded, logits: np.ndarray) -> dict[str, float]:
    """The threshold that gives `encoded` (dev) its best F1 becomes the one of the prediction files, as run_squad's
    users rerun it with --null_score_diff_threshold=best_f1_thresh.

    evaluate-v2.0.py's search starts from "no answer anywhere" at threshold 0.0, right for probabilities but not
    for score differences, which may all exceed 0: when that start is the best, the threshold goes below the least
    difference, so that the prediction files answer nothing, as scored."""
    _check_labelled(encoded.examples, self.name)
    result = self.predictions(encoded, logits)
    dataset = official_dataset(encoded.examples)

    def scores(threshold: float) -> dict[str, float]:
      return metrics_lib.squad_v2(dataset, result.best_non_null, na_probs=result.null_odds, na_prob_thresh=threshold)

    best = scores(self.null_score_diff_threshold)
    threshold = best["best_f1_thresh"]
    if scores(threshold)["f1"] < best["best_f1"]:
      threshold = min(result.null_odds.values()) - 1.0
    self.null_score_diff_threshold = float(threshold)
    return {"null_score_diff_threshold": self.null_score_diff_threshold, "f1": best["best_f1"]}

  def metrics(self, encoded: Encoded, logits: np.ndarray) -> dict[str, float]:
    _check_labelled(encoded.examples, self.name)
    result = self.predictions(encoded, logits)
    # The best non-null texts with their score differences, not the thresholded answers: evaluate-v2.0.py then
    # scores the task's threshold (na_prob_thresh) exactly as predictions.json, and its best-threshold search can
    # also keep answers that the task's threshold drops.
    return metrics_lib.squad_v2(
      official_dataset(encoded.examples),
      result.best_non_null,
      na_probs=result.null_odds,
      na_prob_thresh=self.null_score_diff_threshold,
    )


# ---------------------------------------------------------------------------------------------------------------
# Reading.


def read_json(path, with_negative: bool, labelled: bool = True, train: bool = False) -> list[SquadExample]:
  """The questions of an official SQuAD JSON file, in file order (see `parse_dataset`)."""
  text = epath.Path(path).read_text(encoding="utf-8")
  if not text.strip():
    raise ValueError(f"{path}: empty file; expected SQuAD JSON {{'data': [...]}}.")
  try:
    content = json.loads(text)
  except json.JSONDecodeError as error:
    raise ValueError(f"{path}: not JSON ({error}).") from error
  if not isinstance(content, dict) or not isinstance(content.get("data"), list):
    raise ValueError(f"{path}: no list 'data' at the top; expected SQuAD JSON {{'data': [...]}}.")
  return parse_dataset(content["data"], str(path), with_negative, labelled, train)


def read_tfds(name: str, split: str, data_dir: str | None, with_negative: bool, train: bool) -> list[SquadExample]:
  """The questions of TFDS `name` (`squad/v1.1`, `squad/v2.0`) split `split`, checked as a JSON file's."""
  import tensorflow_datasets as tfds

  data = []
  for example in tfds.as_numpy(tfds.load(name, split=split, data_dir=data_dir)):
    answers = example["answers"]
    qa = {
      "id": _text(example["id"]),
      "question": _text(example["question"]),
      "answers": [
        {"text": _text(t), "answer_start": int(s)}
        for t, s in zip(answers["text"], answers["answer_start"], strict=True)
      ],
    }
    if "is_impossible" in example:
      qa["is_impossible"] = bool(example["is_impossible"])
    paragraph = {"context": _text(example["context"]), "qas": [qa]}
    data.append({"title": _text(example["title"]), "paragraphs": [paragraph]})
  return parse_dataset(data, f"TFDS {name} ({split})", with_negative, labelled=True, train=train)


def _text(value) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def parse_dataset(data: list, source: str, with_negative: bool, labelled: bool, train: bool) -> list[SquadExample]:
  """SquadExamples of the official JSON's `data` list. Raises ValueError naming `source`, the JSON path and the
  question id of a missing key, a question without answers (in a labelled split), an `is_impossible` question in
  v1.1 or one with answers in v2.0, or a repeated id. An answer whose text is not the context's at its
  answer_start is kept in evaluation splits (their metrics compare texts); a training question whose answer does
  not match is skipped with a warning, as run_squad does."""
  examples, seen, skipped, shared_words = [], set(), 0, {}
  for a, article in enumerate(data):
    title = article.get("title", "") if isinstance(article, dict) else ""
    for p, paragraph in enumerate(_field(article, "paragraphs", list, f"{source}: data[{a}]")):
      where = f"{source}: data[{a}].paragraphs[{p}]"
      context = _field(paragraph, "context", str, where)
      words, char_to_word = split_words(context)
      # One tuple per distinct context: TFDS repeats the context with each of its questions.
      words = shared_words.setdefault(words, words)
      if not words:
        raise ValueError(f"{where}: the context has no word.")
      for q, qa in enumerate(_field(paragraph, "qas", list, where)):
        qa_where = f"{where}.qas[{q}]"
        qid = _field(qa, "id", str, qa_where)
        qa_where += f" (id {qid!r})"
        if qid in seen:
          raise ValueError(f"{qa_where}: the id is repeated.")
        seen.add(qid)
        example = _example(qa, qa_where, context, title, words, char_to_word, with_negative, labelled, train)
        if example is None:
          skipped += 1
          if skipped <= _LOGGED_SKIPS:
            logging.warning("%s: skipped for training: the answer is not the context's text at answer_start.", qa_where)
        else:
          examples.append(example)
  if skipped:
    logging.warning("%s: skipped %d training questions whose answer does not match the context.", source, skipped)
  if not examples:
    raise ValueError(f"{source}: no question.")
  return examples


def _field(container, key: str, kind: type, where: str):
  if not isinstance(container, dict) or key not in container:
    raise ValueError(f"{where}: no key {key!r}.")
  value = container[key]
  if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
    raise ValueError(f"{where}: {key!r} is {value!r}; expected {kind.__name__}.")
  return value


def _example(qa, where, context, title, words, char_to_word, with_negative, labelled, train) -> SquadExample | None:
  """One question; None for a training question whose answer does not match its context."""
  question = _field(qa, "question", str, where)
  is_impossible = _impossible(qa, where, with_negative, labelled)
  answers = _answers(qa, where, labelled)
  if labelled and is_impossible and answers:
    raise ValueError(f"{where}: is_impossible but has answers {[text for text, _ in answers]}.")
  if labelled and not is_impossible and not answers:
    raise ValueError(f"{where}: no answer" + (" and not is_impossible." if with_negative else "."))
  if train and not is_impossible and len(answers) != 1:
    raise ValueError(f"{where}: {len(answers)} answers; a training question needs exactly one (as run_squad).")
  span = next((s for s in (_word_span(context, char_to_word, *answer) for answer in answers) if s), None)
  if train and not is_impossible and span is None:
    return None
  start_word, end_word, answer_text = span if span and not is_impossible else (-1, -1, "")
  return SquadExample(
    qid=qa["id"],
    question=question,
    context=context,
    title=title,
    words=words,
    answers=answers,
    is_impossible=is_impossible,
    start_word=start_word,
    end_word=end_word,
    answer_text=answer_text,
    labelled=labelled,
  )


def _impossible(qa: dict, where: str, with_negative: bool, labelled: bool) -> bool:
  if "is_impossible" not in qa and (not with_negative or not labelled):
    return False
  is_impossible = _field(qa, "is_impossible", bool, where)
  if is_impossible and not with_negative:
    raise ValueError(f"{where}: is_impossible, a SQuAD v2.0 question; read it with squad_v2.")
  return is_impossible


def _answers(qa: dict, where: str, labelled: bool) -> tuple[tuple[str, int], ...]:
  if "answers" not in qa and not labelled:
    return ()
  answers = _field(qa, "answers", list, where)
  return tuple(
    (_field(answer, "text", str, f"{where}.answers[{i}]"), _field(answer, "answer_start", int, f"{where}.answers[{i}]"))
    for i, answer in enumerate(answers)
  )


def split_words(context: str) -> tuple[tuple[str, ...], np.ndarray]:
  """run_squad's whitespace words of `context` and [chars] int32, each character's word (a whitespace character
  gets the word before it, -1 before the first)."""
  matches = list(_WORD.finditer(context))
  starts = np.zeros(len(context), np.int32)
  starts[[match.start() for match in matches]] = 1
  return tuple(match.group() for match in matches), np.cumsum(starts, dtype=np.int32) - 1


def _word_span(context: str, char_to_word: np.ndarray, text: str, start: int) -> tuple[int, int, str] | None:
  """(first word, last word, text) of an answer that is the context's text at `start`, else None. Whitespace at
  the answer's ends is not part of the span."""
  end = start + len(text)
  if not text.strip() or start < 0 or end > len(context) or context[start:end] != text:
    return None
  first = start + len(text) - len(text.lstrip())
  last = start + len(text.rstrip()) - 1
  return int(char_to_word[first]), int(char_to_word[last]), text


def _check_labelled(examples: list[SquadExample], name: str) -> None:
  if not all(example.labelled for example in examples):
    raise ValueError(f"{name} metrics need a labelled split; these examples come from a test split.")


def official_dataset(examples: list[SquadExample]) -> list[dict]:
  """The official JSON's `data` list of `examples` (one article per question), as the evaluation scripts read it."""
  return [
    {
      "title": example.title,
      "paragraphs": [
        {
          "context": example.context,
          "qas": [
            {
              "id": example.qid,
              "question": example.question,
              "answers": [{"text": text, "answer_start": start} for text, start in example.answers],
              "is_impossible": example.is_impossible,
            }
          ],
        }
      ],
    }
    for example in examples
  ]


# ---------------------------------------------------------------------------------------------------------------
# Encoding.


def encode_examples(
  examples: list[SquadExample], tokenizer, max_seq_length: int, max_query_length: int, doc_stride: int
) -> Encoded:
  """run_squad's `convert_examples_to_features`: per example, windows [CLS] question [SEP] document pieces [SEP]
  of at most max_seq_length pieces (segments 0, then 1), each `doc_stride` pieces after the last; the question is
  cut to `max_query_length` pieces. features: input_ids, input_mask, segment_ids [rows, seq] int32, start_positions,
  end_positions [rows] int32 (the answer's first and last piece in the row; 0, the [CLS], where the window does not
  hold the whole answer, for impossible questions and where no answer matches the context). extra: `Windows`."""
  kind = "wordpiece" if tokenizer.kind == "wordpiece" else "sentencepiece"
  rows, layout, documents, word_cache, document_cache = [], [], [], {}, {}
  for index, example in enumerate(examples):
    if example.words not in document_cache:  # A paragraph's questions share its tokenized context.
      document_cache[example.words] = tokenize_document(example.words, tokenizer, word_cache)
    document = document_cache[example.words]
    documents.append(document)
    query = tokenizer.encode(example.question)[:max_query_length]
    max_tokens_for_doc = max_seq_length - len(query) - 3
    if max_tokens_for_doc < 1:
      raise ValueError(
        f"max_seq_length={max_seq_length} leaves no room for the context after {example.qid!r}'s question of "
        f"{len(query)} pieces (max_query_length={max_query_length})."
      )
    answer = _token_answer(example, document, tokenizer, kind)
    for start, length, max_context in document_windows(len(document.ids), max_tokens_for_doc, doc_stride):
      rows.append(_row(tokenizer, query, document.ids[start : start + length], start, answer, max_seq_length))
      layout.append((index, start, length, len(query) + 2, max_context))
  return Encoded(
    _features(rows, max_seq_length),
    list(examples),
    _column(layout, 0),
    _windows(layout, documents, tokenizer, kind, max_seq_length),
  )


def _features(rows: list[tuple], max_seq_length: int) -> dict[str, np.ndarray]:
  features = {
    name: np.array([row[i] for row in rows], np.int32).reshape(-1, max_seq_length)
    for i, name in enumerate(("input_ids", "input_mask", "segment_ids"))
  }
  features["start_positions"] = np.array([row[3] for row in rows], np.int32)
  features["end_positions"] = np.array([row[4] for row in rows], np.int32)
  return features


def _column(layout: list[tuple], i: int) -> np.ndarray:
  return np.array([entry[i] for entry in layout], np.int32)


def _windows(layout: list[tuple], documents: list[Document], tokenizer, kind: str, max_seq_length: int) -> Windows:
  token_is_max_context = np.zeros((len(layout), max_seq_length), bool)
  for row, (_, _, length, offset, max_context) in enumerate(layout):
    token_is_max_context[row, offset : offset + length] = max_context
  return Windows(
    documents=documents,
    doc_start=_column(layout, 1),
    doc_length=_column(layout, 2),
    doc_offset=_column(layout, 3),
    token_is_max_context=token_is_max_context,
    kind=kind,
    lower_case=bool(getattr(tokenizer, "lower_case", False)),
  )


def _row(tokenizer, query: list[int], window_ids: list[int], start: int, answer, max_seq_length: int) -> tuple:
  """(input_ids, input_mask, segment_ids, start_position, end_position) of one window whose first document piece
  is the document's `start`th; `answer`: the (first, last) document piece of the answer, or None."""
  ids = [tokenizer.cls_id, *query, tokenizer.sep_id, *window_ids, tokenizer.sep_id]
  segments = [0] * (len(query) + 2) + [1] * (len(window_ids) + 1)
  start_position = end_position = 0
  if answer is not None and start <= answer[0] and answer[1] < start + len(window_ids):
    offset = len(query) + 2
    start_position, end_position = answer[0] - start + offset, answer[1] - start + offset
  return (*pad_row(ids, segments, max_seq_length, tokenizer.pad_id), start_position, end_position)


def tokenize_document(words: tuple[str, ...], tokenizer, cache: dict | None = None) -> Document:
  """The pieces of each word on its own (`tokenizer.encode(word)`: WordPiece gives its `tokenize` pieces); `cache`
  {word: (ids, char spans)} spares re-tokenizing a word seen before."""
  cache = {} if cache is None else cache
  sentencepiece = tokenizer.kind != "wordpiece"
  ids, tok_to_orig, orig_to_tok, spans = [], [], [], []
  for w, word in enumerate(words):
    if word not in cache:
      word_ids = tokenizer.encode(word)
      cache[word] = word_ids, (_char_spans(word, word_ids, tokenizer) if sentencepiece else None)
    word_ids, word_spans = cache[word]
    orig_to_tok.append(len(ids))
    ids += word_ids
    tok_to_orig += [w] * len(word_ids)
    spans += word_spans or [(-1, -1)] * len(word_ids)
  return Document(
    ids=ids,
    pieces=[tokenizer.pieces[i] for i in ids],
    tok_to_orig=np.array(tok_to_orig, np.int32),
    orig_to_tok=np.array(orig_to_tok, np.int32),
    char_spans=np.array(spans, np.int32).reshape(-1, 2) if sentencepiece else None,
  )


def _char_spans(word: str, ids: list[int], tokenizer) -> list[tuple[int, int]] | None:
  """The [begin, end) characters of `word` each SentencePiece piece covers, or None where the pieces do not spell
  the word. A piece's text is the piece without the word-start mark; an `[UNK]` piece (a run of unknown
  characters) covers the characters up to where the next known piece's text begins."""
  texts = [None if i == tokenizer.unk_id else tokenizer.pieces[i].removeprefix(_WORD_START) for i in ids]
  spans, position = [], 0
  for k, text in enumerate(texts):
    if text is None:
      following = next((t for t in texts[k + 1 :] if t), None)
      end = len(word) if following is None else word.find(following, position + 1)
    else:
      end = position + len(text) if word.startswith(text, position) else -1
    if end < position or (text is None and end == position):
      return None
    spans.append((position, end))
    position = end
  return spans if position == len(word) else None


def _token_answer(example: SquadExample, document: Document, tokenizer, kind: str) -> tuple[int, int] | None:
  """The (first, last) document piece of the example's answer (run_squad's tok_start/end_position, improved), or
  None without one."""
  if example.start_word < 0:
    return None
  start = int(document.orig_to_tok[example.start_word])
  following = example.end_word + 1
  end = int(document.orig_to_tok[following]) - 1 if following < len(example.words) else len(document.ids) - 1
  if end < start:  # The answer's words have no piece.
    return None
  answer_pieces = [tokenizer.pieces[i] for i in tokenizer.encode(example.answer_text)]
  return improve_answer_span(document.pieces, start, end, answer_pieces, kind)


def improve_answer_span(
  doc_pieces: list[str], start: int, end: int, answer_pieces: list[str], kind: str
) -> tuple[int, int]:
  """run_squad's `_improve_answer_span`: the first (leftmost, then longest) piece span inside the answer's words
  [start, end] whose pieces read as the answer's own pieces ('(1895-1943).' -> '1895'); else [start, end].
  WordPiece spans compare as run_squad's (pieces joined by spaces); SentencePiece spans compare as text (pieces
  joined, word-start marks as spaces), so that '▁18 95' matches '18 95' inside a word, and never start or end
  with a bare word-start piece."""
  answer = _pieces_text(answer_pieces, kind)
  for new_start in range(start, end + 1):
    for new_end in range(end, new_start - 1, -1):
      span = doc_pieces[new_start : new_end + 1]
      if kind != "wordpiece" and _WORD_START in (span[0], span[-1]):
        continue
      if _pieces_text(span, kind) == answer:
        return new_start, new_end
  return start, end


def _pieces_text(pieces: list[str], kind: str) -> str:
  if kind == "wordpiece":
    return " ".join(pieces)
  return " ".join("".join(pieces).replace(_WORD_START, " ").split())


def document_windows(num_tokens: int, max_tokens_for_doc: int, doc_stride: int) -> list[tuple[int, int, np.ndarray]]:
  """run_squad's doc spans as (start, length, max_context): each window starts `doc_stride` pieces (at most its
  length) after the last, until one reaches the end; `max_context` [length] bool is `_check_is_max_context` of
  each of its pieces: this is the window where the piece has the largest min(left, right) context (+ 0.01 * the
  window's length; the first such window on ties). A document without pieces gets one empty window."""
  spans, start = [], 0
  while True:
    length = min(num_tokens - start, max_tokens_for_doc)
    spans.append((start, length))
    if start + length >= num_tokens:
      break
    start += min(length, doc_stride)
  best_score, best_span = np.full(num_tokens, -np.inf), np.full(num_tokens, -1)
  for k, (start, length) in enumerate(spans):
    position = np.arange(start, start + length)
    score = np.minimum(position - start, start + length - 1 - position) + 0.01 * length
    better = score > best_score[position]
    best_score[position[better]], best_span[position[better]] = score[better], k
  return [(start, length, best_span[start : start + length] == k) for k, (start, length) in enumerate(spans)]


# ---------------------------------------------------------------------------------------------------------------
# Decoding.


def decode(
  encoded: Encoded, logits: np.ndarray, n_best_size: int, max_answer_length: int, null_threshold: float | None
) -> SquadPredictions:
  """run_squad's `write_predictions` of `logits` [rows, seq, 2]: per question, the n-best distinct texts of the
  spans whose start and end are among a window's `n_best_size` best, inside its document, start <= end, at most
  `max_answer_length` pieces and starting where the window has the piece's max context. With `null_threshold`
  (v2.0) the null answer competes with its score (start + end logit of [CLS], the least over the question's
  windows), and the question is answered '' when null score - best span score exceeds the threshold."""
  windows = encoded.extra
  logits = np.asarray(logits, np.float64)  # run_squad's scores are Python floats.
  expected = (encoded.num_rows, windows.token_is_max_context.shape[1], 2)
  if logits.shape != expected:
    raise ValueError(f"SQuAD logits of shape {logits.shape}; the encoded split needs {expected}.")
  rows_of = [[] for _ in encoded.examples]
  for row, index in enumerate(encoded.row_example):
    rows_of[index].append(row)
  answers, best_non_null, nbest, null_odds = {}, {}, {}, {}
  with_null = null_threshold is not None
  for index, example in enumerate(encoded.examples):
    document = windows.documents[index]
    entries, null_score = _nbest(
      example, document, windows, rows_of[index], logits, n_best_size, max_answer_length, with_null
    )
    nbest[example.qid] = _nbest_json(entries)
    best = next((entry for entry in entries if entry[0]), None)
    best_non_null[example.qid] = best[0] if best else ""
    if not with_null:
      answers[example.qid] = entries[0][0]
      continue
    null_odds[example.qid] = null_score - best[1] - best[2] if best else NO_SPAN_SCORE_DIFF
    answers[example.qid] = "" if null_odds[example.qid] > null_threshold else best_non_null[example.qid]
  return SquadPredictions(answers, best_non_null, nbest, null_odds if with_null else None)


def _nbest(example, document, windows: Windows, rows: list[int], logits, n_best_size, max_answer_length, with_null):
  """([(text, start_logit, end_logit)] best first, at least one; the question's null score)."""
  prelim = []
  for row in rows:
    prelim += _row_candidates(windows, row, logits[row], n_best_size, max_answer_length)
  null_row = min(rows, key=lambda row: logits[row, 0, 0] + logits[row, 0, 1])
  null = (null_row, 0, 0, float(logits[null_row, 0, 0]), float(logits[null_row, 0, 1]))
  if with_null:
    prelim.append(null)
  prelim.sort(key=lambda p: p[3] + p[4], reverse=True)  # Stable, as run_squad's sorted().
  seen, entries = set(), []
  for row, start, end, start_logit, end_logit in prelim:
    if len(entries) >= n_best_size:
      break
    text = _span_text(example, document, windows, row, start, end) if start > 0 else ""
    if text in seen and start > 0:
      continue
    seen.add(text)
    entries.append((text, start_logit, end_logit))
  if with_null and "" not in seen:
    entries.append(("", null[3], null[4]))
  # No valid span at all (run_squad answers its nonce 'empty'): answer nothing.
  return entries or [("", 0.0, 0.0)], null[3] + null[4]


def _row_candidates(windows: Windows, row: int, logits: np.ndarray, n_best_size: int, max_answer_length: int) -> list:
  """[(row, start, end, start_logit, end_logit)] of one window's valid spans among its n-best starts and ends, in
  run_squad's order (by start rank, then end rank)."""
  offset, length = windows.doc_offset[row], windows.doc_length[row]
  starts = _best_indexes(logits[:, 0], n_best_size)[:, None]
  ends = _best_indexes(logits[:, 1], n_best_size)[None, :]
  in_document = lambda i: (i >= offset) & (i < offset + length)
  valid = in_document(starts) & in_document(ends) & windows.token_is_max_context[row][starts]
  valid &= (ends >= starts) & (ends - starts < max_answer_length)
  pairs = zip(*np.nonzero(valid), strict=True)  # Row-major: run_squad's loop order.
  return [
    (row, int(starts[s, 0]), int(ends[0, e]), float(logits[starts[s, 0], 0]), float(logits[ends[0, e], 1]))
    for s, e in pairs
  ]


def _best_indexes(scores: np.ndarray, n: int) -> np.ndarray:
  """The indexes of the `n` largest scores, largest first (the first index on ties, as run_squad's)."""
  return np.argsort(-scores, kind="stable")[:n]


def _span_text(example: SquadExample, document: Document, windows: Windows, row: int, start: int, end: int) -> str:
  """The context text of the row positions [start, end] (see the module docstring)."""
  shift = windows.doc_start[row] - windows.doc_offset[row]
  first, last = start + shift, end + shift
  if windows.kind != "wordpiece":
    return _cut_text(example.words, document, first, last)
  pieces = " ".join(document.pieces[first : last + 1])
  tok_text = " ".join(pieces.replace(" ##", "").replace("##", "").split())  # Pieces back into words.
  orig_text = " ".join(example.words[document.tok_to_orig[first] : document.tok_to_orig[last] + 1])
  return get_final_text(tok_text, orig_text, windows.lower_case)


def _cut_text(words: tuple[str, ...], document: Document, first: int, last: int) -> str:
  """The words of pieces [first, last], the first cut from its piece's first character and the last after its
  piece's last (whole words where the pieces could not be aligned), joined by spaces."""
  first_word, last_word = document.tok_to_orig[first], document.tok_to_orig[last]
  begin, stop = document.char_spans[first, 0], document.char_spans[last, 1]
  parts = list(words[first_word : last_word + 1])
  parts[-1] = parts[-1][: stop if stop >= 0 else len(parts[-1])]
  parts[0] = parts[0][max(begin, 0) :]
  # A span of bare word-start pieces covers no character: take its words.
  return " ".join(parts).strip() or " ".join(words[first_word : last_word + 1])


def get_final_text(pred_text: str, orig_text: str, lower_case: bool) -> str:
  """run_squad's `get_final_text`: the part of `orig_text` (the span's whole words) that `pred_text` (its pieces
  joined back, lower-cased and accent-stripped by an uncased WordPiece) is, by aligning `orig_text`'s
  BasicTokenizer text to it character by character once spaces are removed; `orig_text` where that fails
  (orig_text 'Steve Smith's', pred_text 'steve smith' -> 'Steve Smith')."""
  tok_text = " ".join(token for word in orig_text.split(" ") for token in _basic_tokens(word, lower_case))
  start = tok_text.find(pred_text)
  if start == -1 or not pred_text:
    return orig_text
  end = start + len(pred_text) - 1
  orig_ns_text, orig_ns_to_s = _strip_spaces(orig_text)
  tok_ns_text, tok_ns_to_s = _strip_spaces(tok_text)
  if len(orig_ns_text) != len(tok_ns_text):
    return orig_text
  tok_s_to_ns = {s: ns for ns, s in enumerate(tok_ns_to_s)}
  if start not in tok_s_to_ns or end not in tok_s_to_ns:
    return orig_text
  return orig_text[orig_ns_to_s[tok_s_to_ns[start]] : orig_ns_to_s[tok_s_to_ns[end]] + 1]


@functools.lru_cache(maxsize=1 << 16)
def _basic_tokens(word: str, lower_case: bool) -> tuple[str, ...]:
  """BasicTokenizer's tokens of one word. Text splits at spaces tokenize word by word, and a decoding aligns the
  same words over and over: memoised."""
  return tuple(wordpiece.basic_tokenize(word, lower_case))


def _strip_spaces(text: str) -> tuple[str, list[int]]:
  """`text` without its spaces, and the index in `text` of each of its characters."""
  kept = [i for i, char in enumerate(text) if char != " "]
  return "".join(text[i] for i in kept), kept


def _nbest_json(entries: list[tuple[str, float, float]]) -> list[dict]:
  """run_squad's nbest_predictions.json entries: text, probability (softmax over the n-best scores), logits."""
  scores = np.array([start + end for _, start, end in entries])
  probabilities = np.exp(scores - scores.max())
  probabilities /= probabilities.sum()
  return [
    {"text": text, "probability": float(p), "start_logit": float(start), "end_logit": float(end)}
    for (text, start, end), p in zip(entries, probabilities, strict=True)
  ]
