"""The manifest of a prepared corpus: what a run reads. Where a run's tokenizer and prepared corpus are
(`paths_for_run`), the manifest written beside the shards and read back (its tokenizer checked against the run's),
each shard checked against what it records (size; with `verify_hashes` records and SHA-256), and the corpus against
the least a run needs (`MIN_DOCUMENTS`).

A shard's entry (`SHARD_KEYS`) names its file (relative to the prepared directory) and counts its documents,
sentences and tokens, with the bytes, records and SHA-256 to check it by. The manifest also records what the
corpus was made from (`input`, see `input_record`), which preparation compares on a re-run. The run-time path reads
prepared data through this module alone, never through the preparation that wrote it.
"""

import hashlib
import json
import os
import struct

from absl import logging
from etils import epath

from bert_jax import paths
from bert_jax.data.tokenizer_names import trained_file_name

MANIFEST = "manifest.json"
SHARD_KEYS = ("file", "documents", "sentences", "tokens", "bytes", "records", "sha256")
# The training documents a corpus needs: a random next sentence (and every row's partner stream) comes from another
# document. Preparation refuses input with fewer (`shards.check_enough_documents`), a run a corpus with fewer.
MIN_DOCUMENTS = 2


def paths_for_run(config, workdir: str) -> tuple[str, str]:
  """(tokenizer path, prepared dir): the config's, or under the workdir for the embedded corpus (the tokenizer file
  named by its kind: spm.model, vocab.txt, vocab.json or tokenizer.json)."""
  embedded = bool(config.data.embedded_corpus)
  trained = os.path.join(workdir, "tokenizer", trained_file_name(config.tokenizer)) if embedded else ""
  tokenizer_path = config.tokenizer.path or trained
  prepared_dir = config.data.prepared_dir or (os.path.join(workdir, "prepared") if embedded else "")
  if not tokenizer_path or not prepared_dir:
    raise ValueError(
      "tokenizer.path and data.prepared_dir must be set (or data.embedded_corpus, which derives "
      f"both from the workdir); got tokenizer.path={config.tokenizer.path!r}, "
      f"data.prepared_dir={config.data.prepared_dir!r}."
    )
  return tokenizer_path, prepared_dir


def file_integrity(path: str) -> dict:
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


def write_manifest(prepared_dir: str, manifest: dict) -> None:
  """Writes the manifest beside the shards, whole (the last file preparation writes)."""
  paths.write_text(os.path.join(prepared_dir, MANIFEST), json.dumps(manifest, indent=1))


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


def check_documents(prepared_dir: str, manifest: dict) -> None:
  """The corpus holds at least `MIN_DOCUMENTS` training documents; raises naming the directory and the count."""
  documents = sum(shard["documents"] for shard in manifest["shards"])
  if documents < MIN_DOCUMENTS:
    raise ValueError(
      f"{prepared_dir} holds {documents} training document(s); pretraining needs at least {MIN_DOCUMENTS} (a random "
      "next sentence comes from another document). Prepare a larger corpus."
    )


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
      found = file_integrity(path)
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
