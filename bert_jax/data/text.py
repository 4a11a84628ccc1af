"""Text reading, for corpus preparation: documents as lists of sentences, from a work unit of a text file (BERT's
format, or paragraphs split into sentences), from a TFDS text dataset, or from a record's text (`record_documents`:
`records.py` reads JSONL, Parquet and Arrow); the embedded corpus's text.

A file is read in work units of `data.prepare_unit_bytes`, each starting at a blank line its reader finds near its
offset (`unit_start`), line by line: no document outgrows `data.max_document_bytes` (a longer one is cut at a line,
a long book in the document format at a paragraph) and no line may exceed half a unit. Undecodable bytes are
replaced and counted.
"""

import io
import os
import re
from collections.abc import Iterator
from typing import Protocol

from absl import logging
from etils import epath

from bert_jax.data.input_formats import TEXT_FORMATS

# Sentence ends: ., ! or ? (with closing quotes/brackets), then whitespace and an upper-case letter, digit or quote.
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"'”’)\]]*\s+(?=[\"'“‘(\[]?[A-Z0-9])")


class TextCounts(Protocol):
  """What reading counts (a shard's statistics hold these among others)."""

  text_bytes: int
  replaced_bytes: int


def split_sentences(paragraph: str) -> list[str]:
  """A paragraph -> sentences, by end punctuation followed by a capital, digit or quote (a heuristic)."""
  return [s.strip() for s in _SENTENCE_END.split(" ".join(paragraph.split())) if s.strip()]


def decode_utf8(line: bytes) -> tuple[str, int]:
  """`line` as text, and how many of its bytes were not UTF-8 (each replaced by U+FFFD)."""
  try:
    return line.decode("utf-8"), 0
  except UnicodeDecodeError:
    text = line.decode("utf-8", errors="replace")
    return text, text.count("\ufffd") - line.count("\ufffd".encode())


def _decode(line: bytes, counts: TextCounts) -> str:
  counts.text_bytes += len(line)
  text, replaced = decode_utf8(line)
  counts.replaced_bytes += replaced
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


def _unit_lines(unit: dict, counts: TextCounts) -> Iterator[str]:
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
      yield _decode(line, counts).rstrip("\r\n")


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


def groups(items: Iterator[list[str]], max_bytes: int) -> Iterator[list[list[str]]]:
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


def bert_format_documents(lines: Iterator[str], max_bytes: int) -> Iterator[list[str]]:
  """One sentence per line, blank lines between documents; a document is cut after `max_bytes`."""
  yield from _blocks(lines, max_bytes)


def paragraph_documents(lines: Iterator[str], max_bytes: int) -> Iterator[list[str]]:
  """Text in paragraphs (blank lines between them) -> sentences; consecutive paragraphs make one document, cut at
  the first paragraph end after `max_bytes` (a file smaller than that is one document)."""
  for paragraphs in groups(_blocks(lines, max_bytes), max_bytes):
    yield [sentence for paragraph in paragraphs for sentence in split_sentences(" ".join(paragraph))]


def _at_least_one(documents: Iterator[list[str]]) -> Iterator[list[str]]:
  """`documents`, or one empty document (counted, not written) when there is none: a text without any."""
  first = next(documents, None)
  yield [] if first is None else first
  yield from documents


def record_documents(text: str, max_bytes: int) -> Iterator[list[str]]:
  """A record's text (JSONL, Parquet, Arrow: `records.py`) read as a file in the document format is: paragraphs on
  blank lines, then sentences, cut at the first paragraph end after `max_bytes`; a record without text is one empty
  document."""
  yield from _at_least_one(paragraph_documents(iter(text.split("\n")), max_bytes))


def text_documents(texts: Iterator[str]) -> Iterator[list[str]]:
  """Each text (held in memory: a TFDS example) is one document: paragraphs on blank lines, then sentences."""
  for text in texts:
    paragraphs = re.split(r"\n\s*\n", text)
    yield [sentence for paragraph in paragraphs for sentence in split_sentences(paragraph)]


def file_units(path: str, size: int, settings, **extra) -> list[dict]:
  """The work units `unit_documents` reads of one input file of `size` bytes, cut into `prepare_unit_bytes`
  each (a unit's reader finds the document or paragraph boundaries); `settings`: `config.data`, or its values as
  `input_record.settings` records them; `extra` added to each unit."""
  unit_bytes = settings["prepare_unit_bytes"]
  count = max(1, -(-size // unit_bytes))
  return [
    dict(
      source="files",
      path=path,
      **extra,
      input_format=settings["input_format"],
      index=index,
      units_of_file=count,
      unit_bytes=unit_bytes,
      max_document_bytes=settings["max_document_bytes"],
    )
    for index in range(count)
  ]


def tfds_unit(data_config, split: str, feature: str) -> dict:
  """The work unit `unit_documents` reads of a TFDS `split` (a slice of one, or the whole)."""
  return dict(
    source="tfds", name=data_config.tfds_name, split=split, feature=feature, data_dir=data_config.tfds_data_dir
  )


def unit_documents(unit: dict, counts: TextCounts) -> Iterator[list[str]]:
  """The documents (lists of sentences) of one work unit: a unit of a text file (`TEXT_FORMATS`), or a slice of a
  TFDS split."""
  if unit["source"] == "files" and unit["input_format"] not in TEXT_FORMATS:
    raise ValueError(
      f"data.input_format={unit['input_format']!r} is not a text format: expected one of {TEXT_FORMATS}."
    )
  if unit["source"] == "files" and unit["input_format"] == "bert":
    yield from bert_format_documents(_unit_lines(unit, counts), unit["max_document_bytes"])
  elif unit["source"] == "files":
    documents = paragraph_documents(_unit_lines(unit, counts), unit["max_document_bytes"])
    # A file without text is an empty document (counted, not written).
    yield from _at_least_one(documents) if unit["units_of_file"] == 1 else documents
  else:
    import tensorflow_datasets as tfds

    # Built once, by `prepare`, before any worker started: a worker only reads.
    dataset = tfds.load(unit["name"], split=unit["split"], data_dir=unit["data_dir"] or None, download=False)

    def texts():
      for example in tfds.as_numpy(dataset):
        yield _decode(example[unit["feature"]], counts)

    yield from text_documents(texts())


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


def prepare_tfds(name: str, data_dir: str, beam_options: str = ""):
  """Downloads and builds a TFDS dataset once, in this process, before the workers read their slices of it (each
  would otherwise download and build it at the same time); returns its builder. Nothing is done when `data_dir`
  already holds it: a directory on gs:// built elsewhere is read where it is. A dataset TFDS builds with Apache Beam
  (Wikipedia's) is built by a pipeline run with `beam_options` (`data.beam_options`; empty: Beam's local runner, a
  worker per core), whatever `data.prepare_runner`; without Beam installed, the error says how to install it."""
  import tensorflow_datasets as tfds

  builder = tfds.builder(name, data_dir=data_dir or None)
  logging.info("TFDS %s in %s: downloading and building it if needed (once).", name, builder.data_dir)
  try:
    import apache_beam  # noqa: F401 (only whether it is installed)
  except ImportError:
    download_config = None
  else:
    from bert_jax.data.beam_options import pipeline_options

    download_config = tfds.download.DownloadConfig(beam_options=pipeline_options(beam_options))
  try:
    builder.download_and_prepare(download_config=download_config)
  except ImportError as error:
    if download_config is not None or "apache_beam" not in str(error):
      raise
    raise ImportError(
      f"data.tfds_name={name!r} is built by TFDS with Apache Beam, which is not installed: pip install -e '.[beam]'."
    ) from error
  return builder
