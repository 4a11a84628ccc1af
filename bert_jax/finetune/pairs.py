"""The embeddings task's training pairs: reading them (a pairs file, or a BEIR-layout set's queries and qrels) and
the training stream's batches with no text twice in a batch.

A pairs file has a pair (or a triplet, or an n-tuple) per row, with sentence-transformers' column names:
  `anchor` (the query), `positive` (its document), and optional hard negatives in columns whose names start with
  `negative` (`negative`, `negative_1`, ...), in the file's column order.
  .tsv: tab-separated, a header row first, no quoting (a quote is text);  .csv: comma-separated, a header row first,
  quoted as `csv` writes it;  .jsonl: one JSON object per line with those keys, each a string.
Blank lines are skipped. Refused, naming the file and line: an empty file, a missing `anchor` or `positive` column,
fewer negative columns than asked for, a row with another number of fields than the header, an empty text.

A BEIR-layout set (`retrieval/beir.py`) gives a pair (query text, document text) for every qrel of relevance > 0,
in the qrels file's order; it has no hard negatives.

Batches (`NoDuplicateBatches`): a duplicate text in a batch is a false negative (a positive scored as another
query's negative), so the stream forms batches as sentence-transformers' NoDuplicatesBatchSampler does: the rows in
the order of one random permutation per epoch (from (seed, epoch), as `rows.training_rows`' stream), each batch
taking the first remaining rows none of whose texts (anchor, positive, negatives) it already holds; a deferred row
waits for a later batch of the same epoch. A batch that the epoch's last rows cannot fill is padded with weight-0
rows. Step s (from 1) reads batch s - 1 of the concatenation of the epochs' batches: a function of (seed, step), so
a resume or another host count reads the same rows.
"""

import csv
import dataclasses
import functools

import numpy as np
from etils import epath

from bert_jax import paths
from bert_jax.finetune.glue_files import open_text

PAIRS_FILES = ("train.jsonl", "train.tsv", "train.csv")  # The training pairs file of a data_dir, any one of them.
ANCHOR, POSITIVE, NEGATIVE = "anchor", "positive", "negative"


@dataclasses.dataclass(frozen=True)
class Pair:
  """A query, its positive document and hard negatives (the first `hard_negatives` of the row's), and where it was
  read (`file:line`, or `file: query q, document d`)."""

  anchor: str
  positive: str
  negatives: tuple[str, ...]
  where: str


def read_pairs(path, hard_negatives: int) -> list[Pair]:
  """The pairs of a .tsv, .csv or .jsonl file (see the module docstring), each with its first `hard_negatives`
  negatives. Raises ValueError naming the file and line of what is wrong, FileNotFoundError for no file."""
  path = epath.Path(path)
  if not path.exists():
    raise FileNotFoundError(f"No pairs file {path}.")
  suffix = path.suffix.lower()
  if suffix == ".jsonl":
    rows = ((f"{path}:{number}", fields) for number, fields in paths.json_objects(path))
  elif suffix in (".tsv", ".csv"):
    rows = _table_rows(path, suffix)
  else:
    raise ValueError(f"{path}: a pairs file is .tsv, .csv or .jsonl, not {suffix or 'no suffix'!r}.")
  pairs = []
  for where, fields in rows:
    negatives = [key for key in fields if key.startswith(NEGATIVE)]
    for key in (ANCHOR, POSITIVE):
      if key not in fields:
        raise ValueError(
          f"{where}: no {key!r} column (has {list(fields)}); expected {ANCHOR}, {POSITIVE}, {NEGATIVE}*."
        )
    if len(negatives) < hard_negatives:
      raise ValueError(
        f"{where}: {len(negatives)} negative column(s) {negatives}; contrastive.hard_negatives={hard_negatives} asks "
        f"for that many columns named {NEGATIVE}*."
      )
    kept = [ANCHOR, POSITIVE, *negatives[:hard_negatives]]
    for key in kept:
      if not isinstance(fields[key], str):
        raise ValueError(f"{where}: {key!r} is {fields[key]!r}; expected a string.")
      if not fields[key].strip():
        raise ValueError(f"{where}: empty {key!r}.")
    pairs.append(Pair(fields[ANCHOR], fields[POSITIVE], tuple(fields[key] for key in kept[2:]), where))
  if not pairs:
    raise ValueError(f"{path}: no pairs (an empty file); expected a row per pair.")
  return pairs


def _table_rows(path: epath.Path, suffix: str):
  dialect = dict(delimiter="\t", quoting=csv.QUOTE_NONE) if suffix == ".tsv" else dict(delimiter=",")
  with open_text(path) as text:
    reader = csv.reader(text, **dialect)
    header = None
    for row in reader:
      if not any(field.strip() for field in row):
        continue
      if header is None:
        header = [name.strip() for name in row]
        for key in (ANCHOR, POSITIVE):
          if key not in header:
            raise ValueError(
              f"{path}:{reader.line_num}: no {key!r} column in the header {header}; expected {ANCHOR}, {POSITIVE} "
              f"and optional {NEGATIVE}* columns."
            )
        continue
      if len(row) != len(header):
        raise ValueError(f"{path}:{reader.line_num}: {len(row)} fields; the header has {len(header)} ({header}).")
      yield f"{path}:{reader.line_num}", dict(zip(header, row, strict=True))


def beir_pairs(beir_set) -> list[Pair]:
  """(query text, document text) for every qrel of relevance > 0 of `beir_set` (a `retrieval.beir.BeirSet`)."""
  where = f"{beir_set.directory} (qrels/{beir_set.split}.tsv)"
  pairs = [
    Pair(beir_set.queries[query], beir_set.document_text(doc), (), f"{where}: query {query}, document {doc}")
    for query, judged in beir_set.qrels.items()
    for doc, relevance in judged.items()
    if relevance > 0
  ]
  for pair in pairs:
    if not pair.anchor.strip() or not pair.positive.strip():
      raise ValueError(f"{pair.where}: an empty {'query' if not pair.anchor.strip() else 'document'}.")
  if not pairs:
    raise ValueError(f"{where}: no qrel of relevance > 0, so no training pairs.")
  return pairs


def pairs_file(data_dir) -> epath.Path | None:
  """The pairs file of `data_dir` (one of PAIRS_FILES), or None; refuses two."""
  found = [epath.Path(data_dir) / name for name in PAIRS_FILES if (epath.Path(data_dir) / name).exists()]
  if len(found) > 1:
    raise ValueError(f"{data_dir}: {[p.name for p in found]}; expected one training pairs file of {PAIRS_FILES}.")
  return found[0] if found else None


def text_ids(pairs: list[Pair]) -> np.ndarray:
  """[rows, 2 + negatives] int32: each pair's texts as the ids of distinct texts (what the batches compare)."""
  ids: dict[str, int] = {}
  return np.array(
    [[ids.setdefault(text, len(ids)) for text in (p.anchor, p.positive, *p.negatives)] for p in pairs], np.int32
  )


class NoDuplicateBatches:
  """The training stream of `texts` (`text_ids`) in batches of `batch_size` rows with no text twice in a batch (see
  the module docstring)."""

  def __init__(self, texts: np.ndarray, batch_size: int):
    self.texts, self.batch_size = texts, batch_size
    self._epoch = functools.lru_cache(maxsize=16)(self._batches)
    self._counts: dict[int, list[int]] = {}  # seed -> batches in each epoch so far

  def _batches(self, seed: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows [batches, batch_size] int64, weight [batches, batch_size] float32) of epoch `epoch`."""
    order = np.random.default_rng([seed, epoch]).permutation(len(self.texts))
    texts = [set(row) for row in self.texts[order].tolist()]
    # The rows not yet batched, as a linked list over positions in `order` (sentence-transformers' way): a batch
    # scans from the first, skipping rows with a text it holds, so each batch costs its rows and those it defers.
    following = list(range(1, len(order) + 1))
    following[-1] = -1
    head, batches = 0, []
    while head != -1:
      held, batch, position, previous = set(), [], head, -1
      while position != -1 and len(batch) < self.batch_size:
        after = following[position]
        if held.isdisjoint(texts[position]):
          batch.append(int(order[position]))
          held |= texts[position]
          if previous == -1:
            head = after
          else:
            following[previous] = after
        else:
          previous = position
        position = after
      batches.append(batch)
    rows = np.array([batch + [batch[0]] * (self.batch_size - len(batch)) for batch in batches], np.int64)
    weight = np.array([[1.0] * len(batch) + [0.0] * (self.batch_size - len(batch)) for batch in batches], np.float32)
    return rows, weight

  def epoch(self, seed: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    return self._epoch(seed, epoch)

  def step(self, step: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows [batch_size], weight [batch_size]) that step `step` (from 1) trains on in the stream of `seed`."""
    counts = self._counts.setdefault(seed, [])
    index, epoch = step - 1, 0
    while True:
      if epoch == len(counts):
        counts.append(len(self.epoch(seed, epoch)[0]))
      if index < counts[epoch]:
        rows, weight = self.epoch(seed, epoch)
        return rows[index], weight[index]
      index, epoch = index - counts[epoch], epoch + 1
