"""Records, for corpus preparation: the formats corpora ship in beside text files, a record a document, its text in
the field or column `data.text_field`:

* `jsonl`: JSON Lines, a JSON object a line (blank lines skipped); the text a string (null: an empty document);
* `parquet`: a Parquet file, the text a string column;
* `arrow`: a Hugging Face dataset saved to disk (`datasets.Dataset.save_to_disk`: `state.json` naming its
  `data-*.arrow` files, Arrow's streaming IPC format), read with pyarrow alone (`datasets` is not needed); or
  `.arrow` files named directly.

A record's text is read as a file in the document format is (`text.record_documents`: paragraphs on blank lines, then
sentences, cut after `data.max_document_bytes`). Files are read through etils.epath, local or gs://.

`input_files` finds and checks every input before preparation makes a unit, so nothing is written from a bad one: a
JSONL line that is not an object, lacks the field or holds no string (named file:line); a Parquet or Arrow file
without the column or with a column of another type (named with its columns); a directory that is not a saved dataset.

Work units (`file_units`, one shard each): a JSONL file is cut by bytes as a text file is (each unit starts at the
first line that starts at or after its offset, so units tile the file's lines); a Parquet file into runs of its row
groups, about one per `data.prepare_unit_bytes` of the file; an Arrow file is one unit (`save_to_disk` writes files
of at most `max_shard_size`, 500 MB by default). `unit_documents` reads a unit of any format (text files and TFDS:
`text.unit_documents`): the local preparer's workers and Beam's call it alike.
"""

import concurrent.futures
import functools
import io
import json
import os
import types
from collections.abc import Iterator

from etils import epath

from bert_jax import paths
from bert_jax.data import text
from bert_jax.data.input_formats import RECORD_FORMATS

# Input files checked at once by `input_files` (as `input_record` reads their fingerprints).
_CHECK_THREADS = 16
# Rows of a Parquet or Arrow file converted to Python strings at a time.
_BATCH_ROWS = 1024
_ARROW_FILE_MAGIC = b"ARROW1"  # Arrow's random-access file format; save_to_disk writes the streaming format.


def input_files(data_config) -> list[str]:
  """The files `data.input_pattern` names for `data.input_format`, in order (a saved dataset's data files in its
  own order), each checked (`check_file`); raises ValueError naming the first bad one, before anything is written."""
  pattern, input_format = data_config.input_pattern, data_config.input_format
  if input_format == "arrow":
    found = [name for match in paths.glob(pattern, directories=True) for name in _arrow_files(match)] if pattern else []
  else:
    found = paths.glob(pattern) if pattern else []
  if not found:
    raise ValueError(f"data.input_pattern={pattern!r} matches no file.")
  if input_format in RECORD_FORMATS:  # Files at once, as their fingerprints are read (gs:// reads overlap).
    with concurrent.futures.ThreadPoolExecutor(min(_CHECK_THREADS, len(found))) as pool:
      for _ in pool.map(functools.partial(check_file, input_format=input_format, field=data_config.text_field), found):
        pass  # Raises the first bad file's error, in input order.
  return found


def _arrow_files(path: str) -> list[str]:
  """The data files of a dataset saved to disk (in `state.json`'s order), or `path` itself, an `.arrow` file."""
  directory = epath.Path(path)
  if not directory.is_dir():
    if not path.endswith(".arrow"):
      raise ValueError(
        f"{path} (of data.input_pattern) is neither an .arrow file nor a dataset directory; data.input_format='arrow' "
        "reads what datasets.Dataset.save_to_disk writes: name its directory."
      )
    return [path]
  if (directory / "dataset_dict.json").exists():
    splits = json.loads((directory / "dataset_dict.json").read_text()).get("splits", [])
    raise ValueError(
      f"{path} is a DatasetDict saved to disk (splits {splits}); expected one dataset: name a split's directory, "
      f"e.g. {os.path.join(path, splits[0] if splits else 'train')}."
    )
  if not (directory / "state.json").exists():
    raise ValueError(
      f"{path} has no state.json: not a dataset saved by datasets.Dataset.save_to_disk (data.input_format='arrow')."
    )
  state = json.loads((directory / "state.json").read_text())
  return [str(directory / entry["filename"]) for entry in state["_data_files"]]


def _text_of(record: dict, field: str, where: str) -> str:
  """A JSONL object's text (null: none); raises naming `where` (file:line) when the field is missing or no string."""
  if field not in record:
    raise ValueError(f"{where} has no field {field!r} (data.text_field); it has {sorted(record)}.")
  value = record[field]
  if value is not None and not isinstance(value, str):
    raise ValueError(f"{where}: field {field!r} (data.text_field) holds a {type(value).__name__}; expected a string.")
  return value or ""


def _json_lines(path: str, f, start: int, end: int, field: str, counts) -> Iterator[str]:
  """The texts of the JSONL lines in bytes [start, end) of `f` (at `start`, a line start), counting undecodable bytes
  in `counts`. A line is named by its number from the file's start when `start` is 0, else by its byte offset."""
  position, number = start, 0
  while position < end:
    line = f.readline()
    if not line:
      break
    number += 1
    where = f"{path}:{number}" if start == 0 else f"{path} (the line at byte {position})"
    position += len(line)
    decoded, replaced = text.decode_utf8(line)
    counts.replaced_bytes += replaced
    if not decoded.strip():
      continue
    yield _text_of(paths.json_object(decoded, where), field, where)


def _check_column(path: str, schema, field: str) -> None:
  import pyarrow as pa

  if field not in schema.names:
    raise ValueError(f"{path} has no column {field!r} (data.text_field); its columns: {schema.names}.")
  kind = schema.field(field).type
  if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)):
    raise ValueError(f"{path}: column {field!r} (data.text_field) holds {kind}; expected strings.")


def _arrow_reader(f):
  """A reader of the record batches of an Arrow file, in the streaming format (save_to_disk's) or the file format."""
  import pyarrow as pa

  magic = f.read(len(_ARROW_FILE_MAGIC))
  f.seek(0)
  return pa.ipc.open_file(f) if magic == _ARROW_FILE_MAGIC else pa.ipc.open_stream(f)


def _arrow_batches(reader) -> Iterator:
  if hasattr(reader, "num_record_batches"):  # The file format's reader reads a batch by index.
    for index in range(reader.num_record_batches):
      yield reader.get_batch(index)
  else:
    yield from reader


def check_file(path: str, input_format: str, field: str) -> None:
  """Refuses a record file without its text where `input_format` expects it: every line of a JSONL file (named
  file:line), the schema of a Parquet or Arrow file."""
  if input_format == "jsonl":
    counts = types.SimpleNamespace(text_bytes=0, replaced_bytes=0)
    with epath.Path(path).open("rb") as raw, io.BufferedReader(raw, 1 << 20) as f:
      for _ in _json_lines(path, f, 0, float("inf"), field, counts):
        pass
    return
  with epath.Path(path).open("rb") as f:
    if input_format == "parquet":
      import pyarrow.parquet as pq

      _check_column(path, pq.ParquetFile(f).schema_arrow, field)
    else:
      _check_column(path, _arrow_reader(f).schema, field)


def file_units(path: str, size: int, settings, **extra) -> list[dict]:
  """The work units `unit_documents` reads of one input file of `size` bytes (text files: `text.file_units`);
  `settings`: `config.data`, or its values as `input_record.settings` records them; `extra` added to each unit."""
  if settings["input_format"] not in RECORD_FORMATS:
    return text.file_units(path, size, settings, **extra)
  # JSONL's units are a text file's byte ranges (each starting at a line start); the others keep as many of them.
  units = text.file_units(path, size, settings, text_field=settings["text_field"], **extra)
  if settings["input_format"] == "parquet":
    import pyarrow.parquet as pq

    with epath.Path(path).open("rb") as f:
      row_groups = pq.ParquetFile(f).num_row_groups
    units = units[: max(1, min(len(units), row_groups))]
    for index, unit in enumerate(units):
      unit["row_groups"] = [index * row_groups // len(units), (index + 1) * row_groups // len(units)]
  elif settings["input_format"] == "arrow":
    units = units[:1]
  for unit in units:
    unit["units_of_file"] = len(units)
  return units


def _line_start(f, size: int, offset: int) -> int:
  """The first line start at or after `offset` in `f` (a file of `size` bytes)."""
  if offset <= 0 or offset >= size:
    return min(max(offset, 0), size)
  f.seek(offset - 1)
  if f.read(1) == b"\n":
    return offset
  return offset + len(f.readline())


def unit_texts(unit: dict, counts: text.TextCounts) -> Iterator[str]:
  """The texts of the records of one work unit of a record file, in order; their UTF-8 bytes counted in `counts`."""
  path, field = unit["path"], unit["text_field"]
  with epath.Path(path).open("rb") as raw, io.BufferedReader(raw, 1 << 20) as f:
    if unit["input_format"] == "jsonl":
      size, unit_bytes = f.seek(0, os.SEEK_END), unit["unit_bytes"]
      start, end = (_line_start(f, size, index * unit_bytes) for index in (unit["index"], unit["index"] + 1))
      f.seek(start)
      texts = _json_lines(path, f, start, end, field, counts)
    elif unit["input_format"] == "parquet":
      texts = _parquet_texts(f, unit["row_groups"], field)
    else:
      texts = (value for batch in _arrow_batches(_arrow_reader(f)) for value in batch.column(field).to_pylist())
    for value in texts:
      value = value or ""
      counts.text_bytes += len(value.encode("utf-8"))
      yield value


def _parquet_texts(f, row_groups: list[int], field: str) -> Iterator[str | None]:
  import pyarrow.parquet as pq

  first, end = row_groups
  if first == end:
    return
  batches = pq.ParquetFile(f).iter_batches(batch_size=_BATCH_ROWS, row_groups=range(first, end), columns=[field])
  for batch in batches:
    yield from batch.column(0).to_pylist()


def unit_documents(unit: dict, counts: text.TextCounts) -> Iterator[list[str]]:
  """The documents (lists of sentences) of one work unit of any input: a record file's (each record's text), a text
  file's or a TFDS split's (`text.unit_documents`)."""
  if unit["source"] != "files" or unit["input_format"] not in RECORD_FORMATS:
    yield from text.unit_documents(unit, counts)
    return
  for record_text in unit_texts(unit, counts):
    yield from text.record_documents(record_text, unit["max_document_bytes"])
