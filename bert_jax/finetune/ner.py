"""CoNLL-2003 named-entity recognition as a token-head task: its column files, first-piece word labels, sentences
split into whole-word windows, conlleval's entity-level metrics and conlleval's prediction format.

Splits: `train.txt` (train), `valid.txt` (dev), `test.txt` (test). CoNLL-2003's test set is labelled, so it is an
eval split rather than a test split: `eval_splits = ("dev", "test")`, dev first, so that dev alone picks the best
checkpoint and the test metrics are only reported.
"""

import dataclasses
import re

import numpy as np
from etils import epath

from bert_jax import paths
from bert_jax.finetune import metrics as metrics_lib
from bert_jax.finetune.contract import Encoded, Task, pad_row

# CoNLL-2003's tags in a fixed order (the ids the token head predicts).
CONLL2003_LABELS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
SCHEMES = ("BIO", "IOB1", "word")
SPLIT_FILES = {"train": "train.txt", "dev": "valid.txt", "test": "test.txt"}
_DOCSTART = "-DOCSTART-"
_BLANK = " \t\r\n"
_TAG = re.compile(r"O|[BI]-.+")
_COLUMNS = re.compile(r"[ \t]+")  # Not str.split(): a word may hold a no-break space.


@dataclasses.dataclass(frozen=True)
class Sentence:
  """One sentence: its words and their tags, and the file line of its first word."""

  words: tuple[str, ...]
  tags: tuple[str, ...]
  line: int


class Conll2003(Task):
  """CoNLL-2003 NER (or any column file of one word per line with its tag in column `tag_column`, default the last).

  `labels`: the tag set in id order. `scheme`: how tags mark entities, for conlleval: "BIO" (IOB2, B- begins
  every entity; the usual redistribution) or "IOB1" (B- only between two adjacent entities of the same type; the
  original CoNLL-2003 files); both use the same tag strings. Or "word": each word's tag stands alone (part of
  speech: CoNLL-2003's second column, `tag_column=1`), any strings; each word is then scored as an entity of its
  tag's type, so that conlleval's precision, recall and F1 all equal the word accuracy, and its per-type scores are
  per tag.
  """

  name = "conll2003"
  head = "token"
  main_metric = "f1"
  eval_splits = ("dev", "test")
  test_splits = ()

  def __init__(
    self, data_dir: str, labels: tuple[str, ...] = CONLL2003_LABELS, scheme: str = "BIO", tag_column: int = -1
  ):
    if scheme not in SCHEMES:
      raise ValueError(f"Unknown tagging scheme {scheme!r}; expected one of {SCHEMES}.")
    if len(set(labels)) != len(labels) or not labels:
      raise ValueError(f"The tag set must be non-empty and without repeats; got {labels}.")
    malformed = [label for label in labels if not _TAG.fullmatch(label)] if scheme != "word" else []
    if malformed:
      raise ValueError(f"Tags {malformed} are not O, B-<type> or I-<type> (what conlleval reads).")
    self.data_dir = data_dir
    self.labels = tuple(labels)
    self.scheme = scheme
    self.tag_column = tag_column
    self._label_ids = {label: i for i, label in enumerate(self.labels)}

  def split_path(self, split: str) -> epath.Path:
    if split not in SPLIT_FILES:
      raise ValueError(f"Unknown split {split!r} for {self.name}; expected one of {list(SPLIT_FILES)}.")
    return epath.Path(self.data_dir) / SPLIT_FILES[split]

  def read(self, split: str) -> list[Sentence]:
    path = self.split_path(split)
    if not path.exists():
      raise FileNotFoundError(f"No {split} file {path} for {self.name}.")
    return read_sentences(path, self.labels, self.tag_column)

  def encode(self, examples: list[Sentence], tokenizer, max_seq_length: int) -> Encoded:
    """Rows [CLS] word pieces [SEP]; a word's tag id sits on its first piece (`labels`, `label_weights` 1 there).

    A sentence of more than max_seq_length - 2 pieces is split into several rows, each a window of whole words
    with its own [CLS] and [SEP] and no overlap, so that every word gets exactly one prediction (words next to a
    split see context on one side only). A single word longer than a row keeps its first pieces; its prediction
    is on the first one anyway. `extra`: [rows, seq] int32, the sentence's word index at each first piece, -1
    elsewhere.
    """
    if max_seq_length < 3:
      raise ValueError(f"max_seq_length={max_seq_length} leaves no room for a word between [CLS] and [SEP].")
    rows, row_example = [], []
    for index, sentence in enumerate(examples):
      pieces = [word_pieces(tokenizer, word)[: max_seq_length - 2] for word in sentence.words]
      tag_ids = [self._label_ids[tag] for tag in sentence.tags]
      for start, stop in word_windows([len(p) for p in pieces], max_seq_length - 2):
        rows.append(_token_row(tokenizer, pieces, tag_ids, start, stop, max_seq_length))
        row_example.append(index)
    empty = np.zeros((0, max_seq_length), np.int32)
    stacked = (np.stack(column) for column in zip(*rows, strict=True)) if rows else (empty,) * 5
    input_ids, input_mask, segment_ids, labels, word_index = stacked
    features = {
      "input_ids": input_ids,
      "input_mask": input_mask,
      "segment_ids": segment_ids,
      "labels": labels,
      "label_weights": (word_index >= 0).astype(np.float32),
    }
    return Encoded(features, list(examples), np.array(row_example, np.int32), extra=word_index)

  def predicted_tags(self, encoded: Encoded, logits: np.ndarray) -> list[list[str]]:
    """Per sentence, the tag of each word: the argmax of `logits` [rows, seq, num_labels] at its first piece."""
    word_index = encoded.extra
    logits = np.asarray(logits)
    if logits.shape != (*word_index.shape, len(self.labels)):
      raise ValueError(
        f"Logits of shape {logits.shape} for {word_index.shape[0]} rows of {word_index.shape[1]} tokens "
        f"and {len(self.labels)} tags."
      )
    tags = [[""] * len(sentence.words) for sentence in encoded.examples]
    rows, positions = np.nonzero(word_index >= 0)
    predictions = logits[rows, positions].argmax(-1)
    for example, word, prediction in zip(
      encoded.row_example[rows], word_index[rows, positions], predictions, strict=True
    ):
      tags[example][word] = self.labels[prediction]
    return tags

  def metrics(self, encoded: Encoded, logits: np.ndarray) -> dict[str, float]:
    """conlleval's entity-level precision, recall, f1 (overall and per entity type, e.g. `f1_PER`) and its
    word-level accuracy."""
    true_tags = [list(sentence.tags) for sentence in encoded.examples]
    predicted = self.predicted_tags(encoded, logits)
    if self.scheme == "word":  # Every word an entity of its own.
      true_tags, predicted = ([[f"B-{tag}" for tag in s] for s in tags] for tags in (true_tags, predicted))
    result = metrics_lib.conlleval(true_tags, predicted, scheme="BIO" if self.scheme == "word" else self.scheme)
    scores = {key: float(result[key]) for key in ("precision", "recall", "f1", "accuracy")}
    for entity_type, type_scores in result["per_type"].items():
      scores.update({f"{key}_{entity_type}": float(type_scores[key]) for key in ("precision", "recall", "f1")})
    return scores

  def write_predictions(self, encoded: Encoded, logits: np.ndarray, path: str) -> None:
    """conlleval's input: `word gold predicted` per line, a blank line after each sentence."""
    sentences = [
      "".join(f"{word} {gold} {predicted}\n" for word, gold, predicted in zip(s.words, s.tags, tags, strict=True))
      for s, tags in zip(encoded.examples, self.predicted_tags(encoded, logits), strict=True)
    ]
    paths.write_text(path, "".join(f"{sentence}\n" for sentence in sentences))


def read_sentences(path, labels: tuple[str, ...], tag_column: int = -1) -> list[Sentence]:
  """The sentences of a CoNLL column file: one `word ... tag` per line (the tag in column `tag_column`, from 0;
  default the last), blank lines between sentences, `-DOCSTART-` lines skipped. Raises ValueError naming the file
  and line that is wrong."""
  allowed = set(labels)
  sentences, words, tags, first_line = [], [], [], 0
  lines = epath.Path(path).read_text().splitlines()
  for number, line in enumerate(lines, start=1):
    stripped = line.strip(_BLANK)
    columns = _COLUMNS.split(stripped) if stripped else []
    if not columns or columns[0] == _DOCSTART:
      if words:
        sentences.append(Sentence(tuple(words), tuple(tags), first_line))
      words, tags = [], []
      continue
    if len(columns) < 2:
      raise ValueError(f"{path}:{number}: a single column {line!r}; expected `word ... tag` (the tag last).")
    if not -len(columns) <= tag_column < len(columns) or tag_column % len(columns) == 0:
      raise ValueError(f"{path}:{number}: no tag column {tag_column} in {line!r} ({len(columns)} columns, word first).")
    tag = columns[tag_column]
    if tag not in allowed:
      raise ValueError(f"{path}:{number}: unknown tag {tag!r}; the tag set is {sorted(allowed)}.")
    first_line = first_line if words else number
    words.append(columns[0])
    tags.append(tag)
  if words:
    sentences.append(Sentence(tuple(words), tuple(tags), first_line))
  if not sentences:
    raise ValueError(f"{path}:{max(len(lines), 1)}: the file ends without a sentence (is it empty?).")
  return sentences


def word_pieces(tokenizer, word: str) -> list[int]:
  """The word's token ids; [UNK] for a word the tokenizer drops (e.g. a control character), so it keeps a tag."""
  return tokenizer.encode(word) or [tokenizer.unk_id]


def word_windows(lengths: list[int], budget: int) -> list[tuple[int, int]]:
  """Consecutive [start, stop) word ranges, each of at most `budget` pieces (a longer word alone), covering all
  words; greedy, so every window but the last is as full as whole words allow."""
  windows, start, used = [], 0, 0
  for index, length in enumerate(lengths):
    if used + length > budget and index > start:
      windows.append((start, index))
      start, used = index, 0
    used += length
  windows.append((start, len(lengths)))
  return windows


def _token_row(tokenizer, pieces, tag_ids, start: int, stop: int, max_seq_length: int) -> tuple[np.ndarray, ...]:
  """(input_ids, input_mask, segment_ids, labels, word_index) [max_seq_length] of words [start, stop)."""
  ids, labels, word_index = [tokenizer.cls_id], [0], [-1]
  for word in range(start, stop):
    continuation = len(pieces[word]) - 1
    ids += pieces[word]
    labels += [tag_ids[word]] + [0] * continuation
    word_index += [word] + [-1] * continuation
  ids, labels, word_index = [*ids, tokenizer.sep_id], [*labels, 0], [*word_index, -1]
  padding = max_seq_length - len(ids)
  input_ids, input_mask, segment_ids = pad_row(ids, [0] * len(ids), max_seq_length, tokenizer.pad_id)
  labels = np.array(labels + [0] * padding, np.int32)
  word_index = np.array(word_index + [-1] * padding, np.int32)
  return input_ids, input_mask, segment_ids, labels, word_index
