"""Pretrained weights from any source, in one call: `load(path)` -> model config, params, tokenizer.

Sources (local paths or `gs://`): every format `formats.read_source` tells apart (a pretraining or fine-tuning
workdir, an export bundle, a Hugging Face or an original Google BERT directory, a sentence-transformers directory); of
a workdir only the `params` item is read, never the optimizer state. A sentence-transformers directory loads its
Transformer module's model, and how it embeds a sentence (`Pretrained.embedding`).

A fine-tuned model (a fine-tuning workdir, its bundle, a Hugging Face `BertFor{SequenceClassification,
QuestionAnswering,TokenClassification,MultipleChoice}` or `ModernBertFor...` directory) loads with its head:
`params` holds `bert` and `classifier` or `qa_outputs` (a ModernBERT's: `head` and `classifier`), and `task` (a
`heads.TaskHead`) names the task, head and labels, so that `loaded.task.model(loaded.config)` is the model to apply
them to. transformers' BERT token and span models have no pooler, which those heads never read: from their files
the pooler loads as zeros. RobertaForMaskedLM has none either: its pooler starts fresh (random, seed 0), as a new
head does. A ModernBERT has no pooler at all.

Orbax sources restore straight into the requested shardings (each host reads only its shards: BERT-Large never
exists whole on one host), in either layer layout whatever the checkpoint's. Foreign formats are read whole on
each host (host memory), then each device receives only its shards.

Everything that can be checked from metadata is checked before any parameter is read (`formats.py`), and the
tokenizer file's hash and vocabulary against the model here. Every error names the path and the mismatch.
"""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from etils import epath

from bert_jax import paths, sharding
from bert_jax.data.tokenizer import Tokenizer, load_tokenizer
from bert_jax.handoff import formats, google_format, hf_format
from bert_jax.model import param_layout
from bert_jax.model.bert_config import BertConfig
from bert_jax.model.electra import ElectraForPretraining, with_generator
from bert_jax.model.encoder import abstract_params
from bert_jax.model.heads import TaskHead
from bert_jax.model.poolers import make_pooler
from bert_jax.model.sentence_embedding import Settings
from bert_jax.workdir import checkpoints, reading


@dataclasses.dataclass(frozen=True)
class Pretrained:
  """What `load` returns."""

  config: BertConfig  # The architecture; `scan_layers` as asked.
  # BertForPretraining's tree: `bert` (encoder and pooler), and the MLM/NSP heads where the source has them; an
  # ELECTRA's (model/electra.py): the discriminator's `bert` and `rtd_*`, and its `generator` where the source has
  # it; or, fine-tuned, the task model's: `bert` and its head.
  params: dict
  tokenizer: Tokenizer
  source: formats.Source

  @property
  def task(self) -> TaskHead | None:
    return self.source.task

  @property
  def embedding(self) -> Settings | None:
    """How the source embeds a sentence, as it records it (a sentence-transformers directory's modules); None when
    it records nothing: `sentence_embedding.settings(config.embedding, loaded.embedding)` then gives the defaults."""
    return self.source.embedding


def source_tokenizer(source: formats.Source) -> Tokenizer:
  """The tokenizer `source` ships, refused unless its hash is the one the source recorded and its ids fit the
  embedding table."""
  if source.tokenizer_file is None:
    raise ValueError(f"{source.path} was trained on synthetic data, without a tokenizer: nothing to encode text with.")
  if not epath.Path(source.tokenizer_file).exists():
    raise FileNotFoundError(f"{source.path}: its tokenizer file {source.tokenizer_file} does not exist.")
  tokenizer = load_tokenizer(
    source.tokenizer_kind, source.tokenizer_file, source.lower_case, source.albert_preprocessing
  )
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


def _open_index(directory: epath.Path) -> None:
  """Reads the OCDBT index of the Orbax directory `directory` in one synchronous call, so that a damaged index is
  refused here. Orbax would meet it in a read per array and shard at once, raise the first failure and close its
  event loop while the others are in flight: each of theirs then called back into the closed loop ("Event loop is
  closed", dozens of unraisable exceptions after the error)."""
  if (directory / "manifest.ocdbt").exists():
    import tensorstore as ts

    base = f"file://{paths.absolute(directory)}" if paths.is_local(directory) else str(directory)
    ts.KvStore.open({"driver": "ocdbt", "base": base}).result().list().result()


def _kept(source: formats.Source, tree: dict) -> dict:
  """The subtrees of `tree` (a model's parameters, or their shapes) that `source` holds: a bundle exported from a
  model without pretraining heads holds the encoder alone."""
  if source.format != "bundle":
    return tree
  kept = {"bert", *source.info.get("heads", [])}
  return {name: subtree for name, subtree in tree.items() if name in kept}


def source_shapes(source: formats.Source) -> dict:
  """The shapes and dtypes (ShapeDtypeStructs) of the parameters `source` holds, in its own layer layout, from its
  metadata alone."""
  return _kept(source, nn.meta.unbox(_abstract(source.config, source.task, source.generator)))


def _read_params(source: formats.Source, mesh, rules, item: str = "params") -> dict:
  """The source's params (`item`: "ema", a checkpoint step's moving average of them) in its own layer layout, placed
  in their shardings."""
  shardings = param_shardings(source.config, mesh, rules, source.task, source.generator)
  if item != "params" and source.format != "workdir":
    raise ValueError(f"{source.path} is a {source.format}: only a checkpoint step holds the {item} item.")
  if source.format in ("workdir", "bundle"):
    abstract, shardings = source_shapes(source), _kept(source, shardings)
    if source.format == "workdir":
      with checkpoints.reader(epath.Path(source.path).parent) as manager:
        # Verified against the step's per-array checksums; a step with non-finite parameters is never saved.
        return reading.restore_params(manager, source.step, abstract, shardings, item)
    import orbax.checkpoint as ocp

    formats.verify_bundle(
      source.path, source.info, "params"
    )  # Hashed once, here: the tokenizer's was checked by its load.
    try:
      _open_index(epath.Path(source.path) / "params")
      with ocp.StandardCheckpointer() as checkpointer:
        params = checkpointer.restore(epath.Path(source.path) / "params", sharding.with_shardings(abstract, shardings))
    except Exception as error:  # noqa: BLE001 - whatever Orbax or tensorstore raise of damaged files: name them.
      raise ValueError(
        f"{source.path}/params cannot be restored as this bundle's parameters: {type(error).__name__}: {error}"
      ) from None
    check_finite(params, source.path)
    return params
  directory = epath.Path(source.path)
  if source.format in ("huggingface", "sentence-transformers"):  # The latter: its Transformer module's folder.
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
      generator = hf_format.params_from_hf(hf_format.load_hf_directory(directory / formats.GENERATOR), source.generator)
      numpy_params = with_generator(numpy_params, generator, f"{formats.GENERATOR}/")
  except ValueError as error:
    raise ValueError(f"{source.path}: {error}") from None
  # transformers' token and span models, and RobertaForMaskedLM (a family without BERT's pooler has none to fill).
  if "pooler" not in numpy_params["bert"] and source.config.architecture.pooler == "tanh":
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
  source = formats.read_source(path, lower_case)
  tokenizer = source_tokenizer(source)  # Findings before any parameter is read.
  config, params = read_weights(source, scan_layers=scan_layers, mesh=mesh, rules=rules)
  return Pretrained(config=config, params=params, tokenizer=tokenizer, source=source)


def read_weights(
  source: formats.Source,
  *,
  scan_layers: bool = False,
  mesh: jax.sharding.Mesh | None = None,
  rules=None,
  item: str = "params",
) -> tuple[BertConfig, dict]:
  """(config, params) of a described `source`, as `load` returns them, without its tokenizer: for a run that has
  checked the source's tokenizer against its own. `item="ema"`: a checkpoint step's moving average of the
  parameters instead (`--mode=merge`)."""
  params = _read_params(source, mesh, rules, item)
  # The layout asked for, and the reference attention: the kernel is the loading job's choice, not the model's.
  config = dataclasses.replace(source.config, scan_layers=scan_layers, attention="xla")
  if source.config.scan_layers != scan_layers:
    shardings = param_shardings(config, mesh, rules, source.task, source.generator)
    target = {name: s for name, s in shardings.items() if name in params}
    params = jax.jit(functools.partial(param_layout.convert, scanned=scan_layers), out_shardings=target)(params)
  logging.info(
    "Loaded %s %s (%d arrays) from %s (%s%s).",
    f"{sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params)):,}",
    "parameters" if item == "params" else f"parameters' {item}",
    len(jax.tree.leaves(params)),
    source.path,
    source.format,
    f", step {source.step}" if source.step is not None else "",
  )
  return config, params
