"""Corpus preparation speed: MB of text per second, whole (reading, sentence splitting, tokenizing, writing shards).

    python -m bert_jax.benchmarks.prepare_throughput --input='../shared/data/pretrain/*/*.txt' \\
        --vocab=../shared/data/vocab/bert-base-uncased-vocab.txt \\
        --check_vocabs=../shared/data/vocab/bert-base-uncased-vocab.txt,../shared/data/vocab/bert-base-cased-vocab.txt

Layouts: the input files as they are (`--input_format`), prepared once with the pure-Python WordPiece
(`wordpiece.py`, the reference) in one process, the approach of Google's `create_pretraining_data.py`, and with
the compiled one in 1 and in `--workers` processes; and the same text `--repeat` times over as one large file in
BERT's format (each file's lines, a blank line between files), which only byte splitting spreads over cores,
prepared with 1 and `--workers` processes (large enough that starting the workers, each importing TensorFlow,
is a small part). Every preparation of a layout must write the same bytes as its first.

With `--beam` (the `beam` extra), each layout is also prepared by `data.prepare_runner="beam"` on Beam's local
runner with `--workers` worker processes, which must write the same files, byte for byte, manifest included.

With `--check_vocabs` it first compares the compiled WordPiece's ids with the pure-Python one's on every line of
the input, for each vocabulary (a name with "uncased" is lower-cased), and times both, and `tokenizers`'
BertWordPieceTokenizer (the other compiled candidate) when it is installed.
"""

import glob
import os
import shutil
import tempfile
import time

import numpy as np
from absl import app, flags

from bert_jax.data import prepare
from bert_jax.data.input_formats import TEXT_FORMATS
from bert_jax.data.tokenizer import Tokenizer, WordPieceTokenizer, load_tokenizer
from configs import default

_INPUT = flags.DEFINE_string("input", None, "Glob of text files.", required=True)
_VOCAB = flags.DEFINE_string("vocab", None, "WordPiece vocab.txt for the timed preparations.", required=True)
_LOWER = flags.DEFINE_boolean("lower_case", True, "Lower-case (uncased vocabulary).")
_FORMAT = flags.DEFINE_enum("input_format", "document", list(TEXT_FORMATS), "Format of the input files.")
_UNIT_BYTES = flags.DEFINE_integer("unit_bytes", 8 << 20, "data.prepare_unit_bytes.")
_WORKERS = flags.DEFINE_integer("workers", os.cpu_count() or 1, "Worker processes of the parallel runs.")
_REPEAT = flags.DEFINE_integer("repeat", 32, "The one-file layout holds the input this many times over.")
_BEAM = flags.DEFINE_boolean("beam", False, "Also prepare on Apache Beam's local runner with --workers workers.")
_CHECK = flags.DEFINE_list("check_vocabs", [], "Vocabularies whose compiled ids are checked on every input line.")


def _lines(paths: list[str]) -> list[str]:
  return [line.rstrip("\r\n") for path in paths for line in open(path, encoding="utf-8", errors="replace")]


def _check(paths: list[str], vocab: str) -> None:
  tokenizer = load_tokenizer("wordpiece", vocab, lower_case="uncased" in os.path.basename(vocab))
  lines = _lines(paths)
  tokenizer.encode_batch(lines[:1])  # Builds the compiled tokenizer.
  start = time.perf_counter()
  batches = [tokenizer.encode_batch(lines[i : i + 10_000]) for i in range(0, len(lines), 10_000)]
  compiled = time.perf_counter() - start
  ids, lengths = (np.concatenate(parts) for parts in zip(*batches, strict=True))
  start = time.perf_counter()
  reference = [tokenizer.encode(line) for line in lines]
  python = time.perf_counter() - start
  rows = np.split(ids, np.cumsum(lengths)[:-1])
  different = sum(row.tolist() != expected for row, expected in zip(rows, reference, strict=True))
  megabytes = sum(len(line.encode()) for line in lines) / 1e6
  print(
    f"{os.path.basename(vocab)} (lower_case={tokenizer.lower_case}): {len(lines)} lines, {megabytes:.2f} MB, "
    f"{different} with other ids; tokenizer alone, one process: compiled {megabytes / compiled:.1f} MB/s, "
    f"pure Python {megabytes / python:.2f} MB/s"
  )
  try:  # The other compiled candidate, when installed (it comes with `transformers`, in the test extras).
    import tokenizers
  except ImportError:
    return
  other = tokenizers.BertWordPieceTokenizer(vocab, lowercase=tokenizer.lower_case)
  start = time.perf_counter()
  encoded = [
    e.ids
    for i in range(0, len(lines), 10_000)
    for e in other.encode_batch(lines[i : i + 10_000], add_special_tokens=False)
  ]
  seconds = time.perf_counter() - start
  print(
    f"  tokenizers {tokenizers.__version__} BertWordPieceTokenizer.encode_batch (all cores): "
    f"{megabytes / seconds:.1f} MB/s, {sum(a != b for a, b in zip(encoded, reference, strict=True))} lines differ"
  )
  if different:
    raise SystemExit(f"{different} lines differ: the compiled WordPiece is not the reference.")


def _one_file(paths: list[str], scratch: str, repeat: int) -> str:
  path = os.path.join(scratch, "one_file", "corpus.txt")
  os.makedirs(os.path.dirname(path))
  with open(path, "wb") as out:
    for _ in range(repeat):
      for source in paths:
        out.write(open(source, "rb").read().rstrip(b"\n") + b"\n\n")
  return path


def _prepare(pattern: str, input_format: str, output: str, workers: int, runner: str = "local") -> tuple[float, dict]:
  data = default.get_config().data
  data.update(input_pattern=pattern, input_format=input_format, tfds_name="", prepare_unit_bytes=_UNIT_BYTES.value)
  data.update(prepare_runner=runner, beam_options=f"--direct_num_workers={workers}" if runner == "beam" else "")
  tokenizer_args = dict(kind="wordpiece", path=_VOCAB.value, lower_case=_LOWER.value)
  start = time.perf_counter()
  manifest = prepare.prepare(data, tokenizer_args, output, workers)
  return time.perf_counter() - start, manifest


def _shard_bytes(directory: str) -> list[bytes]:
  return [open(path, "rb").read() for path in sorted(glob.glob(os.path.join(directory, "*.tfrecord")))]


def _all_files(directory: str) -> dict[str, bytes]:
  return {name: open(os.path.join(directory, name), "rb").read() for name in sorted(os.listdir(directory))}


def _reference_prepare(pattern: str, input_format: str, output: str) -> tuple[float, dict]:
  """Every WordPiece call through wordpiece.py, in one process (a worker pool would import the compiled one)."""
  compiled = WordPieceTokenizer.encode_batch
  WordPieceTokenizer.encode_batch = Tokenizer.encode_batch
  try:
    return _prepare(pattern, input_format, output, 1)
  finally:
    WordPieceTokenizer.encode_batch = compiled


def main(argv):
  del argv
  paths = sorted(glob.glob(_INPUT.value))
  for vocab in _CHECK.value:
    _check(paths, vocab)
  scratch = tempfile.mkdtemp(prefix="bert_jax_prepare_")
  one_file = _one_file(paths, scratch, _REPEAT.value)
  layouts = [
    (_INPUT.value, _FORMAT.value, "the input files", True),
    (one_file, "bert", f"one file: the input x{_REPEAT.value}", False),
  ]
  beam = f" Beam's local runner, {_WORKERS.value} workers |" if _BEAM.value else ""
  print(
    f"| input | MB | shards | pure Python, 1 process | compiled, 1 process | compiled, {_WORKERS.value} processes |"
    + beam
  )
  print("|---|---|---|---|---|---|" + "---|" * bool(beam))
  for pattern, input_format, name, with_reference in layouts:
    rates, expected = [], None
    if with_reference:
      seconds, manifest = _reference_prepare(pattern, input_format, os.path.join(scratch, "reference"))
      rates.append(f"{manifest['text_bytes'] / 1e6 / seconds:.2f} MB/s")
      expected = _shard_bytes(os.path.join(scratch, "reference"))
    else:
      rates.append("-")
    for workers in (1, _WORKERS.value):
      output = os.path.join(scratch, f"compiled_{workers}")
      seconds, manifest = _prepare(pattern, input_format, output, workers)
      rates.append(f"{manifest['text_bytes'] / 1e6 / seconds:.2f} MB/s")
      expected = expected or _shard_bytes(output)
      if _shard_bytes(output) != expected:
        raise SystemExit(f"{name}, {workers} workers: the shards differ from the first preparation's.")
    if _BEAM.value:
      local = os.path.join(scratch, f"compiled_{_WORKERS.value}")
      output = os.path.join(scratch, "beam")
      seconds, on_beam = _prepare(pattern, input_format, output, _WORKERS.value, "beam")
      rates.append(f"{on_beam['text_bytes'] / 1e6 / seconds:.2f} MB/s")
      if on_beam != manifest or _all_files(output) != _all_files(local):
        raise SystemExit(f"{name}: Beam's corpus differs from the local preparer's.")
    for directory in glob.glob(os.path.join(scratch, "[rcb]*")):
      shutil.rmtree(directory)
    megabytes = manifest["text_bytes"] / 1e6
    print(f"| {name} ({input_format}) | {megabytes:.1f} | {len(manifest['shards'])} | " + " | ".join(rates) + " |")
  shutil.rmtree(scratch)


if __name__ == "__main__":
  app.run(main)
