"""The contract between a fine-tuning task and the job that trains it.

A task reads its split files (local or gs://, through `etils.epath`), checks them (a bad file names the file and
line), encodes examples with any bert_jax tokenizer into fixed-shape numpy rows, and turns the model's logits for
those rows back into the official metrics and prediction files. The job (`bert_jax/finetune/job.py`) never looks
inside an example: it batches `Encoded.features`, runs the head named by `Task.head`, and hands the logits back.

Logits per head, for all rows of a split in row order (what `metrics` and `write_predictions` receive):
  classification  [rows, num_labels]       float32
  regression      [rows]                   float32
  span            [rows, seq, 2]           float32 (start, end logits per token)
  token           [rows, seq, num_labels]  float32
  choice          [rows, num_choices]      float32
  embedding       [rows, hidden]           float32 (sentence embeddings: the embeddings task, `embeddings.py`)

A task whose training differs from a head's loss on rows of `Encoded.features` (the embeddings task: pairs,
contrastive) says so through the hooks `model`, `loss`, `train_batch_shapes`, `sequences_per_row`, `batches` and
`record`; every other task keeps their defaults.
"""

import abc
import dataclasses
import hashlib
import json
import os
from typing import Any

import numpy as np
from etils import epath

from bert_jax import paths
from bert_jax.finetune import losses
from bert_jax.model.bert_config import BertConfig
from bert_jax.model.heads import HEADS, TaskHead, num_outputs, task_model  # noqa: F401 (HEADS: the heads a task may name)
from bert_jax.train.step import Loss


@dataclasses.dataclass(frozen=True)
class Encoded:
  """A split encoded for the model.

  `features`: numpy arrays with a leading row axis; always `input_ids`, `input_mask`, `segment_ids` (int32,
  [rows, seq], or [rows, num_choices, seq] for the choice head), plus the labels the head's loss reads:
    classification `label` [rows] int32; regression `label` [rows] float32;
    span `start_positions`, `end_positions` [rows] int32 (0, the [CLS] token, where the answer is not in the window);
    token `labels` [rows, seq] int32 and `label_weights` [rows, seq] float32 (1 on the first piece of each word);
    choice `label` [rows] int32.
  Unlabelled splits (test sets) carry zeros there.
  `examples`: the split's examples in file order (what predictions are written for).
  `row_example`: [rows] int32, the example each row came from (several rows per SQuAD question).
  `extra`: whatever else the task's decoding needs (e.g. SQuAD windows' token-to-word maps).
  """

  features: dict[str, np.ndarray]
  examples: list
  row_example: np.ndarray
  extra: Any = None

  @property
  def num_rows(self) -> int:
    return len(self.row_example)


class Task(abc.ABC):
  """One fine-tuning task. Subclasses set the class attributes and implement the four methods."""

  name: str  # e.g. "mrpc", "squad_v2", "conll2003", "swag"
  head: str  # one of HEADS
  labels: tuple[str, ...] = ()  # class / tag names in id order (empty for regression and span)
  num_choices: int = 0  # choice head only
  main_metric: str  # the metric that picks the best checkpoint (larger is better), a key of `metrics`
  train_split: str = "train"
  eval_splits: tuple[str, ...] = ("dev",)  # evaluated every epoch; the first one's main metric picks the best
  test_splits: tuple[str, ...] = ()  # unlabelled; predicted at the end of training
  data_dir: str | None = None  # the directory of its split files (`split_path`); None or "" when it reads TFDS

  @property
  def num_labels(self) -> int:
    return num_outputs(self.head, self.labels)

  @property
  def task_head(self) -> TaskHead:
    return TaskHead(self.name, self.head, tuple(self.labels))

  @abc.abstractmethod
  def read(self, split: str) -> list:
    """The split's examples. Raises FileNotFoundError / ValueError naming the file (and line) that is wrong."""

  @abc.abstractmethod
  def encode(self, examples: list, tokenizer, max_seq_length: int) -> Encoded:
    """Examples -> fixed-shape rows (see Encoded). `tokenizer` is a bert_jax.data.tokenizer.Tokenizer."""

  @abc.abstractmethod
  def metrics(self, encoded: Encoded, logits: np.ndarray) -> dict[str, float]:
    """The task's official metrics of a labelled split, as fractions in [0, 1] (correlations in [-1, 1])."""

  @abc.abstractmethod
  def write_predictions(self, encoded: Encoded, logits: np.ndarray, path: str) -> None:
    """The prediction file the task's official evaluation or leaderboard reads (written atomically)."""

  def model(self, config: BertConfig):
    """The model trained on the encoder `config`: the encoder and the task's head."""
    return task_model(config, self.head, self.num_labels)

  def loss(self) -> Loss:
    """What a training step minimises: the head's loss."""
    return losses.make_loss(self.head)

  def train_batch_shapes(self, batch_size: int, seq: int) -> dict:
    """Feature name -> (shape, dtype) of a training batch (what `encode` gives of the train split, and `weight`)."""
    return losses.batch_shapes(self.head, batch_size, seq, self.num_choices)

  @property
  def sequences_per_row(self) -> int:
    """The encoder's sequences in one training row (the FLOPs' count): a choice head's choices, else 1."""
    return max(self.num_choices, 1)

  def batches(self, train: Encoded, batch_size: int):
    """The task's own training stream: an object whose `step(step, seed)` is (rows [batch_size], weight
    [batch_size]) of step `step` (from 1) in the stream of `seed`; None: the job's (`rows.training_rows`)."""
    del train, batch_size
    return None

  def record(self) -> dict:
    """What a fine-tuned checkpoint records of its task (every checkpoint's history; `TaskHead.from_json` reads
    it)."""
    return self.task_head.to_json()

  def prediction_file(self, split: str) -> str:
    """The name of `split`'s prediction file in a run's `predictions/`, with its official format's extension."""
    suffix = {"span": "json", "token": "txt", "choice": "csv"}.get(self.head, "tsv")
    return f"{split}.{suffix}"

  def split_path(self, split: str) -> epath.Path | None:
    """The file `split` is read from, under `data_dir`."""
    raise NotImplementedError(f"{self.name} reads no files.")

  def tfds_dataset(self) -> tuple[str, str | None] | None:
    """(name, data_dir) of the TFDS dataset the task reads instead of files; None when it reads files."""
    return None

  def content(self) -> dict:
    """What the task reads, by content (a resume compares it): {file name under `data_dir`: `paths.fingerprint`} of
    every split file it finds, or a TFDS dataset's own record of itself (`tfds_content`)."""
    dataset = self.tfds_dataset()
    if dataset is not None:
      return tfds_content(*dataset)
    found = {}
    for split in (self.train_split, *self.eval_splits, *self.test_splits):
      path = self.split_path(split)
      if path is not None and path.exists():
        found[os.path.relpath(os.fspath(path), os.fspath(self.data_dir))] = paths.fingerprint(path)
    return found

  def calibrate(self, encoded: Encoded, logits: np.ndarray) -> dict[str, float]:
    """Adopts the settings that the labelled split `encoded` and its `logits` choose for the prediction files
    (SQuAD v2.0: the null-score threshold); returns them. Most tasks choose nothing."""
    del encoded, logits
    return {}


def tfds_content(name: str, data_dir: str | None) -> dict:
  """A prepared TFDS dataset by what TFDS records of it (its `dataset_info.json`, no data read): its full name
  (dataset/config/version), and one SHA-256 over the checksums of the files it was built from and each split's
  shard lengths and bytes."""
  import tensorflow_datasets as tfds

  info = tfds.builder(name, data_dir=data_dir).info
  proto = info.as_proto
  recorded = dict(
    sources={url: source.checksum for url, source in proto.download_checksums.items()},
    splits={split.name: [list(split.shard_lengths), split.num_bytes] for split in proto.splits},
  )
  digest = hashlib.sha256(json.dumps(recorded, sort_keys=True).encode()).hexdigest()
  return {"tfds": info.full_name, "sha256": digest}


def truncate_pair(a: list[int], b: list[int], max_tokens: int) -> tuple[list[int], list[int]]:
  """Google BERT's `_truncate_seq_pair`: drop the last token of the longer sequence until both fit."""
  a, b = list(a), list(b)
  while len(a) + len(b) > max_tokens:
    (a if len(a) > len(b) else b).pop()
  return a, b


def encode_pair(tokenizer, a: list[int], b: list[int] | None, max_seq_length: int) -> tuple[np.ndarray, ...]:
  """The tokenizer's row of `a` (and `b`) as (input_ids, input_mask, segment_ids), each [max_seq_length] int32,
  padded: BERT's [CLS] a [SEP] b [SEP], RoBERTa's <s> a </s></s> b </s> (`Tokenizer.pair_row`); `a` and `b` are
  token ids, truncated as Google BERT does."""
  if b is None:
    a, b = list(a)[: max_seq_length - 2], []
  else:
    a, b = truncate_pair(a, b, max_seq_length - tokenizer.pair_special_tokens)
  ids, segments = tokenizer.pair_row(a, b)
  return pad_row(ids, segments, max_seq_length, tokenizer.pad_id)


def pad_row(ids: list[int], segments: list[int], max_seq_length: int, pad_id: int) -> tuple[np.ndarray, ...]:
  """(input_ids, input_mask, segment_ids) [max_seq_length] int32 of a row of at most max_seq_length tokens."""
  if len(ids) > max_seq_length:
    raise ValueError(f"A row of {len(ids)} tokens does not fit max_seq_length={max_seq_length}.")
  padding = max_seq_length - len(ids)
  input_ids = np.array(ids + [pad_id] * padding, np.int32)
  input_mask = np.array([1] * len(ids) + [0] * padding, np.int32)
  segment_ids = np.array(segments + [0] * padding, np.int32)
  return input_ids, input_mask, segment_ids
