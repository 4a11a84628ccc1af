"""What a prepared corpus was made from, recorded in its manifest (`input`) so that a re-run can tell whether the
corpus there is the one it would write: the input files as named, each with its size and SHA-256
(`paths.fingerprint`), or the TFDS dataset's full name, version and split (with TFDS's own counts and checksums where
it records them); and the settings of `config.data` that change what preparation writes from that input
(`SETTINGS`). The tokenizer's identity is recorded beside it (`manifest["tokenizer"]`) and compared with it.

`differences` names each thing that differs, in one phrase each. Names are informative, as the tokenizer's path is:
inputs with the same contents in the same order are the same input, wherever they were moved.
"""

import concurrent.futures

from bert_jax import paths
from bert_jax.data.input_formats import RECORD_FORMATS

# The keys of `config.data` whose values change what preparation writes from a given input, by source; preparation
# reads them through `settings` alone. Where the input is (data.input_pattern, tfds_name, tfds_split, tfds_data_dir) is
# the input's record, not a setting. The run's settings (data.max_seq_length, masking, instances, ...) are not here:
# the pipeline makes its rows from the prepared documents at every step, so one corpus serves them all. Record files
# (JSONL, Parquet, Arrow) add `data.text_field` (text files do not record it: their corpora's records stay as written).
SETTINGS = dict(
  files=("input_format", "prepare_unit_bytes", "max_document_bytes", "eval_fraction", "eval_min_documents"),
  records=(
    "input_format",
    "text_field",
    "prepare_unit_bytes",
    "max_document_bytes",
    "eval_fraction",
    "eval_min_documents",
  ),
  tfds=("tfds_feature", "num_shards", "eval_fraction", "eval_min_documents"),
)


def settings(data_config) -> dict:
  """The values of `SETTINGS` in `data_config` (`config.data`), for its source."""
  if data_config.tfds_name:
    source = "tfds"
  else:
    source = "records" if data_config.input_format in RECORD_FORMATS else "files"
  return {key: data_config[key] for key in SETTINGS[source]}


# Files read at once by `files_record`: hashing releases the GIL, and reads from gs:// overlap (a corpus of many
# files on GCS is read at the machine's network bandwidth, not one stream's).
_FINGERPRINT_THREADS = 16


def files_record(inputs: list[str]) -> list[dict]:
  """Each input file as named, with its size and SHA-256 (reads every byte, `_FINGERPRINT_THREADS` files at once)."""
  with concurrent.futures.ThreadPoolExecutor(min(_FINGERPRINT_THREADS, max(1, len(inputs)))) as pool:
    return [dict(path=path, **found) for path, found in zip(inputs, pool.map(paths.fingerprint, inputs), strict=True)]


def tfds_record(builder, split: str) -> dict:
  """A built TFDS dataset: its full name (name/config/version), version and `split`, with the split's examples and
  bytes and the download checksums TFDS recorded, where it recorded them."""
  info = builder.info
  record = dict(name=info.full_name, version=str(info.version), split=split)
  try:
    record.update(examples=info.splits[split].num_examples, bytes=info.splits[split].num_bytes)
  except KeyError:  # No split statistics recorded (TFDS's mock data).
    pass
  checksums = dict(info.as_proto.download_checksums)
  if checksums:
    record["download_checksums"] = checksums
  return record


def _file(entry: dict) -> str:
  return f"{entry['bytes']:,} bytes sha256 {entry['sha256'][:12]}.."


def _source(record: dict) -> str:
  if "tfds" in record:
    return f"TFDS {record['tfds']['name']} split {record['tfds']['split']!r}"
  return f"{len(record['files'])} file(s) ({', '.join(entry['path'] for entry in record['files'][:3])})"


def _input_differences(before: dict, now: dict) -> list[str]:
  if ("tfds" in before) != ("tfds" in now):
    return [f"input {_source(before)} when prepared, {_source(now)} now"]
  if "tfds" in now:
    keys = dict.fromkeys([*before["tfds"], *now["tfds"]])
    return [
      f"TFDS {key} {before['tfds'].get(key)!r} when prepared, {now['tfds'].get(key)!r} now"
      for key in keys
      if before["tfds"].get(key) != now["tfds"].get(key)
    ]
  if [(f["bytes"], f["sha256"]) for f in before["files"]] == [(f["bytes"], f["sha256"]) for f in now["files"]]:
    return []  # The same contents in the same order: the same input, wherever it is.
  old, new = ({entry["path"]: entry for entry in record["files"]} for record in (before, now))
  found = []
  for path in dict.fromkeys([*old, *new]):
    if path in old and path in new:
      if (old[path]["bytes"], old[path]["sha256"]) != (new[path]["bytes"], new[path]["sha256"]):
        found.append(f"input {path} changed: {_file(old[path])} when prepared, {_file(new[path])} now")
    elif path in old:
      found.append(f"input {path} ({_file(old[path])}) was prepared from, and is not an input now")
    else:
      found.append(f"input {path} ({_file(new[path])}) is an input now, and was not prepared from")
  return found


def _tokenizer(identity: dict) -> str:
  return ", ".join(f"{key} {value[:12] + '..' if key == 'sha256' else value}" for key, value in identity.items())


def differences(manifest: dict, record: dict, tokenizer: dict) -> list[str]:
  """What differs between the input and settings `manifest` records and `record` (`files_record`/`tfds_record` and
  `settings`, as `{"files" or "tfds": ..., "settings": ...}`) with `tokenizer` (its identity): one phrase each,
  the value when prepared and now. Empty: the same preparation."""
  before = manifest["input"]
  found = _input_differences(before, record)
  for key in dict.fromkeys([*before["settings"], *record["settings"]]):
    old, new = before["settings"].get(key, "unset"), record["settings"].get(key, "unset")
    if old != new:
      found.append(f"data.{key} {old!r} when prepared, {new!r} now")
  old, new = ({k: v for k, v in identity.items() if k != "path"} for identity in (manifest["tokenizer"], tokenizer))
  if old != new:
    found.append(f"tokenizer {_tokenizer(old)} when prepared, {_tokenizer(new)} now")
  return found
