"""The shard workers of corpus preparation: one work unit's documents tokenized into a training shard and an
evaluation shard (the documents whose place, `document_place`, is below `data.eval_fraction`), with their
statistics; the hold-out minimum (`data.eval_min_documents`) across shards, by place then position; the check,
before any shard is written, that the training split will hold enough distinct documents; the unigram baseline
the evaluation split is scored against.

A worker tokenizes about a megabyte of sentences per call (`Tokenizer.encode_documents`: WordPiece compiled, through
TensorFlow Text; a byte-level BPE as each document's running text), so memory stays bounded whatever the file size.
A shard is written to a temporary name and renamed when whole, with its statistics and input (the file's content
hash and the tokenizer's among them) beside it, so a re-run skips finished shards. Each record is a
`tf.train.Example` with `token_ids` (the document's tokens, flattened) and `sentence_lengths` (tokens per
sentence), serialized deterministically: a shard's bytes depend only on its input.
"""

import dataclasses
import hashlib
import heapq
import json
import os
from collections.abc import Iterator

import numpy as np
from absl import logging
from etils import epath

from bert_jax import paths
from bert_jax.data import records, text
from bert_jax.data.manifest import MIN_DOCUMENTS, file_integrity
from bert_jax.data.tokenizer import load_tokenizer
from bert_jax.tensorflow_cpu import tf

# Text tokenized per tokenizer call: large enough to amortise the call, small enough to bound a worker's memory.
TOKENIZER_BATCH_BYTES = 1 << 20
# Tokens a split keeps before it counts them for the unigram baseline (one bincount for many documents).
_COUNT_EVERY_TOKENS = 1 << 18


@dataclasses.dataclass
class ShardStats:
  """A work unit's counts: what its shards hold, the empty documents dropped, and the text read (`text.TextCounts`)."""

  documents: int = 0
  sentences: int = 0
  tokens: int = 0
  empty_documents: int = 0
  replaced_bytes: int = 0
  text_bytes: int = 0


def _example(token_ids: np.ndarray, sentence_lengths: np.ndarray) -> bytes:
  feature = {
    "token_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=token_ids.tolist())),
    "sentence_lengths": tf.train.Feature(int64_list=tf.train.Int64List(value=sentence_lengths.tolist())),
  }
  # Deterministic: map fields in a fixed order, so a shard's bytes depend only on its input.
  return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString(deterministic=True)


_tokenizer = None  # This worker process's, set by `init_worker`.
_concurrent = False  # Whether another process may write the same shard at the same time (`init_worker`).


def init_worker(tokenizer_args: dict, pooled: bool = False, concurrent: bool = False) -> None:
  """Loads the tokenizer `write_shard` uses in this process (a pool's initializer, or called once in-process).
  `concurrent`: another worker may write the same shard at the same time (a Beam runner's retried or duplicated
  work): each then writes under temporary names of its own (`paths.staged_file`)."""
  global _tokenizer, _concurrent
  _concurrent = concurrent
  if pooled:  # One worker per core: TensorFlow's ops in each run on one thread, and so does `tokenizers` (BPE).
    try:
      tf.config.threading.set_intra_op_parallelism_threads(1)
      tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:  # TensorFlow already runs in this process (a runner that runs workers in-process): kept.
      pass
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
  _tokenizer = load_tokenizer(**tokenizer_args)


def _unit_input(unit: dict) -> dict:
  """What a shard was made from (recorded beside it): a re-run keeps the shard only if this is unchanged."""
  return json.loads(json.dumps({k: v for k, v in unit.items() if k not in ("output", "file")}, default=str))


def tokenized_documents(unit: dict, stats: ShardStats, tokenizer) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """One work unit's documents, each as (token ids [tokens], sentence lengths [sentences]), tokenized about
  `TOKENIZER_BATCH_BYTES` of text per call; sentences without tokens are left out, and a document without any is
  counted in `stats.empty_documents` instead."""
  for documents in text.groups(records.unit_documents(unit, stats), TOKENIZER_BATCH_BYTES):  # One tokenizer call each.
    ids, lengths = tokenizer.encode_documents(documents)
    sentence_ends = np.cumsum([len(document) for document in documents])
    token_ends = np.concatenate([[0], np.cumsum(lengths)])
    for end, count in zip(sentence_ends, map(len, documents), strict=True):
      document_lengths = lengths[end - count : end]
      if not document_lengths.any():
        stats.empty_documents += 1
        continue
      yield ids[token_ends[end - count] : token_ends[end]], document_lengths[document_lengths > 0]


def document_place(token_ids: np.ndarray) -> float:
  """A document's place in [0, 1), from its tokens alone: the evaluation split holds the documents whose place is
  below a threshold (`data.eval_fraction`), wherever and however the corpus is cut into units."""
  digest = hashlib.sha256(np.asarray(token_ids, "<i8").tobytes()).digest()
  return int.from_bytes(digest[:8], "little") / 2**64


class _Split:
  """One shard being written: its writer and counts; the training shard also keeps the lowest (place, index) pairs
  of its documents (the candidates for the evaluation split's minimum; `index`: the document's in the shard, which
  tells copies of one text apart)."""

  def __init__(self, writer, vocab_size: int, candidates: int = 0):
    self.writer, self.documents, self.sentences, self.tokens = writer, 0, 0, 0
    self.token_counts = np.zeros(vocab_size, np.int64)  # For the unigram baseline.
    self._uncounted, self._uncounted_tokens = [], 0  # Documents written since the last `count` (counted in batches).
    self._candidates, self._lowest = candidates, []  # A max-heap (negated) of the lowest (place, index) pairs.

  def write(self, token_ids: np.ndarray, sentence_lengths: np.ndarray, place: float) -> None:
    self.writer.write(_example(token_ids, sentence_lengths))
    index, self.documents = self.documents, self.documents + 1
    self.sentences += len(sentence_lengths)
    self.tokens += len(token_ids)
    self._uncounted.append(token_ids)
    self._uncounted_tokens += len(token_ids)
    if self._uncounted_tokens >= _COUNT_EVERY_TOKENS:
      self.count()
    if self._candidates:
      heapq.heappush(self._lowest, (-place, -index))
      if len(self._lowest) > self._candidates:
        heapq.heappop(self._lowest)

  def count(self) -> None:
    if self._uncounted:
      self.token_counts += np.bincount(np.concatenate(self._uncounted), minlength=len(self.token_counts))
      self._uncounted, self._uncounted_tokens = [], 0

  def counts(self) -> dict:
    self.count()
    return dict(
      documents=self.documents,
      sentences=self.sentences,
      tokens=self.tokens,
      token_counts=self.token_counts.tolist(),
    )

  def lowest(self) -> list[list]:
    return sorted([-place, -index] for place, index in self._lowest)


def eval_file(file: str) -> str:
  """The evaluation shard beside training shard `file` (a path or a name relative to the prepared directory)."""
  directory, name = os.path.split(file)
  return os.path.join(directory, "eval-" + name)


def read_stats(unit: dict) -> dict | None:
  """The statistics `write_shard` recorded beside `unit`'s shard, if its shards are whole: written from the same
  input (file and its content, unit, sizes, fraction and tokenizer; or TFDS slice) and still of the sizes recorded.
  None otherwise."""
  final, stats_path, eval_final = unit["output"], unit["output"] + ".stats.json", eval_file(unit["output"])
  if not all(epath.Path(path).exists() for path in (final, stats_path, eval_final)):
    return None
  stats = json.loads(epath.Path(stats_path).read_text())
  if not all(isinstance(lowest, list) for lowest in stats.get("lowest_places", [])):
    return None  # Written before copies of one text were told apart by position: written again.
  sizes = [
    (epath.Path(path).stat().length, part.get("bytes")) for path, part in ((final, stats), (eval_final, stats["eval"]))
  ]
  if stats.get("input") == _unit_input(unit) and all(found == recorded for found, recorded in sizes):
    return stats
  return None


def write_shard(unit: dict) -> dict:
  """Tokenizes one work unit into its training shard and its evaluation shard (the documents whose place is below
  `eval_fraction`); returns their statistics. Skips shards already whole (`read_stats`)."""
  written = read_stats(unit)
  if written is not None:
    return written | {"skipped": True}
  final, stats_path, eval_final = unit["output"], unit["output"] + ".stats.json", eval_file(unit["output"])
  stats = ShardStats()
  with (
    paths.staged_file(final, _concurrent) as temporary,
    tf.io.TFRecordWriter(temporary) as writer,
    paths.staged_file(eval_final, _concurrent) as eval_temporary,
    tf.io.TFRecordWriter(eval_temporary) as eval_writer,
  ):
    vocab_size = _tokenizer.vocab_size
    train, held_out = _Split(writer, vocab_size, unit["eval_min_documents"]), _Split(eval_writer, vocab_size)
    for token_ids, sentence_lengths in tokenized_documents(unit, stats, _tokenizer):
      place = document_place(token_ids)
      (held_out if place < unit["eval_fraction"] else train).write(token_ids, sentence_lengths, place)
  result = dataclasses.asdict(stats) | train.counts() | {"file": unit["file"], "input": _unit_input(unit)}
  result |= file_integrity(final) | {"lowest_places": train.lowest()}
  result["eval"] = held_out.counts() | {"file": eval_file(unit["file"])} | file_integrity(eval_final)
  paths.write_text(stats_path, json.dumps(result), _concurrent)  # Last: the shards are whole (`read_stats`).
  return result


def _move_to_eval(result: dict, output_dir: str, indices: set[int]) -> None:
  """Moves the documents of a written training shard at `indices` (their places in it) to its evaluation shard (both
  rewritten whole, each through a temporary name); updates `result` and its statistics file."""
  train_path, eval_path = (os.path.join(output_dir, part["file"]) for part in (result, result["eval"]))
  kept, moved = [], []
  for index, record in enumerate(tf.data.TFRecordDataset(train_path).as_numpy_iterator()):
    features = tf.train.Example.FromString(record).features.feature
    token_ids = np.array(features["token_ids"].int64_list.value, np.int64)
    lengths = np.array(features["sentence_lengths"].int64_list.value, np.int64)
    (moved if index in indices else kept).append((token_ids, lengths))
  held = [
    (np.array(f["token_ids"].int64_list.value, np.int64), np.array(f["sentence_lengths"].int64_list.value, np.int64))
    for f in (
      tf.train.Example.FromString(r).features.feature for r in tf.data.TFRecordDataset(eval_path).as_numpy_iterator()
    )
  ]
  for path, part, documents in ((train_path, result, kept), (eval_path, result["eval"], held + moved)):
    with paths.staged_file(path) as temporary, tf.io.TFRecordWriter(temporary) as writer:
      for token_ids, lengths in documents:
        writer.write(_example(token_ids, lengths))
    part.update(
      documents=len(documents),
      sentences=sum(len(lengths) for _, lengths in documents),
      tokens=sum(len(token_ids) for token_ids, _ in documents),
      token_counts=np.bincount(
        np.concatenate([token_ids for token_ids, _ in documents] or [np.zeros(0, np.int64)]),
        minlength=len(part["token_counts"]),
      ).tolist(),
    )
    part.update(file_integrity(path))
  result["lowest_places"] = [  # The documents left, at their new indices.
    [place, index - sum(gone < index for gone in indices)]
    for place, index in result["lowest_places"]
    if index not in indices
  ]
  stats = {key: value for key, value in result.items() if key != "skipped"}
  paths.write_text(os.path.join(output_dir, result["file"] + ".stats.json"), json.dumps(stats))


def unigram_baseline(train_counts: np.ndarray, eval_counts: np.ndarray) -> dict:
  """What predicting the training documents' token frequencies (add-one smoothed) at every masked position scores
  on the held-out documents: the MLM loss (cross-entropy, nats) and accuracy (always the most frequent token) a
  model must beat to have learned more than frequencies. Masked positions are a uniform sample of the tokens."""
  probabilities = (train_counts + 1) / (train_counts.sum() + len(train_counts))
  share = eval_counts / max(eval_counts.sum(), 1)
  return dict(mlm_loss=float(-(share * np.log(probabilities)).sum()), mlm_accuracy=float(share[train_counts.argmax()]))


def held_out(documents: int, below_fraction: int, minimum: int) -> int:
  """The documents of a corpus of `documents` that its evaluation split holds: those whose place is below
  `data.eval_fraction` (`below_fraction`), and at least `minimum` (`data.eval_min_documents`), but never more than
  a tenth of the corpus for that minimum."""
  return max(below_fraction, min(minimum, documents // 10))


def hold_out_minimum(results: list[dict], output_dir: str, minimum: int) -> None:
  """The evaluation split holds `held_out` documents: when the places below the fraction gave fewer, exactly as many
  training documents as are missing join it, the lowest by place, then by position (shard, then index in it): copies
  of one text share a place, and by place alone they all went (60 copies: every document held out)."""
  held = sum(r["eval"]["documents"] for r in results)
  total = held + sum(r["documents"] for r in results)
  need = held_out(total, held, minimum) - held
  if need <= 0:
    return
  candidates = sorted((place, shard, index) for shard, r in enumerate(results) for place, index in r["lowest_places"])
  logging.info("Holding out %d more document(s) for evaluation (data.eval_min_documents=%d).", need, minimum)
  for shard, result in enumerate(results):
    indices = {index for _, of, index in candidates[:need] if of == shard}
    if indices:
      _move_to_eval(result, output_dir, indices)


def check_enough_documents(units: list[dict], tokenizer, source: str) -> None:
  """Refuses, before any shard is written, input whose training split would hold fewer than `MIN_DOCUMENTS`
  distinct documents (copies of one text count once: a random next sentence from a copy is no other document),
  naming `source` and the counts found. Reads the units' documents in order (in this process) until it is sure:
  `MIN_DOCUMENTS` + `data.eval_min_documents` distinct texts whose place keeps them in training (the hold-out minimum
  moves at most that minimum of documents), or the end of the input, which a corpus this small reaches at once."""
  stats, documents, sentences, tokens, below = ShardStats(), 0, 0, 0, 0
  copies: dict[float, int] = {}  # Place -> documents of that text outside the evaluation split's places.
  fraction, minimum = units[0]["eval_fraction"], units[0]["eval_min_documents"]
  for unit in units:
    for token_ids, sentence_lengths in tokenized_documents(unit, stats, tokenizer):
      documents, sentences, tokens = documents + 1, sentences + len(sentence_lengths), tokens + len(token_ids)
      place = document_place(token_ids)
      below += place < fraction
      if place >= fraction:
        copies[place] = copies.get(place, 0) + 1
      if len(copies) >= MIN_DOCUMENTS + minimum:
        return
  evaluation = held_out(documents, below, minimum)
  distinct, moved = 0, evaluation - below  # The minimum takes the lowest places first.
  for place in sorted(copies):
    taken = min(moved, copies[place])
    moved, distinct = moved - taken, distinct + (copies[place] > taken)
  if distinct < MIN_DOCUMENTS:
    raise ValueError(
      f"{source} holds too little text to pretrain on: {documents} document(s), {sentences} sentence(s), {tokens} "
      f"token(s) ({stats.empty_documents} empty document(s) dropped), {evaluation} of the documents held out for "
      f"evaluation (data.eval_fraction={fraction}, data.eval_min_documents={minimum}), {documents - evaluation} left "
      f"for training, {distinct} of them distinct; the training split needs at least {MIN_DOCUMENTS} documents, "
      "distinct (a random next sentence comes from another document). Nothing was written."
    )
