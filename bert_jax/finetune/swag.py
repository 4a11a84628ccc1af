"""SWAG multiple choice as a choice-head task: the official CSV files of rowanz/swagaf `data/`, four [CLS] context
[SEP] ending [SEP] rows per example, accuracy, and the leaderboard's prediction CSV.

Splits: `train.csv` (train), `val.csv` (dev), `test.csv` (test, unlabelled). Their header:
`,video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label` (the first column,
unnamed, is the example's index; test.csv has no `label`). Columns are found by name.
"""

import csv
import dataclasses
import io

import numpy as np
from etils import epath

from bert_jax import paths
from bert_jax.finetune import metrics as metrics_lib
from bert_jax.finetune.contract import Encoded, Task, encode_pair

NUM_CHOICES = 4
SPLIT_FILES = {"train": "train.csv", "dev": "val.csv", "test": "test.csv"}
ENDINGS = tuple(f"ending{i}" for i in range(NUM_CHOICES))
_TEXT_COLUMNS = ("sent1", "sent2", *ENDINGS)
_ID_COLUMN = ""  # The unnamed index column pandas wrote.


@dataclasses.dataclass(frozen=True)
class SwagExample:
  """One question: the context `sent1`, the start of the next sentence `sent2`, four endings, the gold ending's
  index (None in test.csv), the file's id of the example and its line."""

  id: str
  sent1: str
  sent2: str
  endings: tuple[str, ...]
  label: int | None
  line: int


class Swag(Task):
  """SWAG: which of four endings follows the context. As in the BERT paper and Hugging Face's run_swag.py, choice
  i is the pair (sent1, sent2 + " " + ending_i)."""

  name = "swag"
  head = "choice"
  num_choices = NUM_CHOICES
  main_metric = "accuracy"
  eval_splits = ("dev",)
  test_splits = ("test",)

  def __init__(self, data_dir: str):
    self.data_dir = data_dir

  def split_path(self, split: str) -> epath.Path:
    if split not in SPLIT_FILES:
      raise ValueError(f"Unknown split {split!r} for {self.name}; expected one of {list(SPLIT_FILES)}.")
    return epath.Path(self.data_dir) / SPLIT_FILES[split]

  def read(self, split: str) -> list[SwagExample]:
    path = self.split_path(split)
    if not path.exists():
      raise FileNotFoundError(f"No {split} file {path} for {self.name}.")
    return read_examples(path, labelled=split not in self.test_splits)

  def encode(self, examples: list[SwagExample], tokenizer, max_seq_length: int) -> Encoded:
    """input_ids, input_mask, segment_ids [rows, 4, seq] int32 (pairs truncated as Google BERT does), label
    [rows] int32 (0 where unlabelled); one row per example."""
    shape = (len(examples), NUM_CHOICES, max_seq_length)
    input_ids, input_mask, segment_ids = (np.zeros(shape, np.int32) for _ in range(3))
    for i, example in enumerate(examples):
      input_ids[i], input_mask[i], segment_ids[i] = _choice_rows(tokenizer, example, max_seq_length)
    features = {
      "input_ids": input_ids,
      "input_mask": input_mask,
      "segment_ids": segment_ids,
      "label": np.array([0 if example.label is None else example.label for example in examples], np.int32),
    }
    return Encoded(features, list(examples), np.arange(len(examples), dtype=np.int32))

  def metrics(self, encoded: Encoded, logits: np.ndarray) -> dict[str, float]:
    """Accuracy of the argmax of `logits` [rows, 4]."""
    if any(example.label is None for example in encoded.examples):
      raise ValueError("SWAG metrics need a labelled split; these examples have no label (test.csv?).")
    labels = np.array([example.label for example in encoded.examples], np.int32)
    return {"accuracy": metrics_lib.accuracy(labels, _predictions(logits, len(labels)))}

  def write_predictions(self, encoded: Encoded, logits: np.ndarray, path: str) -> None:
    """A CSV as rowanz/swagaf's `csv_predict.py` writes for the leaderboard (pandas `to_csv(columns=["pred"])`):
    header `,pred`, then per example its index (the data file's unnamed first column) and the predicted ending."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(["", "pred"])
    predictions = _predictions(logits, len(encoded.examples))
    writer.writerows([example.id, int(p)] for example, p in zip(encoded.examples, predictions, strict=True))
    paths.write_text(path, text.getvalue())


def read_examples(path, labelled: bool) -> list[SwagExample]:
  """The examples of a SWAG CSV file (`label` required when `labelled`, else read if present). Raises ValueError
  naming the file and line that is wrong. Examples without the unnamed index column get their position as id."""
  reader = csv.reader(io.StringIO(epath.Path(path).read_text(), newline=""))
  header = next(reader, None)
  if not header:
    raise ValueError(f"{path}:1: empty file; expected a header with {list(_TEXT_COLUMNS)}.")
  required = _TEXT_COLUMNS + (("label",) if labelled else ())
  missing = [name for name in required if name not in header]
  if missing:
    raise ValueError(f"{path}:1: no column {missing} in the header {header}.")
  column = {name: header.index(name) for name in (*_TEXT_COLUMNS, "label", _ID_COLUMN) if name in header}
  examples, line = [], reader.line_num + 1
  for row in reader:
    if row:  # Blank lines are skipped.
      if len(row) != len(header):
        raise ValueError(f"{path}:{line}: {len(row)} fields; the header has {len(header)}.")
      examples.append(_example(path, line, row, column, default_id=str(len(examples))))
    line = reader.line_num + 1  # A quoted field may span lines: a row's number is that of its first line.
  if not examples:
    raise ValueError(f"{path}:{reader.line_num}: no example after the header.")
  return examples


def _example(path, line: int, row: list[str], column: dict[str, int], default_id: str) -> SwagExample:
  label = None
  if "label" in column:
    value = row[column["label"]].strip()
    if value not in {str(i) for i in range(NUM_CHOICES)}:
      raise ValueError(f"{path}:{line}: label {value!r} is not one of 0..{NUM_CHOICES - 1}.")
    label = int(value)
  return SwagExample(
    id=row[column[_ID_COLUMN]] if _ID_COLUMN in column else default_id,
    sent1=row[column["sent1"]],
    sent2=row[column["sent2"]],
    endings=tuple(row[column[name]] for name in ENDINGS),
    label=label,
    line=line,
  )


def _choice_rows(tokenizer, example: SwagExample, max_seq_length: int) -> tuple[np.ndarray, ...]:
  """(input_ids, input_mask, segment_ids) [4, seq] of one example: [CLS] sent1 [SEP] sent2 ending_i [SEP]."""
  context = tokenizer.encode(example.sent1)
  choices = [
    encode_pair(tokenizer, context, tokenizer.encode(f"{example.sent2} {e}".strip()), max_seq_length)
    for e in example.endings
  ]
  return tuple(np.stack(arrays) for arrays in zip(*choices, strict=True))


def _predictions(logits: np.ndarray, rows: int) -> np.ndarray:
  """[rows] int: the argmax over choices of `logits` [rows, 4]."""
  logits = np.asarray(logits)
  if logits.shape != (rows, NUM_CHOICES):
    raise ValueError(f"Logits of shape {logits.shape} for {rows} rows of {NUM_CHOICES} choices.")
  return logits.argmax(-1)
