"""Corpus preparation by input format: MB of text per second from the same documents as a text file, JSONL, Parquet
and a Hugging Face dataset saved to disk (Arrow), and what checking the records costs.

    python -m bert_jax.benchmarks.prepare_formats --input='../shared/data/pretrain/*/*.txt' \\
        --vocab=../shared/data/vocab/bert-base-uncased-vocab.txt

Each input file is one document (as `data.input_format="document"` reads it; bytes that are not UTF-8 replaced), the
whole `--repeat` times over. The documents are written once in each format, each as one input of about the same
number of units of `--unit_bytes`: BERT's format (the documents' sentences a line each), JSONL (a record a line),
Parquet (`--row_group_rows` documents a row group) and `datasets.Dataset.save_to_disk` (as many data files as the
text has units; needs `datasets`, in the test extras). Each is prepared with `--workers` processes, from the command's
start to the manifest (the input's SHA-256, the records' check, the plan, the shards); the rate is the documents' text
(UTF-8 bytes, the same in every format) over that time. Every format must give the same documents, sentences and
tokens. The formats are prepared in turn, `--rounds` times over, and the median time reported with the range. The
records' check (`records.input_files`: JSONL's every line parsed, Parquet's and Arrow's schemas) is timed alone, and so
is reading alone: every sentence preparation reads, in this process, without the tokenizer (`vocabulary.corpus_texts`).
"""

import json
import os
import shutil
import statistics
import tempfile
import time

from absl import app, flags

from bert_jax import paths
from bert_jax.data import prepare, records, text, vocabulary
from configs import default

_INPUT = flags.DEFINE_string("input", None, "Glob of text files, a document each.", required=True)
_VOCAB = flags.DEFINE_string("vocab", None, "WordPiece vocab.txt.", required=True)
_LOWER = flags.DEFINE_boolean("lower_case", True, "Lower-case (uncased vocabulary).")
_REPEAT = flags.DEFINE_integer("repeat", 8, "The documents this many times over.")
_UNIT_BYTES = flags.DEFINE_integer("unit_bytes", 8 << 20, "data.prepare_unit_bytes.")
_ROW_GROUP_ROWS = flags.DEFINE_integer("row_group_rows", 16, "Documents per Parquet row group.")
_WORKERS = flags.DEFINE_integer("workers", os.cpu_count() or 1, "Worker processes.")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Each format prepared this many times (the median reported).")


def _documents(pattern: str, repeat: int) -> list[str]:
  """Each file's text (bytes that are not UTF-8 replaced), the whole `repeat` times over."""
  return [open(path, "rb").read().decode("utf-8", errors="replace") for path in paths.glob(pattern)] * repeat


def _write_inputs(documents: list[str], scratch: str, max_document_bytes: int) -> dict[str, str]:
  """The documents in each format; returns each format's `data.input_pattern`."""
  import datasets
  import pyarrow as pa
  import pyarrow.parquet as pq

  names = dict(bert="corpus.txt", jsonl="corpus.jsonl", parquet="corpus.parquet", arrow="saved")
  inputs = {input_format: os.path.join(scratch, name) for input_format, name in names.items()}
  with open(inputs["bert"], "w", encoding="utf-8") as f:
    for document in documents:
      for sentences in text.record_documents(document, max_document_bytes):
        if sentences:
          f.write("\n".join(sentences) + "\n\n")
  with open(inputs["jsonl"], "w", encoding="utf-8") as f:
    for document in documents:
      f.write(json.dumps({"text": document}) + "\n")
  pq.write_table(pa.table({"text": documents}), inputs["parquet"], row_group_size=_ROW_GROUP_ROWS.value)
  text_bytes = sum(len(document.encode()) for document in documents)
  datasets.disable_progress_bars()
  datasets.Dataset.from_dict({"text": documents}).save_to_disk(
    inputs["arrow"], num_shards=max(1, -(-text_bytes // _UNIT_BYTES.value))
  )
  return inputs


def _input_bytes(data_config) -> int:
  if data_config.input_format == "arrow":
    return sum(os.path.getsize(path) for path in records.input_files(data_config))
  return os.path.getsize(data_config.input_pattern)


def main(argv):
  del argv
  documents = _documents(_INPUT.value, _REPEAT.value)
  megabytes = sum(len(document.encode()) for document in documents) / 1e6
  scratch = tempfile.mkdtemp(prefix="bert_jax_formats_")
  data = default.get_config().data
  inputs = _write_inputs(documents, scratch, data.max_document_bytes)
  tokenizer_args = dict(kind="wordpiece", path=_VOCAB.value, lower_case=_LOWER.value)
  print(
    f"{len(documents)} documents ({len(documents) // _REPEAT.value} x {_REPEAT.value}), {megabytes:.1f} MB of text; "
    f"data.prepare_unit_bytes={_UNIT_BYTES.value}, {_WORKERS.value} worker processes"
  )
  seconds, reading, checks, manifests = {name: [] for name in inputs}, {name: [] for name in inputs}, {}, {}
  for _ in range(_ROUNDS.value):  # The formats in turn, round after round: a slow minute of the machine hits all.
    for input_format, pattern in inputs.items():
      data = default.get_config().data
      data.update(input_pattern=pattern, input_format=input_format, prepare_unit_bytes=_UNIT_BYTES.value)
      start = time.perf_counter()
      records.input_files(data)
      checks[input_format] = time.perf_counter() - start
      start = time.perf_counter()
      for _ in vocabulary.corpus_texts(data, running_text=False):  # Every sentence preparation reads, no tokenizer.
        pass
      reading[input_format].append(time.perf_counter() - start)
      output = os.path.join(scratch, f"out_{input_format}")
      start = time.perf_counter()
      manifests[input_format] = prepare.prepare(data, tokenizer_args, output, _WORKERS.value)
      seconds[input_format].append(time.perf_counter() - start)
      shutil.rmtree(output)
  print(f"Medians of {_ROUNDS.value} rounds (range); MB/s: the documents' text over the median time.")
  print("| data.input_format | input MB | shards | records' check | reading alone | MB/s | preparation | MB/s |")
  print("|---|---|---|---|---|---|---|---|")
  for input_format, pattern in inputs.items():
    data = default.get_config().data
    data.update(input_pattern=pattern, input_format=input_format)
    read, prepared = (statistics.median(times[input_format]) for times in (reading, seconds))
    spans = [f"({min(times[input_format]):.1f}-{max(times[input_format]):.1f})" for times in (reading, seconds)]
    checked = f"{checks[input_format]:.2f} s" if input_format != "bert" else "-"
    print(
      f"| {input_format} | {_input_bytes(data) / 1e6:.1f} | {len(manifests[input_format]['shards'])} | {checked} | "
      f"{read:.1f} s {spans[0]} | {megabytes / read:.1f} | {prepared:.1f} s {spans[1]} | {megabytes / prepared:.2f} |"
    )
  counts = {
    name: [manifest[key] for key in ("documents", "eval_documents", "sentences", "tokens", "eval_tokens")]
    for name, manifest in manifests.items()
  }
  shutil.rmtree(scratch)
  if any(found != counts["bert"] for found in counts.values()):
    raise SystemExit(f"The formats gave different documents: {counts}")


if __name__ == "__main__":
  app.run(main)
