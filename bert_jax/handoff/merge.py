"""Checkpoint averaging (`--mode=merge`): the weighted mean of several checkpoints of one model, written as a bundle
that every consumer reads (`pretrained.load`, `init_from`, `--mode=export`, the embedder).

What is averaged (`config.merge`, read by `merge_settings.parse`):

* the newest `merge.last` committed checkpoints of one workdir (the run's, or the one `merge.sources` names), or its
  `merge.steps`: the end of a run (the last checkpoints of a decay phase);
* the sources `merge.sources` names, each a workdir (its newest step; a fine-tuning workdir: its best member), a
  checkpoint step or a bundle: runs of one model (mmBERT's merge of decay-phase variants);
* with `merge.ema`, each checkpoint's moving average of the parameters (kept in training with `ema_decay`) instead of
  its parameters; of one checkpoint, that average alone.

Everything is decided from metadata before any parameter is read, and refused naming what is wrong: a workdir with
fewer than `merge.last` committed steps or without a named step, a checkpoint named twice, sources of different models
(their architectures, heads or parameter shapes, both named) or tokenizers, a checkpoint without the moving average
asked for, an output that exists or overlaps a source (the weights: `merge_settings`). Then the checkpoints are read
one at a time onto one device, in the unrolled layer layout (their parameters only, each array verified against its
checksum; the optimizer state is never opened), and summed in float32, each times its weight over the weights' sum.

The bundle is written as `--mode=export` writes one (`export.write_bundle`: all or nothing), with the tokenizer and
history of the newest checkpoint (the highest step; of equal steps, the last named); its manifest's `source` names
that checkpoint, and its `merge` what was averaged: `of` ("params" or "ema"), `named` (how the checkpoints were
named) and `sources` (each checkpoint's path, format, step, weight as given and share of the mean; with `merge.ema`,
the `ema_decay` its run recorded).
"""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from absl import logging
from etils import epath

from bert_jax import paths
from bert_jax.data.tokenizer import tokenizer_sha256
from bert_jax.handoff import export, formats, merge_settings, pretrained
from bert_jax.model.bert_config import ARCHITECTURE_FIELDS, SIZE_FIELDS
from bert_jax.workdir import checkpoints, reading

OUTPUT_KEY = "merge.output_dir"


def _steps_directory(path: str, request: merge_settings.Request) -> epath.Path:
  """The `checkpoints/` directory of the workdir whose steps `request` names (`path`: the workdir or that
  directory)."""
  where = paths.absolute(path)
  if (where / checkpoints.CHECKPOINTS).is_dir():
    return where / checkpoints.CHECKPOINTS
  if where.name == checkpoints.CHECKPOINTS and where.is_dir():
    return where
  if not where.exists():
    raise FileNotFoundError(f"{where} does not exist.")
  raise ValueError(
    f"{request.what()} names steps of a workdir, but {where} holds no {checkpoints.CHECKPOINTS}/ directory."
  )


def _named_steps(directory: epath.Path, request: merge_settings.Request) -> list[int]:
  """The steps of `directory` that `request` names, ascending; refused unless each is a committed checkpoint."""
  committed = checkpoints.committed_steps(directory)
  if request.last:
    if len(committed) < request.last:
      raise ValueError(
        f"merge.last={request.last}, but {directory} holds {len(committed)} committed checkpoint(s): "
        f"{committed or 'none'} (a run keeps its newest keep_checkpoints)."
      )
    return committed[-request.last :]
  missing = [step for step in request.steps if step not in committed]
  if missing:
    raise ValueError(
      f"merge.steps={request.steps}: step(s) {missing} are not committed checkpoints of {directory}, which holds "
      f"{committed or 'none'}."
    )
  return list(request.steps)


def resolve(request: merge_settings.Request, workdir: str) -> list[formats.Source]:
  """The checkpoints `request` names (`workdir` when it names no source), each described from its metadata, in the
  order their weights follow; a checkpoint named twice is refused."""
  named = request.sources or (workdir,)
  if request.last or request.steps:
    directory = _steps_directory(named[0], request)
    sources = [formats.read_source(directory / str(step)) for step in _named_steps(directory, request)]
  else:
    sources = [formats.read_source(path) for path in named]
  found = [source.path for source in sources]
  twice = sorted({path for path in found if found.count(path) > 1})
  if twice:
    raise ValueError(f"merge.sources={list(named)} names the checkpoint(s) {twice} more than once.")
  return sources


def _unrolled_shapes(source: formats.Source) -> dict:
  """{array path: (shape, dtype)} of `source`'s parameters in the unrolled layer layout (how they are averaged)."""
  unrolled = dataclasses.replace(source, config=dataclasses.replace(source.config, scan_layers=False))
  leaves = jax.tree_util.tree_leaves_with_path(pretrained.source_shapes(unrolled))
  return {jax.tree_util.keystr(path): (tuple(leaf.shape), str(leaf.dtype)) for path, leaf in leaves}


def _tokenizer(source: formats.Source) -> dict | None:
  """What names `source`'s tokenizer: kind, SHA-256, casing and preprocessing; None: trained without one."""
  if source.tokenizer_file is None:
    return None
  sha256 = source.recorded_sha256 or tokenizer_sha256(source.tokenizer_kind, source.tokenizer_file)
  identity = dict(kind=source.tokenizer_kind, sha256=sha256, albert_preprocessing=source.albert_preprocessing)
  if source.tokenizer_kind == "wordpiece":
    identity["lower_case"] = source.lower_case
  return identity


def _differences(first: formats.Source, other: formats.Source, shapes: dict) -> list[str]:
  """How `other` differs from `first` (whose `_unrolled_shapes` are `shapes`) as a model (architecture, heads,
  parameter shapes): one entry each."""
  found = [
    f"model.{name}: {getattr(first.config, name)!r} vs {getattr(other.config, name)!r}"
    for name in SIZE_FIELDS + ARCHITECTURE_FIELDS
    if getattr(first.config, name) != getattr(other.config, name)
  ]
  if first.task != other.task:
    found.append(f"task head: {first.task} vs {other.task}")
  if first.generator != other.generator:
    found.append(f"ELECTRA generator: {first.generator} vs {other.generator}")
  if found:
    return found
  others = _unrolled_shapes(other)
  found += [f"{name}: {shapes[name]} vs absent" for name in shapes if name not in others]
  found += [f"{name}: absent vs {others[name]}" for name in others if name not in shapes]
  found += [
    f"{name}: {shapes[name]} vs {others[name]}" for name in shapes if others.get(name, shapes[name]) != shapes[name]
  ]
  return found


def check_one_model(sources: list[formats.Source]) -> None:
  """Refuses, naming both, a source that is not the first's model (`_differences`) or was trained with another
  tokenizer."""
  first = sources[0]
  shapes = _unrolled_shapes(first)
  for other in sources[1:]:
    different = _differences(first, other, shapes)
    if different:
      raise ValueError(
        f"{first.path} and {other.path} are not checkpoints of one model (first vs second): {different[:8]}"
        f"{' ...' if len(different) > 8 else ''}."
      )
    if _tokenizer(first) != _tokenizer(other):
      raise ValueError(
        f"{first.path} and {other.path} were trained with different tokenizers: {_tokenizer(first)} "
        f"({first.tokenizer_file}) vs {_tokenizer(other)} ({other.tokenizer_file})."
      )


def _check_item(source: formats.Source, item: str) -> None:
  """Refuses a source that does not hold `item` (a moving average is a checkpoint step's, of a run that kept one)."""
  if item == "params":
    return
  if source.format != "workdir":
    raise ValueError(f"merge.ema: {source.path} is a {source.format}; only a checkpoint step holds a moving average.")
  with checkpoints.reader(epath.Path(source.path).parent) as manager:
    present = reading.items(manager, source.step)
  if checkpoints.EMA not in present:
    raise ValueError(
      f"merge.ema: {source.path} holds no moving average of the parameters (its run had ema_decay="
      f"{source.info.get('ema_decay', 0.0)}); set ema_decay to keep one."
    )


@functools.partial(jax.jit, donate_argnums=0)
def _accumulate(total, params, share):
  """`total + share * params`, leaf by leaf, in float32."""
  return jax.tree.map(lambda sum_, param: sum_ + share * param.astype(jnp.float32), total, params)


def mean_params(sources: list[formats.Source], shares: list[float], item: str = "params") -> tuple[list, dict]:
  """(each source's config as read, the sum over `sources` of share x their `item`): read one at a time onto one
  device, unrolled, and summed in float32; the sum in the sources' dtype."""
  total, configs, params = None, [], None
  for source, share in zip(sources, shares, strict=True):
    config, params = pretrained.read_weights(source, item=item)
    configs.append(config)
    if total is None:
      total = jax.tree.map(lambda param: jnp.zeros(param.shape, jnp.float32), params)
    total = _accumulate(total, params, jnp.float32(share))
  return configs, jax.tree.map(lambda sum_, param: sum_.astype(param.dtype), total, params)


def merge(settings, workdir: str) -> str:
  """`--mode=merge` of `settings` (`config.merge`; its sources default to `workdir`): the mean written as a bundle
  (see the module docstring); returns its directory."""
  request = merge_settings.parse(settings)
  sources = resolve(request, workdir)
  check_one_model(sources)
  for source in sources:
    _check_item(source, request.item)
  inputs = [*(request.sources or [workdir]), *(source.path for source in sources)]
  export.check_new_target(request.output_dir, inputs, OUTPUT_KEY)
  newest = max(reversed(range(len(sources))), key=lambda i: -1 if sources[i].step is None else sources[i].step)
  tokenizer = pretrained.source_tokenizer(sources[newest])  # Checked against its recorded hash before any read.
  weights = request.weights or (1.0,) * len(sources)
  shares = [weight / math.fsum(weights) for weight in weights]
  configs, params = mean_params(sources, shares, request.item)
  merged = pretrained.Pretrained(configs[newest], params, tokenizer, sources[newest])
  record = dict(
    of=request.item,
    named=request.what(),
    sources=[
      dict(
        path=source.path,
        format=source.format,
        step=source.step,
        weight=weight,
        share=share,
        **({"ema_decay": source.info.get("ema_decay")} if request.item == "ema" else {}),
      )
      for source, weight, share in zip(sources, weights, shares, strict=True)
    ],
  )
  target = export.write_bundle(merged, request.output_dir, inputs, OUTPUT_KEY, record)
  logging.info(
    "Merged the %s of %d checkpoint(s) (shares %s) into %s.",
    "parameters" if request.item == "params" else "moving averages",
    len(sources),
    ", ".join(f"{share:.4g}" for share in shares),
    target,
  )
  return target
