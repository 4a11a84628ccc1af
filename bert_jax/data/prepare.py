"""Corpus preparation, offline and once: raw text -> sharded TFRecords of tokenized documents + a manifest. This
module orchestrates; the pieces live beside it: `text` reads documents, `shards` tokenizes and writes them,
`manifest` records what was written (and is what a run reads).

Inputs are files by glob (local or `gs://`): text, either in BERT's format (one sentence per line, a blank line
between documents) or one document per file (paragraphs split on blank lines, sentences by punctuation); or records,
a document each (JSONL, Parquet, a Hugging Face dataset saved to disk: `records.py`, which checks every input first);
or a TFDS text dataset (name, split, feature; one example per document). Work is split by bytes: each file is cut
into units of about `data.prepare_unit_bytes` (`work_units`, `records.file_units`), so one large file is prepared by
every core; each unit (or each of `num_shards` slices of a TFDS split) becomes one shard, written by a worker
process. The output depends only on
the input, the tokenizer and the settings `input_record.SETTINGS` names. Undecodable bytes are replaced and counted;
empty documents are dropped and counted; the counts are in `manifest.json` with the tokenizer's identity and the
input's record.

Nothing is written before `plan_preparation` has compared the input with the corpus already in the directory (kept
when the same, refused when another unless `data.prepare_overwrite`) and checked that it holds enough documents.
"""

import dataclasses
import hashlib
import json
import multiprocessing
import os
import time

import ml_collections
import numpy as np
from absl import logging
from etils import epath

from bert_jax import paths
from bert_jax.data import beam_options as beam_flags
from bert_jax.data import input_record, readers, records, shards, text
from bert_jax.data.input_formats import check_input_format
from bert_jax.data.manifest import MANIFEST, SHARD_KEYS, check_shards, paths_for_run, read_manifest, write_manifest
from bert_jax.data.tokenizer import Tokenizer, load_tokenizer

_LOG_EVERY_SECONDS = 10.0
# Text per worker process when the count is not given (each imports TensorFlow: seconds before its first shard).
WORKER_BYTES = 32 << 20


def work_units(data_config, tokenizer_sha256: str) -> tuple[list[dict], dict]:
  """The shards to write, and the record of what they are made from (`input_record`: the input and the settings,
  which preparation reads through it alone). Each input file is cut into units of `data.prepare_unit_bytes` (at
  document or paragraph boundaries, found by each unit's worker), or a TFDS split into `data.num_shards` even slices;
  `place` names each one's shard. Reads every input byte (the files' SHA-256); builds a TFDS dataset if needed."""
  chosen = input_record.settings(data_config)
  if data_config.tfds_name:
    import tensorflow_datasets as tfds

    builder = text.prepare_tfds(data_config.tfds_name, data_config.tfds_data_dir, data_config.beam_options)
    record = dict(tfds=input_record.tfds_record(builder, data_config.tfds_split), settings=chosen)
    splits = tfds.even_splits(data_config.tfds_split, n=chosen["num_shards"])
    units = [text.tfds_unit(data_config, split, chosen["tfds_feature"]) for split in splits]
  else:
    check_input_format(data_config)
    record = dict(files=input_record.files_record(records.input_files(data_config)), settings=chosen)
    units = []
    for entry in record["files"]:
      found = dict(file_bytes=entry["bytes"], file_sha256=entry["sha256"])
      units += records.file_units(entry["path"], entry["bytes"], chosen, **found)
  for unit in units:
    unit.update(
      eval_fraction=chosen["eval_fraction"],
      eval_min_documents=chosen["eval_min_documents"],
      tokenizer_sha256=tokenizer_sha256,
    )
  return units, record


def place(units: list[dict], output_dir: str, shard_dir: str = "") -> None:
  """Names each unit's shard: `documents-NNNNN-of-NNNNN.tfrecord` in `shard_dir` (relative to `output_dir`)."""
  for index, unit in enumerate(units):
    unit["file"] = os.path.join(shard_dir, f"documents-{index:05d}-of-{len(units):05d}.tfrecord")
    unit["output"] = os.path.join(output_dir, unit["file"])


@dataclasses.dataclass
class Plan:
  """What preparation into a directory will do, decided before anything is written there: `kept`, the manifest of a
  corpus already prepared from this input (nothing to write); else `units` to write (each placed), and `replaced`,
  the manifest of the corpus the new one replaces (its files removed once the new manifest is written)."""

  tokenizer: Tokenizer
  units: list[dict]
  record: dict
  kept: dict | None = None
  replaced: dict | None = None


def _found_manifest(output_dir: str) -> tuple[dict | None, str]:
  """The manifest already in `output_dir` (None if none, or if it cannot be read), and why it cannot be read."""
  if not epath.Path(output_dir, MANIFEST).exists():
    return None, ""
  try:
    return read_manifest(output_dir), ""
  except ValueError as error:
    return None, f"its manifest cannot be read ({error})"


def _whole(output_dir: str, manifest: dict) -> bool:
  """Whether every shard `manifest` lists, training and evaluation, is there with its recorded size."""
  try:
    check_shards(output_dir, dict(manifest, shards=manifest["shards"] + manifest.get("eval_shards", [])))
  except (FileNotFoundError, ValueError) as error:
    logging.warning("%s: %s Writing what is missing.", output_dir, error)
    return False
  return True


def plan_preparation(data_config, tokenizer_args: dict, output_dir: str) -> Plan:
  """Reads the input (its SHA-256) and compares it, the settings and the tokenizer with what a corpus already in
  `output_dir` was prepared from. The same: that corpus is kept (its missing shards written). Another, or a corpus
  prepared before inputs were recorded: refused naming each difference, unless `data.prepare_overwrite`, which
  writes a new corpus beside it (in a directory named by the new record) and removes the old one after the new
  manifest commits; or, for the embedded corpus (its input is the workdir's own copy), an unrecorded one is kept
  with a warning. Then refuses input too small to pretrain on (`shards.check_enough_documents`)."""
  if data_config.tfds_name:  # Before TFDS builds anything.
    _check_reader_share(data_config, data_config.num_shards)
  tokenizer = load_tokenizer(**tokenizer_args)
  identity = tokenizer.identity()
  units, record = work_units(data_config, identity["sha256"])
  planned = Plan(tokenizer, units, record)
  (found, unreadable), shard_dir = _found_manifest(output_dir), ""
  if found is not None or unreadable:
    if unreadable:
      differences = [unreadable]
    elif "input" in found:
      differences = input_record.differences(found, record, identity)
    elif data_config.embedded_corpus and not data_config.prepare_overwrite:
      logging.warning(
        "%s was prepared before inputs were recorded: kept as it is (the embedded corpus's input is the workdir's own "
        "copy). data.prepare_overwrite=True rebuilds it with its record.",
        output_dir,
      )
      return dataclasses.replace(planned, kept=found)
    else:
      differences = ["its manifest records no input (prepared by an older bert_jax), so it cannot be compared"]
    if not differences and _whole(output_dir, found):
      logging.info("%s is already prepared from this input, with these settings and this tokenizer.", output_dir)
      return dataclasses.replace(planned, kept=found)
    if not differences:
      shard_dir = os.path.dirname(found["shards"][0]["file"])  # Resumes where the corpus is.
    elif not data_config.prepare_overwrite:
      raise ValueError(
        f"{output_dir} holds a corpus prepared from something else: {'; '.join(differences)}. Nothing was written. "
        "Prepare into a new data.prepared_dir, or set data.prepare_overwrite=True to replace it (it stays readable "
        "until the new corpus is complete)."
      )
    else:
      logging.warning("Replacing the corpus in %s: %s.", output_dir, "; ".join(differences))
      name = json.dumps(dict(input=record, tokenizer={k: v for k, v in identity.items() if k != "path"}))
      shard_dir = "corpus-" + hashlib.sha256(name.encode()).hexdigest()[:12]
      planned.replaced = found
  place(units, output_dir, shard_dir)
  if not data_config.tfds_name:
    _check_reader_share(data_config, len(units))
  named = f"data.tfds_name={data_config.tfds_name!r}" if data_config.tfds_name else ""
  shards.check_enough_documents(units, tokenizer, named or f"data.input_pattern={data_config.input_pattern!r}")
  return planned


RUNNERS = ("local", "beam")


def check_runner(data_config) -> None:
  """Refuses `data.prepare_runner` other than `RUNNERS`, and for "beam" a missing Apache Beam, Beam options it does
  not know or a runner it cannot create: before any work."""
  if data_config.prepare_runner not in RUNNERS:
    raise ValueError(f"data.prepare_runner={data_config.prepare_runner!r}; expected one of {RUNNERS}.")
  if data_config.prepare_runner == "beam":
    beam_flags.check_runner(beam_flags.pipeline_options(data_config.beam_options))


def _check_reader_share(data_config, num_shards: int) -> None:
  """With the run's reader count known (`data.num_readers`), the shards should divide over the readers
  (`readers.uneven_share`). A TFDS split's count is a setting, `data.num_shards`: an uneven one is refused, naming
  the counts that divide. Files are cut by size: an uneven count is a warning naming `data.prepare_unit_bytes`."""
  uneven = readers.uneven_share(num_shards, data_config.num_readers) if data_config.num_readers else ""
  if not uneven:
    return
  if data_config.tfds_name:
    below = num_shards - num_shards % data_config.num_readers
    raise ValueError(
      f"data.num_shards={num_shards}: {uneven}. Expected a multiple of data.num_readers (e.g. "
      f"{below or data_config.num_readers} or {below + data_config.num_readers}), or a divisor of it. Nothing was "
      "written."
    )
  logging.warning(
    "%s. data.prepare_unit_bytes=%d sets the count (one shard per that many bytes of each file).",
    uneven,
    data_config.prepare_unit_bytes,
  )


def prepare(data_config, tokenizer_args: dict, output_dir: str, num_workers: int | None = None) -> dict:
  """Prepares `output_dir` as `plan_preparation` decides, with `data.prepare_runner`; returns its manifest (the one
  kept, or the one written)."""
  check_runner(data_config)
  planned = plan_preparation(data_config, tokenizer_args, output_dir)
  if planned.kept is not None:
    return planned.kept
  return write(planned, tokenizer_args, output_dir, num_workers, data_config.prepare_runner, data_config.beam_options)


def write(
  plan: Plan,
  tokenizer_args: dict,
  output_dir: str,
  num_workers: int | None = None,
  runner: str = "local",
  beam_options: str = "",
) -> dict:
  """Carries out `plan` (with nothing kept): every shard not already written, by this machine's processes (`runner`
  "local") or a Beam pipeline run with `beam_options` ("beam", `prepare_beam`), then here the manifest (the commit),
  then the removal of the corpus it replaces. Returns the manifest. A failure leaves the shards already whole (a re-run
  keeps them), and no directory this call created and left empty (a Beam runner that could not start)."""
  shard_dir = epath.Path(plan.units[0]["output"]).parent
  created = [path for path in (shard_dir.parent, shard_dir) if not path.exists()]
  shard_dir.mkdir(parents=True, exist_ok=True)
  start = time.perf_counter()
  try:
    if runner == "beam":
      from bert_jax.data import prepare_beam

      results = prepare_beam.write_shards(plan.units, tokenizer_args, beam_options)
    else:
      results = _write_shards(plan.units, tokenizer_args, output_dir, num_workers)
  except BaseException:
    for directory in reversed(created):  # The innermost first.
      if directory.exists() and not any(directory.iterdir()):
        directory.rmdir()
    raise
  return _commit(plan, results, output_dir, start)


def _write_shards(units: list[dict], tokenizer_args: dict, output_dir: str, num_workers: int | None) -> list[dict]:
  """Writes every unit's shards not already written, over this machine's processes; returns their statistics."""
  if not num_workers:  # A core each, but no more than one per WORKER_BYTES of text: a worker takes seconds to start.
    text_bytes = sum(unit["file_bytes"] for unit in units if unit.get("index") == 0)  # 0 for TFDS.
    num_workers = min(os.cpu_count() or 1, max(1, round(text_bytes / WORKER_BYTES)) if text_bytes else len(units))
  num_workers = min(num_workers, len(units))
  logging.info("Preparing %d shard(s) into %s with %d worker(s).", len(units), output_dir, num_workers)
  start, done, results = time.perf_counter(), 0, []
  if num_workers == 1:
    shards.init_worker(tokenizer_args)
    iterator = map(shards.write_shard, units)
  else:
    pool = multiprocessing.get_context("spawn").Pool(num_workers, shards.init_worker, (tokenizer_args, True))
    iterator = pool.imap(shards.write_shard, units)
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
  return results


def _commit(plan: Plan, results: list[dict], output_dir: str, start: float) -> dict:
  """After every shard is written: the hold-out minimum, the manifest (the commit: readers now read the new corpus),
  then the removal of the corpus it replaces. Returns the manifest."""
  tokenizer, settings = plan.tokenizer, plan.record["settings"]
  shards.hold_out_minimum(results, output_dir, settings["eval_min_documents"])
  totals = {key: sum(r[key] for r in results) for key in dataclasses.asdict(shards.ShardStats())}
  held_out = [r["eval"] for r in results if r["eval"]["documents"]]
  train_counts, eval_counts = (
    np.sum([part["token_counts"] for part in parts], axis=0) for parts in (results, [r["eval"] for r in results])
  )
  manifest = dict(
    tokenizer=tokenizer.identity(),
    vocab_size=tokenizer.vocab_size,
    **totals,
    shards=[{k: r[k] for k in SHARD_KEYS} for r in results],
    # The evaluation split: documents no training shard holds (see `shards.document_place`); empty shards not listed.
    eval_fraction=settings["eval_fraction"],
    eval_min_documents=settings["eval_min_documents"],
    eval_documents=sum(part["documents"] for part in held_out),
    eval_tokens=sum(part["tokens"] for part in held_out),
    eval_shards=[{k: part[k] for k in SHARD_KEYS} for part in held_out],
    # The score of plain token frequencies on the evaluation split (none without one).
    unigram=shards.unigram_baseline(train_counts, eval_counts) if held_out else None,
    # What the corpus was made from (`input_record`), compared by a re-run; the tokenizer above.
    input=plan.record,
  )
  write_manifest(output_dir, manifest)  # The commit: readers now read the new corpus.
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
  if plan.replaced:
    _remove(output_dir, plan.replaced)
  return manifest


def _remove(output_dir: str, manifest: dict) -> None:
  """Removes a replaced corpus's files: the shards its manifest lists, their evaluation shards and statistics, and
  their directory when it is one of its own and left empty. Nothing else in `output_dir` is touched."""
  for shard in manifest["shards"]:
    for name in (shard["file"], shard["file"] + ".stats.json", shards.eval_file(shard["file"])):
      if epath.Path(output_dir, name).exists():
        epath.Path(output_dir, name).unlink()
  directory = epath.Path(output_dir, os.path.dirname(manifest["shards"][0]["file"]))
  if paths.is_local(directory) and directory != epath.Path(output_dir) and not any(directory.iterdir()):
    directory.rmdir()
  logging.info("Removed the replaced corpus's %d shard(s) from %s.", len(manifest["shards"]), output_dir)


def prepare_for_run(config, workdir: str) -> tuple[str, str]:
  """--mode=prepare, and the embedded corpus on first use: the text, the tokenizer (a vocabulary of tokenizer.kind
  is trained when its file is missing: tokenizer/training.py), then the shards. Returns (tokenizer path, prepared
  dir)."""
  tokenizer_path, prepared_dir = paths_for_run(config, workdir)
  data = config.data
  check_runner(data)
  if data.embedded_corpus and config.tokenizer.path and not epath.Path(config.tokenizer.path).exists():
    # The embedded corpus trains its vocabulary inside the workdir only; a named file that is not there is a typo.
    raise FileNotFoundError(
      f"tokenizer.path={config.tokenizer.path!r} does not exist. With data.embedded_corpus, leave tokenizer.path "
      "empty to train a vocabulary in the workdir, or name an existing tokenizer file."
    )
  if data.embedded_corpus:
    corpus = os.path.join(workdir, "corpus", "python_docs.txt")
    if not epath.Path(corpus).exists():
      with paths.writing(epath.Path(corpus).parent):
        epath.Path(corpus).parent.mkdir(parents=True, exist_ok=True)
      paths.write_text(corpus, text.python_docs_text())
    data = ml_collections.ConfigDict(data.to_dict())
    data.update(input_pattern=corpus, input_format="bert", tfds_name="")
  if not epath.Path(tokenizer_path).exists():
    from bert_jax.data.vocabulary import train_vocabulary

    train_vocabulary(config, data, tokenizer_path)
  tokenizer_args = dict(kind=config.tokenizer.kind, path=tokenizer_path, lower_case=config.tokenizer.lower_case)
  planned = plan_preparation(data, tokenizer_args, prepared_dir)
  if planned.kept is None:
    write(planned, tokenizer_args, prepared_dir, runner=data.prepare_runner, beam_options=data.beam_options)
  return tokenizer_path, prepared_dir
