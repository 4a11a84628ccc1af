"""Pretrained weights from any source, in one call: `load(path)` -> model config, params, tokenizer.

Sources (local paths or `gs://`), told apart by what the directory holds:

* a pretraining workdir (its newest committed checkpoint step), its `checkpoints/` directory, or one step
  directory `<workdir>/checkpoints/<step>`: only the `params` item is read, never the optimizer state;
* a fine-tuning workdir: its `best/` checkpoint (the best sweep member), or `best/<step>`;
* an export bundle (`manifest.json`, written last by `bert_jax.handoff.export`);
* a Hugging Face BERT, RoBERTa or ALBERT directory (hf_configs.py, hf_names.py): `config.json` +
  `model.safetensors` (or `pytorch_model.bin` with torch) + `vocab.txt` (or a SentencePiece `tokenizer.model` or
  `spiece.model`, or a byte-level BPE's `vocab.json` + `merges.txt`);
* an original Google BERT directory: `bert_config.json` + `bert_model.ckpt.{index,data-*}` + `vocab.txt`.

A fine-tuned model (a fine-tuning workdir, its bundle, a Hugging Face `BertFor{SequenceClassification,
QuestionAnswering,TokenClassification,MultipleChoice}` directory) loads with its head: `params` holds `bert` and
`classifier` or `qa_outputs`, and `task` (a `heads.TaskHead`) names the task, head and labels, so that
`loaded.task.model(loaded.config)` is the model to apply them to. transformers' token and span models have no
pooler, which those heads never read: from their files the pooler loads as zeros. RobertaForMaskedLM has none
either: its pooler starts fresh (random, seed 0), as a new head does.

Orbax sources restore straight into the requested shardings (each host reads only its shards: BERT-Large never
exists whole on one host), in either layer layout whatever the checkpoint's. Foreign formats are read whole on
each host (host memory), then each device receives only its shards.

Everything that can be checked from metadata is checked before any parameter is read: that the path exists and
is a committed, complete source, that the tokenizer file has the hash and a vocabulary that fits the model.
Every error names the path and the mismatch.
"""

import dataclasses
import functools
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from bert_jax import paths, sharding
from bert_jax.data.tokenizer import Tokenizer, file_sha256, load_tokenizer, tokenizer_sha256
from bert_jax.handoff import google_format, hf_configs, hf_format
from bert_jax.model import param_layout
from bert_jax.model.bert_config import ARCHITECTURE_FIELDS, SIZE_FIELDS, BertConfig, electra_generator, from_bert_json
from bert_jax.model.electra import ElectraForPretraining, with_generator
from bert_jax.model.encoder import abstract_params, make_pooler
from bert_jax.model.heads import HEADS, HF_ARCHITECTURES, TaskHead
from bert_jax.workdir import checkpoints

FORMATS = ("workdir", "bundle", "huggingface", "google")
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


@dataclasses.dataclass(frozen=True)
class Pretrained:
  """What `load` returns."""

  config: BertConfig  # The architecture; `scan_layers` as asked.
  # BertForPretraining's tree: `bert` (encoder and pooler), and the MLM/NSP heads where the source has them; an
  # ELECTRA's (model/electra.py): the discriminator's `bert` and `rtd_*`, and its `generator` where the source has
  # it; or, fine-tuned, the task model's: `bert` and its head.
  params: dict
  tokenizer: Tokenizer
  source: Source

  @property
  def task(self) -> TaskHead | None:
    return self.source.task


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
    items = checkpoints.items(manager, step)
    if not ({"params", "state"} & items and {"config", "data"} <= items):
      raise ValueError(
        f"{step_dir} lacks the params, config or data item of a checkpoint step; it has {sorted(items)}."
      )
    saved = checkpoints.read_config(manager, step)
    tokenizer = checkpoints.read_tokenizer(manager, step)
    recorded = checkpoints.read_data_position(manager, step).get("tokenizer")
    history = checkpoints.read_history(manager, step)
  task = None
  if saved.get("finetune", {}).get("task"):
    if directory.name != checkpoints.BEST:
      raise ValueError(
        f"{step_dir} is a fine-tuning checkpoint holding every member of its sweep; load the best one, "
        f"{directory.parent / checkpoints.BEST}."
      )
    task = _named(step_dir, lambda: TaskHead.from_json(history))
  config = _named(step_dir, lambda: BertConfig(**saved["model"]))
  generator = None
  if config.model_type == "electra" and task is None:
    generator = _named(step_dir, lambda: electra_generator(saved, config))
  if recorded is None:  # Trained on synthetic data: no tokenizer.
    return Source(
      "workdir", step_dir, config, None, None, True, None, step=step, info=saved, task=task, generator=generator
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
    ),
  )


def _vocab_is_uncased(vocab_file: epath.Path) -> bool:
  """A WordPiece vocabulary without upper-case pieces (besides [SPECIAL] ones) is an uncased one."""
  pieces = vocab_file.read_text().splitlines()
  return not any(p != p.lower() for p in pieces if not (p.startswith("[") and p.endswith("]")))


def _tokenizer_files(path: epath.Path, lower_case: bool | None) -> tuple[str, str, bool]:
  """(file, kind, lower_case) of the tokenizer in a Hugging Face or Google directory: BERT's `vocab.txt`,
  SentencePiece's `tokenizer.model` (ALBERT's `spiece.model`), RoBERTa's `vocab.json` + `merges.txt`."""
  if (path / "vocab.txt").exists():
    if lower_case is None:
      tokenizer_config = path / "tokenizer_config.json"
      if tokenizer_config.exists() and "do_lower_case" in json.loads(tokenizer_config.read_text()):
        lower_case = bool(json.loads(tokenizer_config.read_text())["do_lower_case"])
      else:
        lower_case = _vocab_is_uncased(path / "vocab.txt")
    return str(path / "vocab.txt"), "wordpiece", lower_case
  for name in ("tokenizer.model", "spiece.model"):
    if (path / name).exists():
      return str(path / name), "sentencepiece", False
  if (path / "vocab.json").exists() and (path / "merges.txt").exists():
    return str(path / "vocab.json"), "bpe", False
  raise FileNotFoundError(
    f"{path} has no tokenizer: expected vocab.txt (WordPiece), tokenizer.model or spiece.model (SentencePiece), "
    "or vocab.json and merges.txt (byte-level BPE)."
  )


def _foreign_source(path: epath.Path, fmt: str, lower_case: bool | None) -> Source:
  config_file = path / ("config.json" if fmt == "huggingface" else google_format.CONFIG)
  config = _read_config(config_file)
  if fmt == "google":
    google_format.checkpoint_prefix(path)  # Exactly one TF1 checkpoint.
  file, kind, lower_case = _tokenizer_files(path, lower_case)
  task = _named(config_file, lambda: _hf_task(read_json(config_file))) if fmt == "huggingface" else None
  generator = None
  if config.model_type == "electra" and (path / GENERATOR / "config.json").exists():  # As hf_export writes it.
    generator = _read_config(path / GENERATOR / "config.json")
  return Source(fmt, str(path), config, file, kind, lower_case, None, task=task, generator=generator)


def _hf_task(config: dict) -> TaskHead | None:
  """The head of a Hugging Face BERT task model's config.json (`architectures`, `id2label`, `problem_type`)."""
  architectures = config.get("architectures") or []
  heads = [head for head in HEADS if HF_ARCHITECTURES[head] in architectures]
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


def describe(path, lower_case: bool | None = None) -> Source:
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
  """Raises ValueError if the tokenizer `identity` (kind, sha256, lower_case) is not the source's tokenizer."""
  if source.tokenizer_file is None:
    raise ValueError(f"{where} ({source.path}) was trained on synthetic data; this run's data has a tokenizer.")
  sha256 = source.recorded_sha256 or tokenizer_sha256(source.tokenizer_kind, source.tokenizer_file)
  expected = dict(kind=source.tokenizer_kind, sha256=sha256)
  actual = dict(kind=identity["kind"], sha256=identity["sha256"])
  if source.tokenizer_kind == "wordpiece":
    expected["lower_case"], actual["lower_case"] = source.lower_case, identity.get("lower_case", True)
  if expected != actual:
    raise ValueError(
      f"{where} ({source.path}) was trained with tokenizer {expected} ({source.tokenizer_file}); the config's is "
      f"{actual} ({identity.get('path')}). Use the source's tokenizer file."
    )


def _load_tokenizer(source: Source) -> Tokenizer:
  if source.tokenizer_file is None:
    raise ValueError(f"{source.path} was trained on synthetic data, without a tokenizer: nothing to encode text with.")
  if not epath.Path(source.tokenizer_file).exists():
    raise FileNotFoundError(f"{source.path}: its tokenizer file {source.tokenizer_file} does not exist.")
  tokenizer = load_tokenizer(source.tokenizer_kind, source.tokenizer_file, source.lower_case)
  sha256 = tokenizer.identity()["sha256"]
  if source.recorded_sha256 and sha256 != source.recorded_sha256:
    raise ValueError(
      f"{source.tokenizer_file} has SHA-256 {sha256}, but {source.path} recorded {source.recorded_sha256}: "
      "not the tokenizer this model was trained with."
    )
  if tokenizer.vocab_size > source.config.vocab_size:
    raise ValueError(
      f"{source.tokenizer_file} has {tokenizer.vocab_size} ids but the model in {source.path} has "
      f"vocab_size={source.config.vocab_size}: ids beyond the embedding table."
    )
  return tokenizer


def _abstract(config: BertConfig, task: TaskHead | None, generator: BertConfig | None = None) -> dict:
  """The parameter shapes and logical axis names of the model of a source: `task`'s model when fine-tuned, else
  its family's pretraining model: `BertForPretraining`, or ELECTRA's discriminator with `generator`, if any."""
  if task is not None:
    model = task.model(config)
  elif config.model_type == "electra":
    same = dict(scan_layers=config.scan_layers, attention=config.attention)
    model = ElectraForPretraining(config, generator and dataclasses.replace(generator, **same))
  else:
    model = None
  return abstract_params(config, model)


def param_shardings(
  config: BertConfig, mesh: jax.sharding.Mesh | None, rules, task: TaskHead | None = None, generator=None
) -> dict:
  """NamedShardings of the params of a source of `config` (`task`, `generator`: see `_abstract`) on `mesh` by the
  logical axis `rules`; one device if no mesh."""
  boxed = _abstract(config, task, generator)
  if mesh is None:
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return jax.tree.map(lambda _: device, nn.meta.unbox(boxed))
  if rules is None:
    raise ValueError("load(mesh=...) needs the logical axis rules too (config.logical_axis_rules).")
  return sharding.logical_to_sharding(nn.get_partition_spec(boxed), mesh, rules)


def _subtree(tree: dict, like: dict) -> dict:
  """The part of `tree` (a nested dict) with the keys of `like`."""
  return {k: _subtree(tree[k], v) if isinstance(v, dict) else tree[k] for k, v in like.items()}


def _place(numpy_params: dict, shardings: dict) -> dict:
  """Host numpy arrays -> jax.Arrays in `shardings`; each device receives only its own shard."""
  return jax.tree.map(
    lambda value, s: jax.make_array_from_callback(value.shape, s, lambda index: value[index]),
    numpy_params,
    _subtree(shardings, numpy_params),
  )


def _read_params(source: Source, mesh, rules) -> dict:
  """The source's params in its own layer layout, placed in their shardings."""
  shardings = param_shardings(source.config, mesh, rules, source.task, source.generator)
  if source.format in ("workdir", "bundle"):
    abstract = nn.meta.unbox(_abstract(source.config, source.task, source.generator))
    if source.format == "bundle":  # Exported from a model without pretraining heads: the encoder alone.
      kept = {"bert", *source.info.get("heads", [])}
      abstract = {name: tree for name, tree in abstract.items() if name in kept}
      shardings = {name: tree for name, tree in shardings.items() if name in kept}
    if source.format == "workdir":
      with checkpoints.reader(epath.Path(source.path).parent) as manager:
        # Verified against the step's per-array checksums; a step with non-finite parameters is never saved.
        return checkpoints.restore_params(manager, source.step, abstract, shardings)
    import orbax.checkpoint as ocp

    verify_bundle(source.path, source.info, "params")  # Hashed once, here: the tokenizer's was checked by its load.
    try:
      with ocp.StandardCheckpointer() as checkpointer:
        params = checkpointer.restore(epath.Path(source.path) / "params", sharding.with_shardings(abstract, shardings))
    except Exception as error:  # noqa: BLE001 - whatever Orbax or tensorstore raise of damaged files: name them.
      raise ValueError(
        f"{source.path}/params cannot be restored as this bundle's parameters: {type(error).__name__}: {error}"
      ) from None
    check_finite(params, source.path)
    return params
  directory = epath.Path(source.path)
  if source.format == "huggingface":
    tensors = hf_format.load_hf_directory(directory)  # Checks each file's tensors are finite.
  else:
    try:
      tensors = google_format.read_checkpoint(directory)
    except Exception as error:  # noqa: BLE001 - whatever TensorFlow's reader raises of a damaged checkpoint.
      raise ValueError(f"{directory}: its TF1 checkpoint cannot be read: {type(error).__name__}: {error}") from None
    hf_format.check_finite(tensors, f"{directory}/{google_format.checkpoint_prefix(directory)}")
  try:
    numpy_params = hf_format.params_from_hf(tensors, source.config)
    if source.generator is not None:
      generator = hf_format.params_from_hf(hf_format.load_hf_directory(directory / GENERATOR), source.generator)
      numpy_params = with_generator(numpy_params, generator, f"{GENERATOR}/")
  except ValueError as error:
    raise ValueError(f"{source.path}: {error}") from None
  if "pooler" not in numpy_params["bert"]:  # transformers' token and span models, and RobertaForMaskedLM.
    config = source.config
    pooler = nn.meta.unbox(make_pooler(config).init(jax.random.key(0), np.zeros((1, config.hidden_size)))["params"])
    if source.task is not None:  # A task model whose head never reads it.
      pooler = jax.tree.map(np.zeros_like, pooler)
    else:  # Fresh, as a new head is, for the task or sentence head that will train it.
      logging.info("%s has no pooler; it starts fresh (random, seed 0).", source.path)
    numpy_params["bert"]["pooler"] = jax.tree.map(np.asarray, pooler)
  if source.config.scan_layers:
    raise AssertionError("Foreign formats are unrolled.")
  return _place(numpy_params, shardings)


@jax.jit
def _finite_leaves(params):
  return [jnp.isfinite(leaf).all() for leaf in jax.tree.leaves(params)]


def check_finite(params, where: str) -> None:
  """Raises ValueError naming `where` and the arrays of `params` (jax.Arrays in any sharding) that hold a NaN or
  inf; one jitted reduction."""
  finite = jax.device_get(_finite_leaves(params))
  leaves = jax.tree_util.tree_leaves_with_path(params)
  names = ["/".join(str(getattr(key, "key", key)) for key in path) for path, _ in leaves]
  bad = [name for name, ok in zip(names, finite, strict=True) if not ok]
  if bad:
    raise ValueError(f"{where}: parameters {bad[:8]} hold NaN or inf values; refusing to load them.")


def load(
  path,
  *,
  scan_layers: bool = False,
  mesh: jax.sharding.Mesh | None = None,
  rules=None,
  lower_case: bool | None = None,
) -> Pretrained:
  """Loads the model config, params and tokenizer of any source (see the module docstring).

  `scan_layers` picks the layer layout of the returned params (and config). With `mesh` and the logical axis
  `rules`, params are placed straight into their shardings on that mesh (any mesh, whatever the one that saved);
  without, on one device.
  """
  source = describe(path, lower_case)
  tokenizer = _load_tokenizer(source)  # Checked before any parameter is read.
  config, params = read_weights(source, scan_layers=scan_layers, mesh=mesh, rules=rules)
  return Pretrained(config=config, params=params, tokenizer=tokenizer, source=source)


def read_weights(
  source: Source, *, scan_layers: bool = False, mesh: jax.sharding.Mesh | None = None, rules=None
) -> tuple[BertConfig, dict]:
  """(config, params) of a described `source`, as `load` returns them, without its tokenizer: for a run that has
  checked the source's tokenizer against its own."""
  params = _read_params(source, mesh, rules)
  # The layout asked for, and the reference attention: the kernel is the loading job's choice, not the model's.
  config = dataclasses.replace(source.config, scan_layers=scan_layers, attention="xla")
  if source.config.scan_layers != scan_layers:
    shardings = param_shardings(config, mesh, rules, source.task, source.generator)
    target = {name: s for name, s in shardings.items() if name in params}
    params = jax.jit(functools.partial(param_layout.convert, scanned=scan_layers), out_shardings=target)(params)
  logging.info(
    "Loaded %s parameters (%d arrays) from %s (%s%s).",
    f"{sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params)):,}",
    len(jax.tree.leaves(params)),
    source.path,
    source.format,
    f", step {source.step}" if source.step is not None else "",
  )
  return config, params
