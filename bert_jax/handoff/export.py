"""Exports (`--mode=export`): what a pretraining team publishes, in bert_jax's own format or the world's.

`export(source, directory, format)` reads any source `bert_jax.handoff.pretrained.load` reads (by default the run's
workdir) and writes one of:

* `bundle`: complete on its own. `params/` (Orbax, parameters only, unrolled layers), `bert_config.json` (the
  original BERT field names), the tokenizer file itself (`vocab.txt`, `tokenizer.model` or a byte-level BPE's
  `tokenizer.json`), and
  `manifest.json`: provenance (source, step, examples and tokens seen, final train/eval metrics), versions,
  parameter count, and the SHA-256 of every file (`verify_bundle` checks them). `write_bundle` writes a bundle of
  parameters made elsewhere (`--mode=merge`'s mean) the same way, its manifest saying what it was made from.
* `huggingface`: `model.safetensors`, `config.json`, and the tokenizer as hf_tokenizer.py writes it (`vocab.txt`,
  a SentencePiece `spm.model` or `spiece.model`, or a byte-level BPE's `vocab.json` + `merges.txt`, with
  `tokenizer_config.json` and `special_tokens_map.json`: `AutoTokenizer` gives bert_jax's ids), which `transformers`'
  `BertForPreTraining` / `AutoModel.from_pretrained` load; a RoBERTa is a `RobertaForMaskedLM`
  (no pooler, no sentence head), an ALBERT an `AlbertForPreTraining` (hf_names.py), and an encoder without heads the
  family's bare model (`BertModel`, ...). An ELECTRA run's discriminator is an `ElectraForPreTraining`, and its
  generator an `ElectraForMaskedLM` directory of its own in `generator/` (as google/electra-*-{discriminator,
  generator} publish them), which `pretrained.load` reads back with the discriminator.
* `google`: `bert_model.ckpt.{index,data-00000-of-00001}` with the original TF1 variable names,
  `bert_config.json` and `vocab.txt`, as google-research/bert publishes.
* `sentence-transformers`: the `huggingface` files, with the sentence-transformers modules around them
  (sentence_transformers.py: `modules.json` written last, the Pooling and Normalize modules, the prompts, the longest
  input), which `SentenceTransformer(directory)` loads and whose embeddings are bert_jax's. How it embeds is
  `config.embedding` (`embedding`) where set, else what the source records (`Pretrained.embedding`), else the defaults
  (model/sentence_embedding.py); its longest input the source's, else the model's positions.

A fine-tuned model (a fine-tuning workdir exports its `best/` member) keeps its head: the bundle's manifest
records its `task`, and the Hugging Face directory is transformers' task model (`architectures`, `id2label`,
`finetuning_task`, `problem_type` in config.json; no pooler for BERT's token and span heads, as transformers has
none): a BERT's or a ModernBERT's (model/heads.py). The google format has no place for a head and refuses it.

Writes are atomic for readers. Locally, everything is written into `export/` of a partial directory beside the
target, `.<name>.partial-<8 hex digits>/`, then renamed into place. On `gs://`, which has no directory rename, the
file that makes the directory a model to every reader (`manifest.json`, `config.json`, `bert_config.json`) is written
last and removed first when an export is replaced. An existing export is never replaced unless `overwrite` is set.

An export that cannot finish leaves nothing behind and says so in one line:

* a write that fails (a full disk: ENOSPC) raises `ExportError` naming the target, the path being written and the
  cause (a bundle's Orbax save too: tensorstore's error is read for its system error code); SIGTERM raises
  `ExportStopped` (a BaseException, as KeyboardInterrupt is, so that no `except Exception` on the way swallows it).
  Either way the partial directory (on gs://, the target's partial files) is removed before the error is raised, and
  the message says so. `--mode=export` prints the line and exits 1 (`ExportError`) or 143
  (`ExportStopped`: 128 + SIGTERM's number, what a shell reports for a process that SIGTERM ended, so a scheduler
  still sees a stop and not a failure of the export). A SIGTERM waits for a bundle's Orbax save to end (its threads
  would write on into a directory being removed), and for the rename of a finished export into place.
* A partial directory outlives only an export killed outright (SIGKILL, an out-of-memory kill, a lost machine). Its
  `LEASE` (workdir/lease.py: host, process, heartbeat every 30 s) says whose it is: the next export to the same
  target removes it when it can take that lease over, that is when its writer ran on this machine and its process is
  gone, or its heartbeat is older than `PARTIAL_TIMEOUT_SECONDS` (a writer on another machine sharing the storage,
  or a hung one). A partial directory without a LEASE (from an export older than this rule, or one created this
  instant) is removed only when nothing in it has changed for as long. Another export's live partial directory is
  never touched.
"""

import contextlib
import datetime
import functools
import importlib.metadata
import json
import os
import re
import time
import uuid

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from bert_jax import paths
from bert_jax.data.tokenizer import Tokenizer, bpe, file_sha256
from bert_jax.handoff import (
  export_errors,
  export_formats,
  formats,
  google_format,
  hf_configs,
  hf_format,
  hf_tokenizer,
  pretrained,
  sentence_transformers,
)
from bert_jax.handoff.export_errors import ExportStopped
from bert_jax.model.bert_config import to_bert_json
from bert_jax.model.electra import generator_as_masked_lm
from bert_jax.model.heads import HF_ARCHITECTURES, TaskHead
from bert_jax.model.sentence_embedding import Settings, settings
from bert_jax.workdir import checkpoints, lease, reading

FORMATS = export_formats.FORMATS
# The file whose presence makes a directory a model of each format (written last).
_COMMIT_FILE = {
  "bundle": formats.BUNDLE_MANIFEST,
  "huggingface": "config.json",
  "google": google_format.CONFIG,
  "sentence-transformers": sentence_transformers.MODULES,
}
_TOKENIZER_FILENAME = {"wordpiece": "vocab.txt", "sentencepiece": "tokenizer.model", "bpe": bpe.TOKENIZER_JSON}
# A byte-level BPE in a Google directory: RoBERTa's two files, which RobertaTokenizer reads.
_BPE_FILES = (bpe.VOCAB, bpe.MERGES)
# What each format's writer writes, or wrote in earlier versions (a bundle: the files its manifest lists, and the
# manifest): all that `export.overwrite` may replace.
_HF_FILES = {hf_format.SAFETENSORS, "config.json", *hf_tokenizer.FILES, *_TOKENIZER_FILENAME.values()}
_WRITTEN = {
  "huggingface": {*_HF_FILES, *(f"{formats.GENERATOR}/{name}" for name in _HF_FILES)},
  "google": {
    *(f"{google_format.CHECKPOINT}.{end}" for end in ("index", "data-00000-of-00001")),
    google_format.CONFIG,
    *_TOKENIZER_FILENAME.values(),
    *_BPE_FILES,
  },
}
_WRITTEN["sentence-transformers"] = {*_WRITTEN["huggingface"], *sentence_transformers.WRITTEN}
# How long a partial directory's writer may stay silent before another export to its target takes it for dead.
PARTIAL_TIMEOUT_SECONDS = 300.0
_STAGED = "export"  # The folder of a partial directory that becomes the target.


def _write(path: epath.Path, content: bytes | str) -> None:
  with export_errors.writing(path):
    if isinstance(content, str):
      path.write_text(content)
    else:
      path.write_bytes(content)


def _file_hashes(directory: epath.Path) -> dict[str, str]:
  """Relative path -> SHA-256 of every file under `directory`."""
  return {str(path.relative_to(directory)): file_sha256(path) for path in paths.files(directory)}


def _versions() -> dict:
  return {
    package: importlib.metadata.version(package) for package in ("bert_jax", "jax", "flax", "orbax-checkpoint", "numpy")
  }


def _write_tokenizer(tokenizer: Tokenizer, directory: epath.Path, format: str) -> list[str]:
  """Writes the tokenizer into `directory` as `format` keeps it; returns the names of the files. A bundle holds its
  one file (`vocab.txt`, `tokenizer.model`, a byte-level BPE's `tokenizer.json`); a Google directory a BPE's
  `vocab.json` + `merges.txt` instead; a Hugging Face one what hf_tokenizer.py writes for transformers."""
  if format == "huggingface":
    files = hf_tokenizer.files(tokenizer)
  elif format == "google" and tokenizer.kind == "bpe":
    files = tokenizer.vocab_merges_files()
  else:
    files = {_TOKENIZER_FILENAME[tokenizer.kind]: tokenizer.file_content()}
  for name, content in files.items():
    _write(directory / name, content)
  return list(files)


def _history(source: formats.Source) -> dict:
  """What the source records of its training: a checkpoint's history item, a bundle's manifest."""
  if source.format == "workdir":
    with checkpoints.reader(epath.Path(source.path).parent) as manager:
      return reading.read_history(manager, source.step)
  if source.format == "bundle":
    return source.info.get("history", {})
  return {}


def _write_bundle(loaded: pretrained.Pretrained, directory: epath.Path, merge: dict | None = None) -> None:
  """`loaded` as a bundle in `directory`; `merge`: what a merge made it from (`--mode=merge`), in its manifest."""
  params = jax.device_get(loaded.params)
  with export_errors.writing(directory / "params"), export_errors.storage_errors_as_os_errors(directory / "params"):
    with export_errors.sigterm_deferred(), ocp.StandardCheckpointer() as checkpointer:
      checkpointer.save(directory / "params", params)
  _write(directory / google_format.CONFIG, json.dumps(to_bert_json(loaded.config), indent=2))
  (filename,) = _write_tokenizer(loaded.tokenizer, directory, "bundle")
  source = loaded.source
  manifest = {
    "format": formats.BUNDLE_FORMAT,
    "version": 1,
    "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    "source": {"path": source.path, "format": source.format, "step": source.step},
    "history": _history(source),
    "parameters": int(sum(np.prod(x.shape) for x in jax.tree.leaves(params))),
    "heads": sorted(name for name in params if name != "bert"),
    "task": None if loaded.task is None else loaded.task.to_json(),
    "generator": None if loaded.source.generator is None else to_bert_json(loaded.source.generator),
    "tokenizer": dict(loaded.tokenizer.identity(), filename=filename),
    "versions": _versions(),
    **({"merge": merge} if merge is not None else {}),
    "files": _file_hashes(directory),
  }
  manifest["tokenizer"].pop("path")
  _write(directory / formats.BUNDLE_MANIFEST, json.dumps(manifest, indent=2))


def _hf_task_config(task: TaskHead, model_type: str) -> dict:
  """config.json fields of transformers' task model for `task` in the family `model_type`: its class, labels and
  problem type."""
  labels = task.labels or tuple(f"LABEL_{i}" for i in range(task.num_labels if task.head != "choice" else 2))
  fields = dict(
    architectures=[HF_ARCHITECTURES[model_type][task.head]],
    finetuning_task=task.task,
    id2label={str(i): label for i, label in enumerate(labels)},
    label2id={label: i for i, label in enumerate(labels)},
  )
  if task.head in ("classification", "regression"):
    fields["problem_type"] = "regression" if task.head == "regression" else "single_label_classification"
  return fields


def _write_huggingface(loaded: pretrained.Pretrained, directory: epath.Path) -> None:
  params = jax.device_get(loaded.params)
  if "generator" in params:  # ELECTRA: the generator is a model of its own, in a directory of its own.
    (directory / formats.GENERATOR).mkdir()
    generator = generator_as_masked_lm(params)
    _write_hf_model(loaded, generator, loaded.source.generator, directory / formats.GENERATOR)
  _write_hf_model(loaded, params, loaded.config, directory)


def _write_hf_model(loaded: pretrained.Pretrained, params: dict, model_cfg, directory: epath.Path) -> None:
  """`params` of `model_cfg` as a Hugging Face model directory, with `loaded`'s tokenizer and task."""
  tensors = hf_format.hf_from_params(params, model_cfg)
  task = loaded.task
  if task is not None and task.head in ("span", "token"):  # transformers' models of these heads have no pooler.
    tensors = {name: value for name, value in tensors.items() if not name.startswith("bert.pooler.")}
  with export_errors.writing(directory / hf_format.SAFETENSORS):
    hf_format.save_safetensors(tensors, directory / hf_format.SAFETENSORS)
  _write_tokenizer(loaded.tokenizer, directory, "huggingface")
  config = hf_configs.hf_config(model_cfg, hf_format.architecture(params, model_cfg), loaded.tokenizer)
  if task is not None and task.head != "embedding":  # An embedding model is the bare encoder (its own model class).
    config.update(_hf_task_config(task, model_cfg.model_type))
  _write(directory / "config.json", json.dumps(dict(config, torch_dtype="float32"), indent=2))


def _write_google(loaded: pretrained.Pretrained, directory: epath.Path) -> None:
  tensors = hf_format.hf_from_params(jax.device_get(loaded.params), loaded.config)
  with export_errors.writing(directory / google_format.CHECKPOINT):
    google_format.write_checkpoint(tensors, directory)
  _write_tokenizer(loaded.tokenizer, directory, "google")
  _write(directory / google_format.CONFIG, json.dumps(to_bert_json(loaded.config), indent=2))


def _write_sentence_transformers(loaded: pretrained.Pretrained, directory: epath.Path, embedding: Settings) -> None:
  """The Hugging Face export in `directory`, made a sentence-transformers model that embeds by `embedding`
  (modules.json last)."""
  _write_huggingface(loaded, directory)
  config, tokenizer = loaded.config, loaded.tokenizer
  files = sentence_transformers.files(
    embedding,
    config.hidden_size,
    embedding.max_seq_length or config.max_sequence_length,
    do_lower_case=tokenizer.kind == "wordpiece" and tokenizer.lower_case,
  )
  (directory / sentence_transformers.POOLING_DIR).mkdir()
  if embedding.normalized:
    (directory / sentence_transformers.NORMALIZE_DIR).mkdir()  # As sentence-transformers saves it: empty.
  for name, content in files.items():  # modules.json last.
    _write(directory / name, content)


_WRITERS = {"bundle": _write_bundle, "huggingface": _write_huggingface, "google": _write_google}


def _check_target(source: str, resolved: str, target: epath.Path, overwrite: bool) -> str | None:
  """Refuses a target that overlaps the source, or that holds anything but an export it may replace; returns
  the format of the export it will replace, if any."""
  for path in (source, resolved):
    if paths.overlaps(path, target):
      raise ValueError(f"export.dir={target} overlaps the source {path}: write the export somewhere else.")
  if not target.exists() or not any(target.iterdir()):
    return None
  if not overwrite:
    raise FileExistsError(f"{target} exists and is not empty; set export.overwrite=True to replace it.")
  try:
    existing = formats.read_source(target)
  except (FileNotFoundError, ValueError) as error:
    raise ValueError(f"export.overwrite: {target} is not an export ({error}); refusing to replace it.") from None
  if existing.format == "workdir":
    raise ValueError(f"export.overwrite: {target} is a pretraining workdir, not an export; refusing to replace it.")
  if existing.format == "bundle":
    written = {*existing.info.get("files", {}), formats.BUNDLE_MANIFEST}
  else:
    written = _WRITTEN[existing.format]
  others = [name for path in paths.files(target) if (name := str(path.relative_to(target))) not in written]
  if others:
    raise ValueError(
      f"export.overwrite: {target} holds {others[:8]}, which no {existing.format} export writes; refusing to replace "
      "it (move those files out first)."
    )
  return existing.format


def export(source: str, directory: str, format: str = "bundle", overwrite: bool = False, embedding=None) -> str:
  """Writes `source` (any `pretrained.load` source) to `directory` in `format`; returns the directory.

  `embedding` (`config.embedding`: pooling, normalize, prompts, each None for the source's) is how a
  sentence-transformers export embeds; None: the source's settings, else the defaults.

  An existing export in `directory` is replaced only with `overwrite`; anything else there (a workdir, other
  files), or a `directory` that is, contains or lies inside the source, is refused before anything is written. A
  failed write raises `ExportError`, SIGTERM `ExportStopped`, each with nothing left behind (the module docstring).
  """
  if format not in FORMATS:
    raise ValueError(f"export.format={format!r}; expected one of {FORMATS}.")
  if not directory:
    raise ValueError("export.dir is empty: name the directory to write (local or gs://).")
  target = _target(directory)
  with export_errors.StopOnSigterm() as sigterm:
    try:
      replaced_format = _check_target(source, source, target, overwrite)
      loaded = pretrained.load(source)  # Checks the source before anything is written.
      _check_target(source, loaded.source.path, target, overwrite)
      _check_format(source, loaded, format)
      write = _WRITERS.get(format)
      if format == "sentence-transformers":  # Settings checked before anything is written.
        chosen = settings(embedding, loaded.embedding) if embedding is not None else loaded.embedding or Settings()
        write = functools.partial(_write_sentence_transformers, embedding=chosen)
      _write_into(loaded, target, write, replaced_format, sigterm)
    except export_errors.Sigterm:  # Before writing began (while writing, the writers name what they leave).
      raise ExportStopped(f"Export to {target} stopped by SIGTERM before it began writing.") from None
    if sigterm.received:
      logging.warning("SIGTERM arrived while the export was renamed into place; %s is complete.", target)
  logging.info("Exported %s (%s) to %s as %s.", source, loaded.source.format, target, format)
  return str(target)


def _target(directory: str) -> epath.Path:
  """The directory an export writes: absolute; locally, through a symlink, the directory it names (checked,
  replaced and written)."""
  target = paths.absolute(directory)
  return epath.Path(os.path.realpath(target)) if paths.is_local(target) else target


def check_new_target(directory: str, sources, key: str) -> epath.Path:
  """The target of a bundle made from `sources` (paths) rather than exported from one (`--mode=merge`): refused,
  naming `key` (the config key that names it), if it exists other than as an empty directory, or is, contains or
  lies inside a source. Returns it as `_target` does."""
  target = _target(directory)
  for source in sources:
    if paths.overlaps(source, target):
      raise ValueError(f"{key}={target} overlaps the source {source}: write the bundle somewhere else.")
  if target.exists() and (not target.is_dir() or any(target.iterdir())):
    raise FileExistsError(f"{key}={target} exists; it is never replaced: name a new directory.")
  return target


def write_bundle(loaded: pretrained.Pretrained, directory: str, sources, key: str, merge: dict) -> str:
  """`loaded` (parameters made here, not read from one source: `--mode=merge`'s mean) written as a bundle in
  `directory`, whose manifest records `merge` (what it was made from); all or nothing, as `export` writes (the module
  docstring). `directory` is refused as `check_new_target(directory, sources, key)` refuses it; returns it."""
  target = check_new_target(directory, sources, key)
  with export_errors.StopOnSigterm() as sigterm:
    try:
      _write_into(loaded, target, functools.partial(_write_bundle, merge=merge), None, sigterm)
    except export_errors.Sigterm:  # Before writing began (while writing, the writers name what they leave).
      raise ExportStopped(f"Writing {target} stopped by SIGTERM before it began.") from None
  logging.info("Wrote the bundle %s.", target)
  return str(target)


def _write_into(loaded: pretrained.Pretrained, target: epath.Path, write, replaced_format, sigterm) -> None:
  """`write(loaded, directory)` made `target`, all or nothing: locally in a partial directory renamed into place, on
  gs:// with the commit file last (the module docstring); `replaced_format`: the format of the export it replaces."""
  if paths.is_local(target):
    _export_locally(loaded, target, write, sigterm)
  else:
    _export_to_gcs(loaded, target, write, replaced_format)


def _check_format(source: str, loaded: pretrained.Pretrained, format: str) -> None:
  """Refuses a model that `format` has no place for."""
  if format == "google" and loaded.config.model_type != "bert":
    raise ValueError(
      f"{source} is a {loaded.config.model_type} model; the google format is BERT's. Export it as bundle or "
      "huggingface."
    )
  if format == "google" and loaded.task is not None:
    raise ValueError(
      f"{source} is fine-tuned ({loaded.task.head} head for {loaded.task.task or 'a task'}); the google format has "
      "no place for its head. Export it as bundle or huggingface."
    )


def _export_locally(
  loaded: pretrained.Pretrained, target: epath.Path, write, sigterm: export_errors.StopOnSigterm
) -> None:
  """Writes into a partial directory beside `target`, then renames it into place: all or nothing."""
  _remove_dead_partials(target)
  partial = target.parent / f".{target.name}.partial-{uuid.uuid4().hex[:8]}"
  partial.mkdir(parents=True)
  held = lease.WorkdirLease(partial, PARTIAL_TIMEOUT_SECONDS)
  kept = "it still holds the export it held" if target.exists() else "nothing was written there"
  try:
    held.acquire()
    (partial / _STAGED).mkdir()
    write(loaded, partial / _STAGED)
    sigterm.hold()  # The rename into place, once begun, finishes.
    if target.exists():
      replaced = target.parent / f".{target.name}.replaced-{uuid.uuid4().hex[:8]}"
      target.rename(replaced)
      try:
        (partial / _STAGED).rename(target)
      except BaseException:
        replaced.rename(target)  # The old export back in place.
        raise
      replaced.rmtree()
    else:
      (partial / _STAGED).rename(target)
  except (export_errors.Sigterm, OSError) as error:
    sigterm.hold()  # Cleaning up, not to be cut short.
    held.release()
    raise export_errors.one_line(error, target, f"{kept}; {_removed(partial)}") from None
  finally:
    sigterm.hold()
    held.release()
    if partial.exists():
      partial.rmtree()


def _export_to_gcs(loaded: pretrained.Pretrained, target: epath.Path, write, replaced_format: str | None) -> None:
  """No rename on GCS: the commit file goes first when replacing and last when writing."""
  try:
    if replaced_format is not None:
      commit = target / _COMMIT_FILE[replaced_format]
      if commit.exists():
        commit.unlink()
    if target.exists():
      target.rmtree()
    target.mkdir(parents=True, exist_ok=True)
    write(loaded, target)
  except (export_errors.Sigterm, OSError) as error:
    raise export_errors.one_line(error, target, f"it holds no export ({_removed(target)})") from None


def _removed(directory: epath.Path) -> str:
  """Removes `directory`; says so, or why it could not."""
  try:
    if directory.exists():
      directory.rmtree()
    return f"the partial files in {directory} are removed"
  except OSError as error:
    return f"the partial files in {directory} could not be removed ({export_errors.cause(error)}): delete them"


def _remove_dead_partials(target: epath.Path) -> None:
  """Removes the partial directories of earlier exports to `target` that are provably dead (the module docstring)."""
  if not target.parent.exists():
    return
  pattern = re.compile(rf"\.{re.escape(target.name)}\.partial-[0-9a-f]{{8}}")
  for partial in target.parent.iterdir():
    if not pattern.fullmatch(partial.name) or not partial.is_dir():
      continue
    try:
      if (partial / lease.LEASE_NAME).exists():
        held = lease.WorkdirLease(partial, PARTIAL_TIMEOUT_SECONDS)
        try:
          held.acquire()  # Taken only from a writer that is dead, or silent past the timeout.
        except lease.LeaseHeldError:
          logging.info("Leaving %s alone: a live export is writing it.", partial)
          continue
        held.release()
      elif time.time() - _last_change(partial) < PARTIAL_TIMEOUT_SECONDS:
        continue
      partial.rmtree()
    except OSError as error:  # Not this export's to fail for.
      logging.warning("Could not remove %s, left by an earlier export: %s", partial, export_errors.cause(error))
      continue
    logging.warning("Removed %s, left by an export to %s that was killed before it finished.", partial, target)


def _last_change(directory: epath.Path) -> float:
  """The newest modification time of `directory` and anything in it (local)."""
  newest = os.stat(directory).st_mtime
  for root, names, files in os.walk(directory):
    for name in names + files:
      with contextlib.suppress(FileNotFoundError):
        newest = max(newest, os.lstat(os.path.join(root, name)).st_mtime)
  return newest


def verify_bundle(directory: str) -> dict:
  """Checks every file of a bundle against the SHA-256 in its manifest; returns the manifest. Raises ValueError
  naming each file that differs, is missing, or is not in the manifest."""
  manifest = formats.read_json(epath.Path(directory) / formats.BUNDLE_MANIFEST)
  formats.verify_bundle(directory, manifest)
  return manifest
