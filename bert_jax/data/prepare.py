"""Corpus preparation, offline and once: raw text -> sharded TFRecords of tokenized documents + a manifest.

Inputs are text files by glob (local or `gs://`), either in BERT's format (one sentence per line, a blank line
between documents) or one document per file (paragraphs split on blank lines, sentences by punctuation), or a
TFDS text dataset (name, split, feature; one example per document). Work is split by bytes: each file is cut into
units of `data.prepare_unit_bytes`, each unit starting at a blank line its worker finds near its offset
(`unit_start`), so one large file is prepared by every core; each unit (or each of `num_shards` slices of a TFDS
split) becomes one shard. A worker streams its unit line by line and tokenizes about a megabyte of sentences per
call (`Tokenizer.encode_batch`: WordPiece compiled, through TensorFlow Text): memory stays bounded whatever the
file size, because no document outgrows `data.max_document_bytes` (a longer one is cut at a line, a long book in
the document format at a paragraph) and no line may exceed half a unit. The output depends only on the input and
those two sizes. A shard is written to a temporary name and renamed when whole, with its statistics and input
beside it, so a re-run skips finished shards.

Each record is a `tf.train.Example` with `token_ids` (the document's tokens, flattened) and
`sentence_lengths` (tokens per sentence). Undecodable bytes are replaced and counted; empty documents are
dropped and counted; the counts are in `manifest.json` with the tokenizer's identity.
"""

import dataclasses
import hashlib
import heapq
import io
import json
import multiprocessing
import os
import re
import struct
import time
from collections.abc import Iterator

import ml_collections
import numpy as np
import tensorflow as tf
from absl import logging
from etils import epath

from bert_jax import paths
from bert_jax.data.tokenizer import load_tokenizer

MANIFEST = "manifest.json"
SHARD_KEYS = ("file", "documents", "sentences", "tokens", "bytes", "records", "sha256")
INPUT_FORMATS = ("bert", "document")
# Sentence ends: ., ! or ? (with closing quotes/brackets), then whitespace and an upper-case letter, digit or quote.
# Text tokenized per tokenizer call: large enough to amortise the call, small enough to bound a worker's memory.
TOKENIZER_BATCH_BYTES = 1 << 20
_LOG_EVERY_SECONDS = 10.0
# Text per worker process when the count is not given (each imports TensorFlow: seconds before its first shard).
WORKER_BYTES = 32 << 20
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"'”’)\]]*\s+(?=[\"'“‘(\[]?[A-Z0-9])")


@dataclasses.dataclass
class ShardStats:
  documents: int = 0
  sentences: int = 0
  tokens: int = 0
  empty_documents: int = 0
  replaced_bytes: int = 0
  text_bytes: int = 0


def split_sentences(paragraph: str) -> list[str]:
  """A paragraph -> sentences, by end punctuation followed by a capital, digit or quote (a heuristic)."""
  return [s.strip() for s in _SENTENCE_END.split(" ".join(paragraph.split())) if s.strip()]


def _decode(line: bytes, stats: ShardStats) -> str:
  stats.text_bytes += len(line)
  try:
    return line.decode("utf-8")
  except UnicodeDecodeError:
    text = line.decode("utf-8", errors="replace")
    stats.replaced_bytes += text.count("\ufffd") - line.count("\ufffd".encode())
    return text


def _read_line(f, path: str, position: int, limit: int) -> bytes:
  line = f.readline(limit + 1)
  if len(line) > limit:
    raise ValueError(
      f"{path} has a line of more than {limit} bytes (read from byte {position}): not text with lines. A line may "
      f"have at most half of data.prepare_unit_bytes={2 * limit} bytes."
    )
  return line


def _is_blank(line: bytes) -> bool:
  return not line.decode("utf-8", errors="replace").strip()


def unit_start(f, path: str, size: int, offset: int, unit_bytes: int, max_document_bytes: int) -> int:
  """Where the work unit that begins near byte `offset` of a file begins: at the first line starting at or after
  `offset` that is blank (a document or paragraph boundary), or, with none in the next min(max_document_bytes,
  unit_bytes / 2) bytes, at the first line starting after that. A function of the file alone: each worker finds
  its unit's start and end (the next unit's start) itself, so units tile the file with nothing read twice. A line
  has at most unit_bytes / 2 bytes, so a unit ends before the next one's offset plus that."""
  if offset <= 0 or offset >= size:
    return min(max(offset, 0), size)
  limit, window = unit_bytes // 2, min(max_document_bytes, unit_bytes // 2)
  f.seek(offset - 1)
  position = offset
  if f.read(1) != b"\n":  # Inside a line that started before `offset`: it belongs to the unit before.
    position += len(_read_line(f, path, position, limit))
  while position < size:
    line = _read_line(f, path, position, limit)
    if _is_blank(line) or position >= offset + window:
      return position
    position += len(line)
  return size


def _unit_lines(unit: dict, stats: ShardStats) -> Iterator[str]:
  """The lines of a file's work unit (bytes [start, end), found by `unit_start`), read as a stream."""
  path, unit_bytes, limit = unit["path"], unit["unit_bytes"], unit["unit_bytes"] // 2
  # A buffered reader: line reads with a size limit, on local and gs:// files alike.
  with epath.Path(path).open("rb") as raw, io.BufferedReader(raw, 1 << 20) as f:
    size = f.seek(0, os.SEEK_END)
    start, end = (
      unit_start(f, path, size, index * unit_bytes, unit_bytes, unit["max_document_bytes"])
      for index in (unit["index"], unit["index"] + 1)
    )
    f.seek(start)
    position = start
    while position < end:
      line = _read_line(f, path, position, limit)
      position += len(line)
      yield _decode(line, stats).rstrip("\r\n")


def _blocks(lines: Iterator[str], max_bytes: int) -> Iterator[list[str]]:
  """Runs of non-blank lines (stripped), ended by blank lines (a run of them is one boundary) or after `max_bytes`."""
  block, size = [], 0
  for line in lines:
    if line.strip():
      block.append(line.strip())
      size += len(line)
      if size >= max_bytes:
        yield block
        block, size = [], 0
    elif block:
      yield block
      block, size = [], 0
  if block:
    yield block


def bert_format_documents(lines: Iterator[str], max_bytes: int) -> Iterator[list[str]]:
  """One sentence per line, blank lines between documents; a document is cut after `max_bytes`."""
  yield from _blocks(lines, max_bytes)


def paragraph_documents(lines: Iterator[str], max_bytes: int) -> Iterator[list[str]]:
  """Text in paragraphs (blank lines between them) -> sentences; consecutive paragraphs make one document, cut at
  the first paragraph end after `max_bytes` (a file smaller than that is one document)."""
  for paragraphs in _groups(_blocks(lines, max_bytes), max_bytes):
    yield [sentence for paragraph in paragraphs for sentence in split_sentences(" ".join(paragraph))]


def text_documents(texts: Iterator[str]) -> Iterator[list[str]]:
  """Each text (held in memory: a TFDS example) is one document: paragraphs on blank lines, then sentences."""
  for text in texts:
    paragraphs = re.split(r"\n\s*\n", text)
    yield [sentence for paragraph in paragraphs for sentence in split_sentences(paragraph)]


def _documents(unit: dict, stats: ShardStats) -> Iterator[list[str]]:
  if unit["source"] == "files" and unit["input_format"] == "bert":
    yield from bert_format_documents(_unit_lines(unit, stats), unit["max_document_bytes"])
  elif unit["source"] == "files":
    documents = paragraph_documents(_unit_lines(unit, stats), unit["max_document_bytes"])
    first = next(documents, None)
    if first is None and unit["units_of_file"] == 1:
      yield []  # A file without text is an empty document (counted, not written).
    elif first is not None:
      yield first
      yield from documents
  else:
    import tensorflow_datasets as tfds

    # Built once, by `prepare`, before any worker started: a worker only reads.
    dataset = tfds.load(unit["name"], split=unit["split"], data_dir=unit["data_dir"] or None, download=False)

    def texts():
      for example in tfds.as_numpy(dataset):
        yield _decode(example[unit["feature"]], stats)

    yield from text_documents(texts())


def _groups(items: Iterator[list[str]], max_bytes: int) -> Iterator[list[list[str]]]:
  """Consecutive items (lists of strings) in groups, each ended once its text reaches `max_bytes`."""
  group, size = [], 0
  for item in items:
    group.append(item)
    size += sum(map(len, item))
    if size >= max_bytes:
      yield group
      group, size = [], 0
  if group:
    yield group


def _example(token_ids: np.ndarray, sentence_lengths: np.ndarray) -> bytes:
  feature = {
    "token_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=token_ids.tolist())),
    "sentence_lengths": tf.train.Feature(int64_list=tf.train.Int64List(value=sentence_lengths.tolist())),
  }
  # Deterministic: map fields in a fixed order, so a shard's bytes depend only on its input.
  return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString(deterministic=True)


_tokenizer = None


def _init_worker(tokenizer_args: dict, pooled: bool = False) -> None:
  global _tokenizer
  if pooled:  # One worker per core: TensorFlow's ops in each run on one thread.
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
  _tokenizer = load_tokenizer(**tokenizer_args)


def _file_integrity(path: str) -> dict:
  """What the manifest records to check a shard by: its size in bytes, records and SHA-256."""
  digest, size = hashlib.sha256(), 0
  with epath.Path(path).open("rb") as f:
    while chunk := f.read(1 << 22):
      digest.update(chunk)
      size += len(chunk)
  return dict(bytes=size, records=count_records(path), sha256=digest.hexdigest())


def count_records(path: str) -> int:
  """The records of a TFRecord file, from its framing alone (each record: 8-byte length, 4-byte CRC, data, 4-byte
  CRC): one small read per record. A file that ends inside a record raises ValueError naming it."""
  count, offset = 0, 0
  with epath.Path(path).open("rb") as f:
    size = f.seek(0, os.SEEK_END)
    while offset < size:
      f.seek(offset)
      header = f.read(8)
      offset += 16 + (struct.unpack("<Q", header)[0] if len(header) == 8 else size)
      if offset > size:
        raise ValueError(f"{path} ends inside record {count} (at byte {size}): the shard is truncated.")
      count += 1
  return count


def _unit_input(unit: dict) -> dict:
  """What a shard was made from (recorded beside it): a re-run keeps the shard only if this is unchanged."""
  return json.loads(json.dumps({key: value for key, value in unit.items() if key != "output"}, default=str))


def document_place(token_ids: np.ndarray) -> float:
  """A document's place in [0, 1), from its tokens alone: the evaluation split holds the documents whose place is
  below a threshold (`data.eval_fraction`), wherever and however the corpus is cut into units."""
  digest = hashlib.sha256(np.asarray(token_ids, "<i8").tobytes()).digest()
  return int.from_bytes(digest[:8], "little") / 2**64


class _Split:
  """One shard being written: its writer and counts; the training shard also keeps the lowest places of its
  documents (the candidates for the evaluation split's minimum)."""

  def __init__(self, writer, vocab_size: int, candidates: int = 0):
    self.writer, self.documents, self.sentences, self.tokens = writer, 0, 0, 0
    self.token_counts = np.zeros(vocab_size, np.int64)  # For the unigram baseline.
    self._uncounted = []  # Documents written since the last `count` (counted a batch at a time).
    self._candidates, self._lowest = candidates, []  # A max-heap (negated) of the lowest places.

  def write(self, token_ids: np.ndarray, sentence_lengths: np.ndarray, place: float) -> None:
    self.writer.write(_example(token_ids, sentence_lengths))
    self.documents += 1
    self.sentences += len(sentence_lengths)
    self.tokens += len(token_ids)
    self._uncounted.append(token_ids)
    if self._candidates:
      heapq.heappush(self._lowest, -place)
      if len(self._lowest) > self._candidates:
        heapq.heappop(self._lowest)

  def count(self) -> None:
    if self._uncounted:
      self.token_counts += np.bincount(np.concatenate(self._uncounted), minlength=len(self.token_counts))
      self._uncounted = []

  def counts(self) -> dict:
    self.count()
    return dict(
      documents=self.documents,
      sentences=self.sentences,
      tokens=self.tokens,
      token_counts=self.token_counts.tolist(),
    )

  def lowest(self) -> list[float]:
    return sorted(-place for place in self._lowest)


def _eval_output(unit: dict) -> str:
  directory, name = os.path.split(unit["output"])
  return os.path.join(directory, "eval-" + name)


def _write_shard(unit: dict) -> dict:
  """Tokenizes one work unit into its training shard and its evaluation shard (the documents whose place is below
  `eval_fraction`); returns their statistics. Skips shards already written from the same input (file, unit, sizes
  and fraction; or TFDS slice)."""
  final, stats_path, eval_final = unit["output"], unit["output"] + ".stats.json", _eval_output(unit)
  if all(epath.Path(path).exists() for path in (final, stats_path, eval_final)):
    stats = json.loads(epath.Path(stats_path).read_text())
    if stats.get("input") == _unit_input(unit):
      return stats | {"skipped": True}
  stats = ShardStats()
  with (
    paths.staged_file(final) as temporary,
    tf.io.TFRecordWriter(temporary) as writer,
    paths.staged_file(eval_final) as eval_temporary,
    tf.io.TFRecordWriter(eval_temporary) as eval_writer,
  ):
    vocab_size = _tokenizer.vocab_size
    train, held_out = _Split(writer, vocab_size, unit["eval_min_documents"]), _Split(eval_writer, vocab_size)
    for documents in _groups(_documents(unit, stats), TOKENIZER_BATCH_BYTES):  # One tokenizer call each.
      ids, lengths = _tokenizer.encode_batch([sentence for document in documents for sentence in document])
      sentence_ends = np.cumsum([len(document) for document in documents])
      token_ends = np.concatenate([[0], np.cumsum(lengths)])
      for end, count in zip(sentence_ends, map(len, documents), strict=True):
        document_lengths = lengths[end - count : end]
        if not document_lengths.any():
          stats.empty_documents += 1
          continue
        token_ids = ids[token_ends[end - count] : token_ends[end]]
        place = document_place(token_ids)
        split = held_out if place < unit["eval_fraction"] else train
        split.write(token_ids, document_lengths[document_lengths > 0], place)
      train.count()
      held_out.count()
  result = dataclasses.asdict(stats) | train.counts() | {"file": os.path.basename(final), "input": _unit_input(unit)}
  result |= _file_integrity(final) | {"lowest_places": train.lowest()}
  result["eval"] = held_out.counts() | {"file": os.path.basename(eval_final)} | _file_integrity(eval_final)
  paths.write_text(stats_path, json.dumps(result))
  return result


def _move_to_eval(result: dict, output_dir: str, threshold: float) -> None:
  """Moves the documents of a written training shard whose place is at most `threshold` to its evaluation shard
  (both rewritten whole, each through a temporary name); updates `result` and its statistics file."""
  train_path, eval_path = (os.path.join(output_dir, part["file"]) for part in (result, result["eval"]))
  kept, moved = [], []
  for record in tf.data.TFRecordDataset(train_path).as_numpy_iterator():
    features = tf.train.Example.FromString(record).features.feature
    token_ids = np.array(features["token_ids"].int64_list.value, np.int64)
    lengths = np.array(features["sentence_lengths"].int64_list.value, np.int64)
    (moved if document_place(token_ids) <= threshold else kept).append((token_ids, lengths))
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
    part.update(_file_integrity(path))
  result["lowest_places"] = [place for place in result["lowest_places"] if place > threshold]
  stats = {key: value for key, value in result.items() if key != "skipped"}
  paths.write_text(os.path.join(output_dir, result["file"] + ".stats.json"), json.dumps(stats))


def unigram_baseline(train_counts: np.ndarray, eval_counts: np.ndarray) -> dict:
  """What predicting the training documents' token frequencies (add-one smoothed) at every masked position scores
  on the held-out documents: the MLM loss (cross-entropy, nats) and accuracy (always the most frequent token) a
  model must beat to have learned more than frequencies. Masked positions are a uniform sample of the tokens."""
  probabilities = (train_counts + 1) / (train_counts.sum() + len(train_counts))
  share = eval_counts / max(eval_counts.sum(), 1)
  return dict(mlm_loss=float(-(share * np.log(probabilities)).sum()), mlm_accuracy=float(share[train_counts.argmax()]))


def _hold_out_minimum(results: list[dict], output_dir: str, minimum: int) -> None:
  """The evaluation split holds at least `minimum` documents but never more than a tenth of the corpus: when the
  places below the fraction gave fewer, the training documents with the lowest places join it."""
  held = sum(r["eval"]["documents"] for r in results)
  total = held + sum(r["documents"] for r in results)
  need = min(minimum, total // 10) - held
  if need <= 0:
    return
  threshold = sorted(place for r in results for place in r["lowest_places"])[need - 1]
  logging.info("Holding out %d more document(s) for evaluation (data.eval_min_documents=%d).", need, minimum)
  for result in results:
    if result["lowest_places"] and result["lowest_places"][0] <= threshold:
      _move_to_eval(result, output_dir, threshold)


def prepare_tfds(name: str, data_dir: str) -> None:
  """Downloads and builds a TFDS dataset once, in this process, before the workers read their slices of it (each
  would otherwise download and build it at the same time). Nothing is done when `data_dir` already holds it: a
  directory on gs:// built elsewhere is read where it is."""
  import tensorflow_datasets as tfds

  builder = tfds.builder(name, data_dir=data_dir or None)
  logging.info("TFDS %s in %s: downloading and building it if needed (once).", name, builder.data_dir)
  builder.download_and_prepare()


def work_units(data_config, output_dir: str) -> list[dict]:
  """The shards to write: each input file cut into units of `data.prepare_unit_bytes` (at document or paragraph
  boundaries, found by each unit's worker), or `num_shards` even slices of a TFDS split."""
  if data_config.tfds_name:
    import tensorflow_datasets as tfds

    splits = tfds.even_splits(data_config.tfds_split, n=data_config.num_shards)
    units = [
      dict(
        source="tfds",
        name=data_config.tfds_name,
        split=s,
        feature=data_config.tfds_feature,
        data_dir=data_config.tfds_data_dir,
      )
      for s in splits
    ]
  else:
    if data_config.input_format not in INPUT_FORMATS:
      raise ValueError(f"data.input_format={data_config.input_format!r}; expected one of {INPUT_FORMATS}.")
    inputs = paths.glob(data_config.input_pattern) if data_config.input_pattern else []
    if not inputs:
      raise ValueError(f"data.input_pattern={data_config.input_pattern!r} matches no file.")
    unit_bytes = data_config.prepare_unit_bytes
    units = []
    for path in inputs:
      size = epath.Path(path).stat().length
      count = max(1, -(-size // unit_bytes))
      units += [
        dict(
          source="files",
          path=path,
          file_bytes=size,
          input_format=data_config.input_format,
          index=index,
          units_of_file=count,
          unit_bytes=unit_bytes,
          max_document_bytes=data_config.max_document_bytes,
        )
        for index in range(count)
      ]
  for index, unit in enumerate(units):
    unit.update(eval_fraction=data_config.eval_fraction, eval_min_documents=data_config.eval_min_documents)
    unit["output"] = os.path.join(output_dir, f"documents-{index:05d}-of-{len(units):05d}.tfrecord")
  return units


def prepare(data_config, tokenizer_args: dict, output_dir: str, num_workers: int | None = None) -> dict:
  """Writes every shard (in parallel over processes) and then the manifest; returns the manifest."""
  tokenizer = load_tokenizer(**tokenizer_args)
  units = work_units(data_config, output_dir)
  epath.Path(output_dir).mkdir(parents=True, exist_ok=True)
  if data_config.tfds_name:
    prepare_tfds(data_config.tfds_name, data_config.tfds_data_dir)
  if not num_workers:  # A core each, but no more than one per WORKER_BYTES of text: a worker takes seconds to start.
    text_bytes = sum(unit["file_bytes"] for unit in units if unit.get("index") == 0)  # 0 for TFDS.
    num_workers = min(os.cpu_count() or 1, max(1, round(text_bytes / WORKER_BYTES)) if text_bytes else len(units))
  num_workers = min(num_workers, len(units))
  logging.info("Preparing %d shard(s) into %s with %d worker(s).", len(units), output_dir, num_workers)
  start, done, results = time.perf_counter(), 0, []
  if num_workers == 1:
    _init_worker(tokenizer_args)
    iterator = map(_write_shard, units)
  else:
    pool = multiprocessing.get_context("spawn").Pool(num_workers, _init_worker, (tokenizer_args, True))
    iterator = pool.imap(_write_shard, units)
  text_bytes, logged = 0, 0.0
  for result in iterator:
    results.append(result)
    done += 1
    text_bytes += 0 if result.get("skipped") else result["text_bytes"]
    elapsed = time.perf_counter() - start
    if done < len(units) and elapsed - logged < _LOG_EVERY_SECONDS:
      continue
    logged = elapsed
    logging.info(
      "shard %d/%d %s: %d documents, %d tokens | %.2f MB/s | ETA %.0f s",
      done,
      len(units),
      "already done" if result.get("skipped") else "written",
      result["documents"],
      result["tokens"],
      text_bytes / 1e6 / max(elapsed, 1e-9),
      elapsed / done * (len(units) - done),
    )
  if num_workers > 1:
    pool.close()
    pool.join()
  _hold_out_minimum(results, output_dir, data_config.eval_min_documents)
  totals = {key: sum(r[key] for r in results) for key in dataclasses.asdict(ShardStats())}
  held_out = [r["eval"] for r in results if r["eval"]["documents"]]
  train_counts, eval_counts = (
    np.sum([part["token_counts"] for part in parts], axis=0) for parts in (results, [r["eval"] for r in results])
  )
  manifest = dict(
    tokenizer=tokenizer.identity(),
    vocab_size=tokenizer.vocab_size,
    **totals,
    shards=[{k: r[k] for k in SHARD_KEYS} for r in results],
    # The evaluation split: documents no training shard holds (see `document_place`); empty shards not listed.
    eval_fraction=data_config.eval_fraction,
    eval_min_documents=data_config.eval_min_documents,
    eval_documents=sum(part["documents"] for part in held_out),
    eval_tokens=sum(part["tokens"] for part in held_out),
    eval_shards=[{k: part[k] for k in SHARD_KEYS} for part in held_out],
    # The score of plain token frequencies on the evaluation split (none without one).
    unigram=unigram_baseline(train_counts, eval_counts) if held_out else None,
  )
  paths.write_text(os.path.join(output_dir, MANIFEST), json.dumps(manifest, indent=1))
  logging.info(
    "Prepared %d documents, %d sentences, %d tokens and %d held-out documents (%d tokens) for evaluation in %.1f s "
    "(%d empty documents dropped, %d bytes replaced).",
    totals["documents"],
    totals["sentences"],
    totals["tokens"],
    manifest["eval_documents"],
    manifest["eval_tokens"],
    time.perf_counter() - start,
    totals["empty_documents"],
    totals["replaced_bytes"],
  )
  return manifest


def read_manifest(prepared_dir: str, tokenizer=None) -> dict:
  """The manifest of prepared data; refuses a manifest that is not one, and data prepared with another tokenizer
  than `tokenizer`."""
  path = os.path.join(prepared_dir, MANIFEST)
  if not epath.Path(path).exists():
    raise FileNotFoundError(
      f"No {MANIFEST} in {prepared_dir}: prepare the corpus first (python -m bert_jax.main --mode=prepare ...)."
    )
  try:
    manifest = json.loads(epath.Path(path).read_text())
  except (json.JSONDecodeError, UnicodeDecodeError) as error:
    raise ValueError(f"{path} is not a manifest (not JSON: {error}); prepare the corpus again.") from None
  missing = [key for key in ("tokenizer", "shards") if not isinstance(manifest, dict) or key not in manifest]
  bad_shards = [s for s in manifest.get("shards", []) if not {"file", "documents"} <= set(s)] if not missing else []
  if missing or not isinstance(manifest["shards"], list) or bad_shards:
    raise ValueError(
      f"{path} is not a manifest of prepared data (missing {missing or 'file/documents of ' + str(bad_shards[:1])}); "
      "prepare the corpus again."
    )
  if tokenizer is not None and manifest["tokenizer"]["sha256"] != tokenizer.identity()["sha256"]:
    raise ValueError(
      f"{path} was prepared with tokenizer {manifest['tokenizer']}, but the config's tokenizer is "
      f"{tokenizer.identity()}; prepare the corpus again with this tokenizer."
    )
  return manifest


def check_shards(prepared_dir: str, manifest: dict, verify_hashes: bool = False) -> None:
  """Every shard the manifest lists is there, whole: its size (cheap, from the file system), and with
  `verify_hashes` its record count and SHA-256 (reads the corpus once). Raises naming the file."""
  unrecorded = []
  for shard in manifest["shards"]:
    path = os.path.join(prepared_dir, shard["file"])
    if not epath.Path(path).exists():
      raise FileNotFoundError(f"{path}, a shard listed in {prepared_dir}/{MANIFEST}, does not exist.")
    if "bytes" not in shard:
      unrecorded.append(shard["file"])
      continue
    size = epath.Path(path).stat().length
    if size != shard["bytes"]:
      raise ValueError(
        f"{path} has {size} bytes; {MANIFEST} recorded {shard['bytes']}: the shard is truncated or was changed. "
        "Prepare the corpus again."
      )
    if verify_hashes:
      found = _file_integrity(path)
      for key in ("records", "sha256"):
        if found[key] != shard[key]:
          raise ValueError(f"{path}: {key} {found[key]}, but {MANIFEST} recorded {shard[key]}. Prepare it again.")
  if unrecorded:
    logging.warning(
      "%s was prepared by an older bert_jax: %d shard(s) have no recorded size or hash, so they are not checked. "
      "Prepare the corpus again (finished shards are kept) to record them.",
      os.path.join(prepared_dir, MANIFEST),
      len(unrecorded),
    )


def python_docs_text() -> str:
  """Python's own documentation topics (`pydoc_data`, shipped with CPython) in BERT's format: ~80 documents of
  real English, about 65k words. The embedded corpus for demos and offline runs."""
  from pydoc_data.topics import topics

  documents = []
  for name in sorted(topics):
    sentences = [s for s in text_documents([topics[name]]).__next__() if len(s.split()) > 2]
    if sentences:
      documents.append("\n".join(sentences))
  return "\n\n".join(documents) + "\n"


def paths_for_run(config, workdir: str) -> tuple[str, str]:
  """(tokenizer path, prepared dir): the config's, or under the workdir for the embedded corpus."""
  embedded = bool(config.data.embedded_corpus)
  tokenizer_path = config.tokenizer.path or (os.path.join(workdir, "tokenizer", "spm.model") if embedded else "")
  prepared_dir = config.data.prepared_dir or (os.path.join(workdir, "prepared") if embedded else "")
  if not tokenizer_path or not prepared_dir:
    raise ValueError(
      "tokenizer.path and data.prepared_dir must be set (or data.embedded_corpus, which derives "
      f"both from the workdir); got tokenizer.path={config.tokenizer.path!r}, "
      f"data.prepared_dir={config.data.prepared_dir!r}."
    )
  return tokenizer_path, prepared_dir


def prepare_for_run(config, workdir: str) -> tuple[str, str]:
  """--mode=prepare, and the embedded corpus on first use: the text, the tokenizer (SentencePiece is trained
  when its file is missing), then the shards. Returns (tokenizer path, prepared dir)."""
  tokenizer_path, prepared_dir = paths_for_run(config, workdir)
  data = config.data
  if data.embedded_corpus:
    if data.embedded_corpus != "python_docs":
      raise ValueError(f"data.embedded_corpus={data.embedded_corpus!r}; expected 'python_docs' or ''.")
    corpus = os.path.join(workdir, "corpus", "python_docs.txt")
    if not epath.Path(corpus).exists():
      epath.Path(corpus).parent.mkdir(parents=True, exist_ok=True)
      paths.write_text(corpus, python_docs_text())
    data = ml_collections.ConfigDict(data.to_dict())
    data.update(input_pattern=corpus, input_format="bert", tfds_name="")
  if not epath.Path(tokenizer_path).exists():
    if config.tokenizer.kind != "sentencepiece":
      raise FileNotFoundError(f"tokenizer.path={tokenizer_path!r} does not exist.")
    if data.tfds_name:
      raise ValueError("Training a SentencePiece vocabulary reads text files; give tokenizer.path for TFDS input.")
    inputs = paths.glob(data.input_pattern) if data.input_pattern else []
    if not inputs:
      raise ValueError(f"data.input_pattern={data.input_pattern!r} matches no file to train a vocabulary on.")
    epath.Path(tokenizer_path).parent.mkdir(parents=True, exist_ok=True)
    logging.info("Training a %d-piece SentencePiece vocabulary on %d file(s).", config.model.vocab_size, len(inputs))
    from bert_jax.data.tokenizer import train_sentencepiece

    trained = train_sentencepiece(
      inputs,
      tokenizer_path.removesuffix(".model"),
      config.model.vocab_size,
      config.tokenizer.train_max_sentences,
      config.seed,
    )
    assert trained == tokenizer_path, (trained, tokenizer_path)
  tokenizer_args = dict(kind=config.tokenizer.kind, path=tokenizer_path, lower_case=config.tokenizer.lower_case)
  if not epath.Path(prepared_dir, MANIFEST).exists():
    prepare(data, tokenizer_args, prepared_dir)
  return tokenizer_path, prepared_dir
