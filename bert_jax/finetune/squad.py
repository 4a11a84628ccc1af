"""SQuAD v1.1 and v2.0 as span-head tasks, following Google BERT's `run_squad.py`: the official JSON files (or
TFDS `squad`) read into questions, the official metrics and the official prediction files. The document-stride
windows `[CLS] question [SEP] document piece [SEP]` are `squad_windows`'s; the n-best span decoding back to the
context's text is `squad_decode`'s.

Splits: `train-v1.1.json` (train), `dev-v1.1.json` (dev), and `<split>-v1.1.json` for any test split named to the
task (the same layout, answers optional); `-v2.0` for v2.0. Without a data directory the task reads TFDS
`squad/v1.1` or `squad/v2.0` (train, and validation as dev).

The context is split on whitespace into words as run_squad does (`split_words`); an answer is the words its
characters fall in.
"""

import dataclasses
import json
import re

import numpy as np
from absl import logging
from etils import epath

from bert_jax import paths
from bert_jax.finetune import metrics as metrics_lib
from bert_jax.finetune.contract import Encoded, Task
from bert_jax.finetune.squad_decode import SquadPredictions, decode
from bert_jax.finetune.squad_windows import encode_examples

_WORD = re.compile("[^ \t\r\n\u202f]+")  # Between run_squad's whitespace characters (`is_whitespace`).
_TFDS_SPLITS = {"train": "train", "dev": "validation"}
_LOGGED_SKIPS = 5  # Skipped training questions logged one by one; the rest only counted.


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

  def tfds_dataset(self) -> tuple[str, str | None] | None:
    return (self.tfds_name, self.tfds_data_dir) if self.data_dir is None else None

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
    """Windows of every example (see `squad_windows.encode_examples`)."""
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
