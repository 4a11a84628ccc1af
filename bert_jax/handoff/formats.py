"""What a pretrained source holds, from its metadata alone (`read_source(path)` -> `Source`), for every format
`pretrained.load` reads (local paths or `gs://`), told apart by what the directory holds:

* a pretraining workdir (its newest committed checkpoint step), its `checkpoints/` directory, or one step
  directory `<workdir>/checkpoints/<step>`;
* a fine-tuning workdir: its `best/` checkpoint (the best sweep member), or `best/<step>` (an embeddings run's with
  the `Settings` it embedded by, `Source.embedding`);
* an export bundle (`manifest.json`, written last by `bert_jax.handoff.export`);
* a Hugging Face BERT, RoBERTa, ALBERT, ELECTRA or ModernBERT directory (hf_configs.py, hf_names.py): `config.json`
  + `model.safetensors` (or `pytorch_model.bin` with torch) + `vocab.txt` (or a SentencePiece `tokenizer.model` or
  `spiece.model`, or a byte-level BPE's `vocab.json` + `merges.txt`, or its `tokenizer.json` alone, as ModernBERT's);
* an original Google BERT directory: `bert_config.json` + `bert_model.ckpt.{index,data-*}` + `vocab.txt`;
* a sentence-transformers directory (`modules.json`): the Hugging Face model of its Transformer module, with the
  `Settings` of its pooling, normalisation, prompts and longest input (`Source.embedding`; sentence_transformers.py).

Everything that can be checked from metadata is checked here, before any parameter is read: that the path exists
and is a committed, complete source, its architecture, that it fits a config (`check_fits`) and was trained with a
tokenizer (`check_tokenizer`). Every error names the path and the mismatch.
"""

import dataclasses
import json

import numpy as np
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from bert_jax import paths
from bert_jax.data.tokenizer import bpe, file_sha256, tokenizer_sha256
from bert_jax.handoff import google_format, hf_configs, hf_format, hf_tokenizer, sentence_transformers
from bert_jax.model.bert_config import (
  ARCHITECTURE_FIELDS,
  SIZE_FIELDS,
  BertConfig,
  electra_generator,
  from_bert_json,
  from_fields,
)
from bert_jax.model.heads import HEADS, HF_ARCHITECTURES, TaskHead
from bert_jax.model.sentence_embedding import Settings
from bert_jax.workdir import checkpoints, checksums, reading

FORMATS = ("workdir", "bundle", "huggingface", "google", "sentence-transformers")
# The folder of a Hugging Face ELECTRA directory that holds its generator (an ElectraForMaskedLM directory).
GENERATOR = "generator"
BUNDLE_MANIFEST = "manifest.json"
BUNDLE_FORMAT = "bert_jax export bundle"


@dataclasses.dataclass(frozen=True)
class Source:
  """What a source holds, read from its metadata only (no parameters)."""

  format: str  # One of FORMATS.
  path: str  # The directory the parameters are read from (for a workdir: the step directory).
  config: BertConfig  # The architecture, in the source's layer layout.
  tokenizer_file: str | None  # The tokenizer file the source ships (None: trained on synthetic data).
  tokenizer_kind: str | None
  lower_case: bool
  recorded_sha256: str | None  # The hash the source recorded for its tokenizer (bert_jax sources).
  step: int | None = None  # The checkpoint step (workdirs and bundles).
  info: dict = dataclasses.field(default_factory=dict)  # A bundle's manifest; a step's config.
  task: TaskHead | None = None  # A fine-tuned model's head; None for a pretrained encoder (and its heads).
  # ELECTRA's generator (model/electra.py), when the source holds one beside the discriminator (`config`).
  generator: BertConfig | None = None
  # What the model was trained on, as the step (or the bundle's manifest) recorded it: examples and token positions
  # seen over every phase, the latest metrics (`train/pretraining_start.history`).
  history: dict = dataclasses.field(default_factory=dict)
  # ALBERT's text preprocessing flags for a SentencePiece tokenizer that asks for them (data/tokenizer/albert.py), as
  # the source records them (bert_jax sources) or its tokenizer_config.json sets them (hf_tokenizer.py).
  albert_preprocessing: dict | None = None
  # How the model embeds a sentence, as the source records it: a sentence-transformers directory's modules (the hook
  # for any source that records its settings); None when it records none.
  embedding: Settings | None = None


def _committed_step(path: epath.Path) -> tuple[epath.Path, int] | None:
  """(checkpoints directory, step) when `path` is a workdir, its `checkpoints/` or one step directory; None when
  it is none of these. Only steps that Orbax has committed count."""
  names = (checkpoints.CHECKPOINTS, checkpoints.BEST)
  if path.name.isdigit() and path.parent.name in names:
    directory, step = path.parent, int(path.name)
  elif path.name in names:
    directory, step = path, None
  elif (path / checkpoints.BEST).is_dir():  # A fine-tuning workdir: its best member, not the whole sweep.
    directory, step = path / checkpoints.BEST, None
  elif (path / checkpoints.CHECKPOINTS).is_dir():
    directory, step = path / checkpoints.CHECKPOINTS, None
  else:
    return None
  steps = checkpoints.committed_steps(directory)
  if step is None:
    if not steps:
      raise FileNotFoundError(f"{path} holds no committed checkpoint (expected {directory}/<step>).")
    # Every host reads the step process 0 saw newest, even if another one is committed meanwhile.
    return directory, int(multihost_utils.broadcast_one_to_all(np.int64(steps[-1])))
  if step not in steps:
    raise ValueError(
      f"{path} is not a committed checkpoint step (Orbax has not finalised it: a save still running or "
      f"interrupted); committed steps in {directory}: {steps or 'none'}."
    )
  return directory, step


def _checkpoint_source(path: epath.Path, directory: epath.Path, step: int) -> Source:
  step_dir = str(directory / str(step))
  with checkpoints.reader(directory) as manager:
    items = reading.items(manager, step)
    if not ({"params", "state"} & items and {"config", "data"} <= items):
      raise ValueError(
        f"{step_dir} lacks the params, config or data item of a checkpoint step; it has {sorted(items)}."
      )
    saved = reading.read_config(manager, step)
    tokenizer = reading.read_tokenizer(manager, step)
    recorded = reading.read_data_position(manager, step).get("tokenizer")
    history = reading.read_history(manager, step)
  task = None
  if saved.get("finetune", {}).get("task"):
    if directory.name != checkpoints.BEST:
      raise ValueError(
        f"{step_dir} is a fine-tuning checkpoint holding every member of its sweep; load the best one, "
        f"{directory.parent / checkpoints.BEST}."
      )
    task = _named(step_dir, lambda: TaskHead.from_json(history))
  config = _named(step_dir, lambda: from_fields(saved["model"]))
  # How a contrastive run's model embeds, as its best/ records it (finetune/embeddings.py's `record`).
  embedding = _named(step_dir, lambda: Settings(**history["embedding"])) if "embedding" in history else None
  generator = None
  if config.model_type == "electra" and task is None:
    generator = _named(step_dir, lambda: electra_generator(saved, config))
  if recorded is None:  # Trained on synthetic data: no tokenizer.
    return Source(
      "workdir",
      step_dir,
      config,
      None,
      None,
      True,
      None,
      step=step,
      info=saved,
      task=task,
      generator=generator,
      history=history,
      embedding=embedding,
    )
  if tokenizer is None:  # Written before checkpoints held the tokenizer file: the recorded path, if still there.
    tokenizer = dict(recorded, file=recorded["path"])
  return Source(
    "workdir",
    step_dir,
    config,
    tokenizer["file"],
    recorded["kind"],
    recorded.get("lower_case", True),
    recorded["sha256"],
    step=step,
    info=saved,
    task=task,
    generator=generator,
    history=history,
    albert_preprocessing=recorded.get("albert_preprocessing"),
    embedding=embedding,
  )


def _named(where, fn):
  """`fn()`, with any error in reading or checking `where`'s metadata raised as a ValueError that names it."""
  try:
    return fn()
  except (KeyError, TypeError, ValueError) as error:
    detail = f"lacks {error}" if isinstance(error, KeyError) else str(error)
    raise ValueError(f"{where}: {detail}") from None


def read_json(path: epath.Path) -> dict:
  return _named(path, lambda: json.loads(path.read_text()))


def _read_config(config_file: epath.Path) -> BertConfig:
  """The model config of a `bert_config.json` or Hugging Face `config.json` (by its `model_type`), checked as the
  user's is."""
  read = hf_configs.config_from_hf if config_file.name == "config.json" else from_bert_json
  return _named(config_file, lambda: read(read_json(config_file), str(config_file)))


def verify_bundle(directory, manifest: dict, part: str | None = None) -> None:
  """Checks the files of the bundle in `directory` (or of its `part`, a file or folder in it) against the SHA-256s
  its `manifest` records; raises ValueError naming each file that differs, is missing, or is not in the manifest.
  Each file is hashed once."""
  directory = epath.Path(directory)
  recorded = manifest.get("files")
  if not isinstance(recorded, dict):
    raise ValueError(f"{directory / BUNDLE_MANIFEST} records no file hashes ('files'); not a complete bundle manifest.")
  root = directory if part is None else directory / part
  found = paths.files(root) if root.is_dir() else [root] if root.exists() else []
  actual = sorted({str(path.relative_to(directory)) for path in found} - {BUNDLE_MANIFEST})
  inside = lambda name: part is None or name == part or name.startswith(f"{part}/")  # noqa: E731
  problems = [f"{name}: missing" for name in recorded if inside(name) and name not in actual]
  problems += [f"{name}: not in the manifest" for name in actual if name not in recorded]
  problems += [
    f"{name}: changed" for name in actual if name in recorded and file_sha256(directory / name) != recorded[name]
  ]
  if problems:
    raise ValueError(f"Bundle {directory} does not match its manifest: {problems}.")


def _bundle_source(path: epath.Path) -> Source:
  manifest_file = path / BUNDLE_MANIFEST
  manifest = read_json(manifest_file)
  if manifest.get("format") != BUNDLE_FORMAT:
    raise ValueError(f"{manifest_file} is not a bert_jax bundle manifest (format {manifest.get('format')!r}).")
  verify_bundle(path, manifest, google_format.CONFIG)  # Parameters are verified when read (_read_params).
  config = _read_config(path / google_format.CONFIG)
  tokenizer = manifest.get("tokenizer", {})
  return _named(
    manifest_file,
    lambda: Source(
      "bundle",
      str(path),
      config,
      str(path / tokenizer["filename"]),
      tokenizer["kind"],
      tokenizer.get("lower_case", True),
      tokenizer["sha256"],
      step=manifest["source"]["step"],
      info=manifest,
      task=TaskHead.from_json(manifest["task"]) if manifest.get("task") else None,
      generator=from_bert_json(manifest["generator"], str(manifest_file)) if manifest.get("generator") else None,
      history=manifest.get("history", {}),
      albert_preprocessing=tokenizer.get("albert_preprocessing"),
    ),
  )


def content(source: Source) -> dict:
  """What `source` holds, by content, the cheapest way it allows: a checkpoint step by its number and the SHA-256 of
  its `checksums` item (a hash of every array and item, verified whenever the step is read), a bundle by the SHA-256
  of the file hashes its manifest records (verified when read); a Hugging Face or Google directory, or a step older
  than checksums, by every file (`paths.fingerprint`, which reads every byte). Copies at other paths give the same;
  a source re-exported in another format does not."""
  if source.format == "workdir":
    with checkpoints.reader(epath.Path(source.path).parent) as manager:
      saved = reading.read_checksums(manager, source.step)
    if saved is not None:
      return dict(step=source.step, checksums=checksums.digest(saved))
  elif source.format == "bundle":
    return dict(manifest_files=checksums.digest(source.info["files"]))
  return paths.fingerprint(source.path)


def _vocab_is_uncased(vocab_file: epath.Path) -> bool:
  """A WordPiece vocabulary without upper-case pieces (besides [SPECIAL] ones) is an uncased one."""
  pieces = vocab_file.read_text().splitlines()
  return not any(p != p.lower() for p in pieces if not (p.startswith("[") and p.endswith("]")))


def _tokenizer_files(path: epath.Path, lower_case: bool | None, model_type: str) -> tuple[str, str, bool, dict | None]:
  """(file, kind, lower_case, albert_preprocessing) of the tokenizer in a Hugging Face or Google directory of a
  `model_type` model: BERT's `vocab.txt`, SentencePiece's `tokenizer.model` (ALBERT's `spiece.model`, DeBERTa's
  `spm.model`: hf_tokenizer.py), RoBERTa's `vocab.json` + `merges.txt`, else a byte-level BPE's `tokenizer.json`
  (ModernBERT's: the one file; a hub directory of the other kinds holds a tokenizer.json beside their own files)."""
  if (path / "vocab.txt").exists():
    if lower_case is None:
      tokenizer_config = path / "tokenizer_config.json"
      if tokenizer_config.exists() and "do_lower_case" in json.loads(tokenizer_config.read_text()):
        lower_case = bool(json.loads(tokenizer_config.read_text())["do_lower_case"])
      else:
        lower_case = _vocab_is_uncased(path / "vocab.txt")
    return str(path / "vocab.txt"), "wordpiece", lower_case, None
  for name in ("tokenizer.model", "spiece.model", "spm.model"):
    if (path / name).exists():
      return str(path / name), "sentencepiece", False, hf_tokenizer.sentencepiece_preprocessing(path / name, model_type)
  if (path / "vocab.json").exists() and (path / "merges.txt").exists():
    return str(path / "vocab.json"), "bpe", False, None
  if (path / bpe.TOKENIZER_JSON).exists():  # ModernBERT's byte-level BPE, in one file.
    return str(path / bpe.TOKENIZER_JSON), "bpe", False, None
  raise FileNotFoundError(
    f"{path} has no tokenizer: expected vocab.txt (WordPiece), tokenizer.model, spiece.model or spm.model "
    "(SentencePiece), or vocab.json and merges.txt, or a tokenizer.json (byte-level BPE)."
  )


def _foreign_source(path: epath.Path, fmt: str, lower_case: bool | None) -> Source:
  config_file = path / ("config.json" if fmt == "huggingface" else google_format.CONFIG)
  config = _read_config(config_file)
  if fmt == "google":
    google_format.checkpoint_prefix(path)  # Exactly one TF1 checkpoint.
  file, kind, lower_case, albert_preprocessing = _tokenizer_files(path, lower_case, config.model_type)
  task = _named(config_file, lambda: _hf_task(read_json(config_file))) if fmt == "huggingface" else None
  generator = None
  if config.model_type == "electra" and (path / GENERATOR / "config.json").exists():  # As hf_export writes it.
    generator = _read_config(path / GENERATOR / "config.json")
  return Source(
    fmt,
    str(path),
    config,
    file,
    kind,
    lower_case,
    None,
    task=task,
    generator=generator,
    albert_preprocessing=albert_preprocessing,
  )


def _sentence_transformers_source(path: epath.Path, lower_case: bool | None) -> Source:
  """The Hugging Face model of a sentence-transformers directory's Transformer module, with the directory's
  embedding settings; refuses a module bert_jax does not compute, and a model other than a Hugging Face one."""
  transformer_dir, settings, do_lower_case = sentence_transformers.read_settings(path)
  weights = (hf_format.SAFETENSORS, hf_format.SAFETENSORS_INDEX, hf_format.PYTORCH_BIN)
  if not ((transformer_dir / "config.json").exists() and any((transformer_dir / name).exists() for name in weights)):
    raise FileNotFoundError(
      f"{path}: its Transformer module's folder {transformer_dir} holds no Hugging Face model (config.json and "
      f"{' or '.join(weights)}); it holds {_describe_contents(transformer_dir)}."
    )
  source = _foreign_source(transformer_dir, "huggingface", lower_case)
  if do_lower_case and not (source.tokenizer_kind == "wordpiece" and source.lower_case):
    raise ValueError(
      f"{transformer_dir / sentence_transformers.TRANSFORMER_CONFIG}: do_lower_case=true lower-cases the text before "
      f"its {source.tokenizer_kind} tokenizer ({source.tokenizer_file}), which does not; bert_jax lower-cases only "
      "with an uncased WordPiece vocabulary."
    )
  if settings.max_seq_length > source.config.max_sequence_length:
    logging.info(
      "%s: max_seq_length %d is beyond the model's positions; %d (%s) is the longest input.",
      path,
      settings.max_seq_length,
      source.config.max_sequence_length,
      source.config.max_sequence_text,
    )
    settings = dataclasses.replace(settings, max_seq_length=source.config.max_sequence_length)
  return dataclasses.replace(source, format="sentence-transformers", embedding=settings, info=dict(directory=str(path)))


def _hf_task(config: dict) -> TaskHead | None:
  """The head of a Hugging Face BERT or ModernBERT task model's config.json (`architectures`, `id2label`,
  `problem_type`)."""
  architectures = config.get("architectures") or []
  classes = HF_ARCHITECTURES.get(config.get("model_type", "bert"), {})
  heads = [head for head in HEADS if classes.get(head) in architectures]
  if not heads:
    return None
  id2label = config.get("id2label") or {}
  labels = tuple(str(id2label[key]) for key in sorted(id2label, key=int))
  head = heads[0]
  if head == "classification" and (config.get("problem_type") == "regression" or len(labels) == 1):
    head = "regression"
  return TaskHead(config.get("finetuning_task") or "", head, labels if head in ("classification", "token") else ())


def _describe_contents(path: epath.Path) -> str:
  names = sorted(p.name for p in path.iterdir())
  return f"{names[:12]}{' ...' if len(names) > 12 else ''}"


def read_source(path, lower_case: bool | None = None) -> Source:
  """What `path` holds, from its metadata only. `lower_case` overrides the WordPiece casing of a Hugging Face or
  Google directory (default: `tokenizer_config.json`'s, else uncased when the vocabulary has no upper case)."""
  path = paths.absolute(path)
  if ".orbax-checkpoint-tmp" in path.name:
    raise ValueError(f"{path} is an uncommitted checkpoint directory (a save in progress or interrupted).")
  if not path.exists():
    raise FileNotFoundError(f"{path} does not exist.")
  if not path.is_dir():
    raise ValueError(f"{path} is a file; expected a workdir, checkpoint step, bundle, or model directory.")
  if (path / BUNDLE_MANIFEST).exists():
    return _bundle_source(path)
  if sentence_transformers.is_directory(path):
    return _sentence_transformers_source(path, lower_case)
  weights = (hf_format.SAFETENSORS, hf_format.SAFETENSORS_INDEX, hf_format.PYTORCH_BIN)
  if (path / "config.json").exists() and any((path / name).exists() for name in weights):
    return _foreign_source(path, "huggingface", lower_case)
  if google_format.is_google_dir(path):
    return _foreign_source(path, "google", lower_case)
  located = _committed_step(path)
  if located is not None:
    return _checkpoint_source(path, *located)
  if (path / "params").exists() or (path / google_format.CONFIG).exists():
    raise ValueError(f"{path} is an incomplete export bundle: it has no {BUNDLE_MANIFEST}, which is written last.")
  raise ValueError(
    f"{path} is not a bert_jax workdir, checkpoint step or export bundle, nor a Hugging Face or Google BERT "
    f"directory; it holds {_describe_contents(path)}."
  )


def check_fits(source: Source, config: BertConfig, where: str) -> None:
  """Raises ValueError, naming `where` and each field, if the source's parameter shapes or architecture (a
  RoBERTa's positions, an activation) differ from `config`'s."""
  different = [
    f"model.{name}: {getattr(source.config, name)!r} vs {getattr(config, name)!r}"
    for name in SIZE_FIELDS + ARCHITECTURE_FIELDS
    if getattr(source.config, name) != getattr(config, name)
  ]
  if different:
    raise ValueError(
      f"{where} ({source.format} at {source.path}) does not fit this config (source vs config): {different}."
    )


def check_tokenizer(source: Source, identity: dict, where: str) -> None:
  """Raises ValueError if the tokenizer `identity` (kind, sha256, lower_case, albert_preprocessing) is not the
  source's tokenizer."""
  if source.tokenizer_file is None:
    raise ValueError(f"{where} ({source.path}) was trained on synthetic data; this run's data has a tokenizer.")
  sha256 = source.recorded_sha256 or tokenizer_sha256(source.tokenizer_kind, source.tokenizer_file)
  expected = dict(kind=source.tokenizer_kind, sha256=sha256)
  actual = dict(kind=identity["kind"], sha256=identity["sha256"])
  if source.tokenizer_kind == "wordpiece":
    expected["lower_case"], actual["lower_case"] = source.lower_case, identity.get("lower_case", True)
  if source.albert_preprocessing is not None or identity.get("albert_preprocessing") is not None:
    expected["albert_preprocessing"] = source.albert_preprocessing
    actual["albert_preprocessing"] = identity.get("albert_preprocessing")
  if expected != actual:
    fix = "Use the source's tokenizer file."
    if expected.get("albert_preprocessing") != actual.get("albert_preprocessing"):
      fix = (
        "A config's tokenizer (tokenizer.*) encodes raw text and cannot ask for ALBERT's preprocessing; fine-tuning "
        "from the source takes its tokenizer whole."
      )
    raise ValueError(
      f"{where} ({source.path}) was trained with tokenizer {expected} ({source.tokenizer_file}); the config's is "
      f"{actual} ({identity.get('path')}). {fix}"
    )
