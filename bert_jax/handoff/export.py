"""Exports (`--mode=export`): what a pretraining team publishes, in bert_jax's own format or the world's.

`export(source, directory, format)` reads any source `bert_jax.handoff.pretrained.load` reads (by default the run's
workdir) and writes one of:

* `bundle`: complete on its own. `params/` (Orbax, parameters only, unrolled layers), `bert_config.json` (the
  original BERT field names), the tokenizer file itself (`vocab.txt`, `tokenizer.model` or a byte-level BPE's
  `tokenizer.json`), and
  `manifest.json`: provenance (source, step, examples and tokens seen, final train/eval metrics), versions,
  parameter count, and the SHA-256 of every file (`verify_bundle` checks them).
* `huggingface`: `model.safetensors`, `config.json`, `vocab.txt` + `tokenizer_config.json` (or the SentencePiece
  `tokenizer.model`; or a byte-level BPE's `vocab.json` + `merges.txt` + `tokenizer_config.json`, RobertaTokenizer),
  which `transformers`' `BertForPreTraining` / `AutoModel.from_pretrained` load; a RoBERTa is a `RobertaForMaskedLM`
  (no pooler, no sentence head), an ALBERT an `AlbertForPreTraining` (hf_names.py), and an encoder without heads the
  family's bare model (`BertModel`, ...). An ELECTRA run's discriminator is an `ElectraForPreTraining`, and its
  generator an `ElectraForMaskedLM` directory of its own in `generator/` (as google/electra-*-{discriminator,
  generator} publish them), which `pretrained.load` reads back with the discriminator.
* `google`: `bert_model.ckpt.{index,data-00000-of-00001}` with the original TF1 variable names,
  `bert_config.json` and `vocab.txt`, as google-research/bert publishes.

A fine-tuned model (a fine-tuning workdir exports its `best/` member) keeps its head: the bundle's manifest
records its `task`, and the Hugging Face directory is transformers' task model (`architectures`, `id2label`,
`finetuning_task`, `problem_type` in config.json; no pooler for token and span heads, as transformers has none).
The google format has no place for a head and refuses it.

Writes are atomic for readers. Locally, everything is written to a sibling staging directory that is renamed
into place. On `gs://`, which has no directory rename, the file that makes the directory a model to every
reader (`manifest.json`, `config.json`, `bert_config.json`) is written last and removed first when an export is
replaced. An existing export is never replaced unless `overwrite` is set.
"""

import datetime
import importlib.metadata
import json
import os
import uuid

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from bert_jax import config_checks, paths
from bert_jax.data.tokenizer import Tokenizer, bpe, file_sha256
from bert_jax.handoff import formats, google_format, hf_configs, hf_format, pretrained
from bert_jax.model.bert_config import to_bert_json
from bert_jax.model.electra import generator_as_masked_lm
from bert_jax.model.heads import HF_ARCHITECTURES, TaskHead
from bert_jax.workdir import checkpoints, verified

FORMATS = config_checks.EXPORT_FORMATS
# The file whose presence makes a directory a model of each format (written last).
_COMMIT_FILE = {"bundle": formats.BUNDLE_MANIFEST, "huggingface": "config.json", "google": google_format.CONFIG}
_TOKENIZER_FILENAME = {"wordpiece": "vocab.txt", "sentencepiece": "tokenizer.model", "bpe": bpe.TOKENIZER_JSON}
# A byte-level BPE in a Hugging Face or Google directory: RoBERTa's two files, which RobertaTokenizer reads.
_BPE_FILES = (bpe.VOCAB, bpe.MERGES)
# What each format's writer writes (a bundle: the files its manifest lists, and the manifest): all that
# `export.overwrite` may replace.
_HF_FILES = {hf_format.SAFETENSORS, "config.json", "tokenizer_config.json", *_TOKENIZER_FILENAME.values(), *_BPE_FILES}
_WRITTEN = {
  "huggingface": {*_HF_FILES, *(f"{formats.GENERATOR}/{name}" for name in _HF_FILES)},
  "google": {
    *(f"{google_format.CHECKPOINT}.{end}" for end in ("index", "data-00000-of-00001")),
    google_format.CONFIG,
    *_TOKENIZER_FILENAME.values(),
    *_BPE_FILES,
  },
}
# tokenizer_config.json of a Hugging Face export: the transformers tokenizer that reads the files written.
_HF_TOKENIZER_CLASS = {"wordpiece": "BertTokenizer", "bpe": "RobertaTokenizer"}


def _file_hashes(directory: epath.Path) -> dict[str, str]:
  """Relative path -> SHA-256 of every file under `directory`."""
  return {str(path.relative_to(directory)): file_sha256(path) for path in paths.files(directory)}


def _versions() -> dict:
  return {
    package: importlib.metadata.version(package) for package in ("bert_jax", "jax", "flax", "orbax-checkpoint", "numpy")
  }


def _write_tokenizer(tokenizer: Tokenizer, directory: epath.Path, format: str) -> list[str]:
  """Writes the tokenizer into `directory` as `format` keeps it; returns the names of the tokenizer files. A bundle
  holds its one file (`vocab.txt`, `tokenizer.model`, a byte-level BPE's `tokenizer.json`); a Hugging Face or Google
  directory a BPE's `vocab.json` + `merges.txt` instead, and a Hugging Face one `tokenizer_config.json` too, naming
  the transformers tokenizer that reads them."""
  if format != "bundle" and tokenizer.kind == "bpe":
    files = tokenizer.vocab_merges_files()
  else:
    files = {_TOKENIZER_FILENAME[tokenizer.kind]: tokenizer.file_content()}
  for name, content in files.items():
    (directory / name).write_bytes(content)
  if format == "huggingface" and tokenizer.kind in _HF_TOKENIZER_CLASS:
    tokenizer_config = {"tokenizer_class": _HF_TOKENIZER_CLASS[tokenizer.kind]}
    if tokenizer.kind == "wordpiece":
      tokenizer_config["do_lower_case"] = tokenizer.lower_case
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
  return list(files)


def _history(source: formats.Source) -> dict:
  """What the source records of its training: a checkpoint's history item, a bundle's manifest."""
  if source.format == "workdir":
    with checkpoints.reader(epath.Path(source.path).parent) as manager:
      return verified.read_history(manager, source.step)
  if source.format == "bundle":
    return source.info.get("history", {})
  return {}


def _write_bundle(loaded: pretrained.Pretrained, directory: epath.Path) -> None:
  params = jax.device_get(loaded.params)
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(directory / "params", params)
  (directory / google_format.CONFIG).write_text(json.dumps(to_bert_json(loaded.config), indent=2))
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
    "files": _file_hashes(directory),
  }
  manifest["tokenizer"].pop("path")
  (directory / formats.BUNDLE_MANIFEST).write_text(json.dumps(manifest, indent=2))


def _hf_task_config(task: TaskHead) -> dict:
  """config.json fields of transformers' task model for `task`: its class, labels and problem type."""
  labels = task.labels or tuple(f"LABEL_{i}" for i in range(task.num_labels if task.head != "choice" else 2))
  fields = dict(
    architectures=[HF_ARCHITECTURES[task.head]],
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
  hf_format.save_safetensors(tensors, directory / hf_format.SAFETENSORS)
  _write_tokenizer(loaded.tokenizer, directory, "huggingface")
  config = hf_configs.hf_config(model_cfg, hf_format.architecture(params, model_cfg))
  if task is not None:
    config.update(_hf_task_config(task))
  (directory / "config.json").write_text(json.dumps(dict(config, torch_dtype="float32"), indent=2))


def _write_google(loaded: pretrained.Pretrained, directory: epath.Path) -> None:
  tensors = hf_format.hf_from_params(jax.device_get(loaded.params), loaded.config)
  google_format.write_checkpoint(tensors, directory)
  _write_tokenizer(loaded.tokenizer, directory, "google")
  (directory / google_format.CONFIG).write_text(json.dumps(to_bert_json(loaded.config), indent=2))


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
    existing = formats.describe(target)
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


def export(source: str, directory: str, format: str = "bundle", overwrite: bool = False) -> str:
  """Writes `source` (any `pretrained.load` source) to `directory` in `format`; returns the directory.

  An existing export in `directory` is replaced only with `overwrite`; anything else there (a workdir, other
  files), or a `directory` that is, contains or lies inside the source, is refused before anything is written.
  """
  if format not in FORMATS:
    raise ValueError(f"export.format={format!r}; expected one of {FORMATS}.")
  if not directory:
    raise ValueError("export.dir is empty: name the directory to write (local or gs://).")
  target = paths.absolute(directory)
  if paths.is_local(target):  # Through a symlink: the directory it names is checked, replaced and written.
    target = epath.Path(os.path.realpath(target))
  replaced_format = _check_target(source, source, target, overwrite)
  loaded = pretrained.load(source)  # Checks the source before anything is written.
  _check_target(source, loaded.source.path, target, overwrite)
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
  if paths.is_local(target):  # Written beside the target, then renamed into place: all or nothing.
    staging = target.parent / f".{target.name}.partial-{uuid.uuid4().hex[:8]}"
    staging.mkdir(parents=True)
    try:
      _WRITERS[format](loaded, staging)
      if target.exists():
        replaced = target.parent / f".{target.name}.replaced-{uuid.uuid4().hex[:8]}"
        target.rename(replaced)
        try:
          staging.rename(target)
        except BaseException:
          replaced.rename(target)  # The old export back in place.
          raise
        replaced.rmtree()
      else:
        staging.rename(target)
    finally:
      if staging.exists():
        staging.rmtree()
  else:  # No rename on GCS: the commit file goes first when replacing and last when writing.
    if replaced_format is not None:
      commit = target / _COMMIT_FILE[replaced_format]
      if commit.exists():
        commit.unlink()
    if target.exists():
      target.rmtree()
    target.mkdir(parents=True, exist_ok=True)
    _WRITERS[format](loaded, target)
  logging.info("Exported %s (%s) to %s as %s.", source, loaded.source.format, target, format)
  return str(target)


def verify_bundle(directory: str) -> dict:
  """Checks every file of a bundle against the SHA-256 in its manifest; returns the manifest. Raises ValueError
  naming each file that differs, is missing, or is not in the manifest."""
  manifest = formats.read_json(epath.Path(directory) / formats.BUNDLE_MANIFEST)
  formats.verify_bundle(directory, manifest)
  return manifest
