"""Local and `gs://` paths through one library, `etils.epath`, for every file operation but tf.data's reading.

etils reaches `gs://` through `gcsfs` (bert_jax sets `EPATH_USE_TF=false` before etils first looks; see
`bert_jax/__init__.py`), the same client in production and against the GCS emulator of the tests. Writers that
only speak TensorFlow's file system (TensorBoard event files, tf.data iterator checkpoints, TF1 checkpoints)
write to a local directory whose files are then copied with epath (`copy_tree`, `local_copy`).
"""

import contextlib
import hashlib
import json
import os
import tempfile
import uuid
from collections.abc import Iterator

from etils import epath


class WriteError(OSError):
  """A write that failed (a full disk, no permission, a read-only file system), naming the path being written and
  the cause: what an OSError from a write to an open file leaves out (`[Errno 28] No space left on device`)."""


@contextlib.contextmanager
def writing(path) -> Iterator[None]:
  """Raises WriteError naming `path` and the cause for an OSError of the block; a FileExistsError (an answer to an
  exclusive create) and a WriteError pass as they are."""
  try:
    yield
  except (FileExistsError, WriteError):
    raise
  except OSError as error:
    raise WriteError(f"Cannot write {path}: {error.strerror or error}.") from error


def is_local(path) -> bool:
  """A path on this machine (absolute or relative), not `scheme://...`."""
  return "://" not in os.fspath(path)


def absolute(path) -> epath.Path:
  """`path` as an absolute epath (a relative local path from the working directory); gs:// as it is. Orbax and
  tensorstore need absolute paths."""
  return epath.Path(os.path.abspath(path) if is_local(path) else path)


def overlaps(a, b) -> bool:
  """Whether one of two directories is, or contains, the other; local paths with their symlinks resolved."""
  a, b = (os.path.realpath(p) if is_local(p) else os.fspath(p) for p in (a, b))
  a, b = a.rstrip("/") + "/", b.rstrip("/") + "/"
  return a.startswith(b) or b.startswith(a)


def files(directory) -> list[epath.Path]:
  """Every file under `directory`, sorted. (epath's `walk` loses the gs:// scheme; `rglob` refuses.)"""
  found = []
  for path in epath.Path(directory).iterdir():
    found += files(path) if path.is_dir() else [path]
  return sorted(found)


def file_sha256(path) -> str:
  """SHA-256 of a file's content (local or gs://), read in 1 MiB chunks."""
  digest = hashlib.sha256()
  with epath.Path(path).open("rb") as f:
    while chunk := f.read(1 << 20):
      digest.update(chunk)
  return digest.hexdigest()


def fingerprint(path) -> dict:
  """What `path` holds, by content, not by name: a file's size and SHA-256; a directory's file count, total size and
  one SHA-256 over every file's relative name, size and SHA-256. Two copies at different paths have the same
  fingerprint; a file changed in place has another. Reads every byte: for inputs of megabytes to a few gigabytes,
  once per launch."""
  path = epath.Path(path)
  if not path.is_dir():
    return dict(bytes=path.stat().length, sha256=file_sha256(path))
  digest, total, found = hashlib.sha256(), 0, files(path)
  for file in found:
    size = file.stat().length
    total += size
    digest.update(f"{file.relative_to(path)}\0{size}\0{file_sha256(file)}\n".encode())
  return dict(files=len(found), bytes=total, sha256=digest.hexdigest())


def copy_tree(source, destination) -> None:
  """Copies every file under `source` to the same relative path under `destination` (replacing)."""
  source, destination = epath.Path(source), epath.Path(destination)
  for path in files(source):
    target = destination / path.relative_to(source)
    target.parent.mkdir(parents=True, exist_ok=True)
    path.copy(target, overwrite=True)


@contextlib.contextmanager
def local_copy(directory) -> Iterator[str]:
  """`directory` itself if it is local; else a temporary local copy of its files."""
  if is_local(directory):
    yield str(directory)
    return
  with tempfile.TemporaryDirectory() as local:
    copy_tree(directory, local)
    yield local


def glob(pattern: str, directories: bool = False) -> list[str]:
  """Files matching `pattern` (wildcards in any path component), local or gs://, sorted; and the directories
  matching it with `directories`."""

  def wanted(path: epath.Path) -> bool:
    return path.is_file() or (directories and path.is_dir())

  wildcard = min((pattern.find(c) for c in "*?[" if c in pattern), default=-1)
  if wildcard < 0:
    return [pattern] if wanted(epath.Path(pattern)) else []
  base = pattern.rfind("/", 0, wildcard)
  directory, relative = (pattern[:base] or "/", pattern[base + 1 :]) if base >= 0 else (".", pattern)
  return sorted(str(p) for p in epath.Path(directory).glob(relative) if wanted(p))


@contextlib.contextmanager
def staged_file(final, concurrent: bool = False) -> Iterator[str]:
  """A local path to write `final`'s content to (with any writer, TensorFlow's included); when the block ends
  without an error it becomes `final`, whole: by a rename locally, by one upload on GCS (whose objects appear
  whole). A reader never sees a part of it. `concurrent`: other processes may write the same `final` at the same
  time (a Beam runner's duplicated work), so each writes under a name of its own (a crash leaves it behind)."""
  final = epath.Path(final)
  if is_local(final):
    # A retry after a crash overwrites the one name; concurrent writers each have theirs.
    temporary = final.parent / (f"{final.name}.tmp-{uuid.uuid4().hex[:12]}" if concurrent else f"{final.name}.tmp")
    try:
      yield str(temporary)
      temporary.replace(final)
    finally:
      if temporary.exists():
        temporary.unlink()
    return
  with tempfile.TemporaryDirectory() as local:
    yield os.path.join(local, final.name)
    epath.Path(local, final.name).copy(final, overwrite=True)


def write_text(path, text: str, concurrent: bool = False) -> None:
  """Writes `text` to `path` whole (see `staged_file`)."""
  with writing(path), staged_file(path, concurrent) as local:
    epath.Path(local).write_text(text)


def text_lines(files) -> Iterator[str]:
  """The lines of `files` (local or gs://) in order, without their line ends; bytes that are not UTF-8 become U+FFFD."""
  for path in files:
    with epath.Path(path).open("rb") as f:
      for line in f:
        yield line.decode("utf-8", errors="replace").rstrip("\r\n")


def json_objects(path) -> Iterator[tuple[int, dict]]:
  """(line number from 1, object) of each non-blank line of the JSONL file `path` (local or gs://; bytes that are not
  UTF-8 become U+FFFD); raises ValueError naming `path`:line for a line that is not one JSON object."""
  with epath.Path(path).open("rb") as f:
    for number, raw in enumerate(f, 1):
      line = raw.decode("utf-8", errors="replace").strip()
      if line:
        yield number, json_object(line, f"{path}:{number}")


def json_object(line: str, where: str) -> dict:
  """The JSON object of one line of a JSONL file; raises ValueError naming `where` (file:line) for a line that is not
  one JSON object."""
  try:
    record = json.loads(line)
  except json.JSONDecodeError as error:
    raise ValueError(f"{where} is not JSON ({error.msg}); expected one JSON object a line.") from None
  if not isinstance(record, dict):
    raise ValueError(f"{where} holds a {type(record).__name__}; expected a JSON object a line.")
  return record
