"""Hugging Face weights <-> bert_jax params, both ways, for every family of `model_type` (BERT, RoBERTa, ALBERT).

The file I/O (`model.safetensors`, its shards, or, read only, a PyTorch `pytorch_model.bin` when torch is
installed) and the conversion, driven by each family's table of names (hf_names.py): the pretraining model's
tensors (e.g. `BertForPreTraining`: prefix `bert.` and the `cls.` heads) and the bare encoder's (`BertModel`: no
prefix, no heads) are read; the pretraining model's, or the encoder's, are written. Old Google-converted files name
LayerNorm parameters `gamma`/`beta`; both spellings load. The MLM decoder is tied to the word embeddings: written
files leave the tied tensors out, as `transformers`' own `save_pretrained` does, and read files may hold them
(equal to what they are tied to) or not. `config.json` is hf_configs.py's.
"""

import dataclasses
import json
import pickle
from collections.abc import Mapping

import flax.linen as nn
import jax
import numpy as np
from etils import epath
from flax import traverse_util

from bert_jax import paths
from bert_jax.handoff import hf_names
from bert_jax.model.bert_config import BertConfig
from bert_jax.model.electra import ElectraForPretraining
from bert_jax.model.encoder import BertForPretraining, abstract_params
from bert_jax.model.heads import task_model

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"  # A model saved in several shards.
PYTORCH_BIN = "pytorch_model.bin"


# How a bert_jax leaf relates to its Hugging Face tensor: (to bert_jax, to Hugging Face), given (heads, head_dim).
_KINDS = {
  "copy": (lambda t, h, d: t, lambda p, h, d: p),
  # torch Linear stores [out, in]; a Flax kernel is [in, out].
  "linear": (lambda t, h, d: t.T, lambda p, h, d: p.T),
  "split_heads": (lambda t, h, d: t.T.reshape(t.shape[1], h, d), lambda p, h, d: p.reshape(p.shape[0], -1).T),
  "merge_heads": (lambda t, h, d: t.T.reshape(h, d, t.shape[0]), lambda p, h, d: p.reshape(-1, p.shape[-1]).T),
  "head_bias": (lambda t, h, d: t.reshape(h, d), lambda p, h, d: p.reshape(-1)),
  # A gated feed-forward's input and gate in one [2 * intermediate, hidden] tensor (ModernBERT's `Wi`): [hidden, 2,
  # intermediate] in bert_jax.
  "glu_in": (lambda t, h, d: t.T.reshape(t.shape[1], 2, -1), lambda p, h, d: p.reshape(p.shape[0], -1).T),
  "glu_bias": (lambda t, h, d: t.reshape(2, -1), lambda p, h, d: p.reshape(-1)),
}


# Tensors that carry nothing bert_jax needs: buffers.
_IGNORED_SUFFIXES = ("embeddings.position_ids",)


def _canonical(name: str) -> str:
  return name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")


def check_finite(tensors: Mapping[str, np.ndarray], where) -> None:
  """Raises ValueError naming `where` and the tensors that hold a NaN or inf. One float64 sum per tensor (no
  temporary array; float32 values cannot overflow it): NaN and inf propagate, finite values stay finite."""
  bad = [name for name, value in tensors.items() if not np.isfinite(np.sum(value, dtype=np.float64))]
  if bad:
    raise ValueError(f"{where}: tensors {bad[:8]} hold NaN or inf values; refusing to load them.")


def load_safetensors(path) -> dict[str, np.ndarray]:
  """Every tensor of a `.safetensors` file (local or gs://) as float32 numpy arrays. Raises ValueError naming the
  file if it cannot be read (truncated, damaged) or holds a NaN or inf."""
  from safetensors import SafetensorError
  from safetensors import numpy as safetensors_numpy

  try:
    if paths.is_local(path):
      tensors = safetensors_numpy.load_file(str(path))  # Memory-mapped.
    else:
      tensors = safetensors_numpy.load(epath.Path(path).read_bytes())
  except SafetensorError as error:
    raise ValueError(f"{path} is not a readable safetensors file (truncated or damaged?): {error}") from None
  tensors = {name: np.asarray(tensor, np.float32) for name, tensor in tensors.items()}
  check_finite(tensors, path)
  return tensors


def load_pytorch_bin(path) -> dict[str, np.ndarray]:
  """The state dict of a PyTorch `pytorch_model.bin` as float32 numpy arrays (needs torch)."""
  try:
    import torch
  except ImportError:
    raise ImportError(
      f"{path} is a PyTorch file and torch is not installed: install torch, or use a model.safetensors."
    ) from None
  try:
    with epath.Path(path).open("rb") as f:
      state_dict = torch.load(f, map_location="cpu", weights_only=True)
  except FileNotFoundError:
    raise
  except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError) as error:
    raise ValueError(f"{path} is not a readable PyTorch state dict (truncated or damaged?): {error}") from None
  tensors = {name: tensor.float().numpy() for name, tensor in state_dict.items()}
  check_finite(tensors, path)
  return tensors


def load_hf_directory(directory) -> dict[str, np.ndarray]:
  """The tensors of a Hugging Face model directory: `model.safetensors`, the shards its index names, or (with
  torch) `pytorch_model.bin`."""
  directory = epath.Path(directory)
  if (directory / SAFETENSORS).exists():
    return load_safetensors(directory / SAFETENSORS)
  if (directory / SAFETENSORS_INDEX).exists():
    weight_map = json.loads((directory / SAFETENSORS_INDEX).read_text())["weight_map"]
    tensors = {}
    for shard in sorted(set(weight_map.values())):
      tensors.update(load_safetensors(directory / shard))
    return tensors
  return load_pytorch_bin(directory / PYTORCH_BIN)


def save_safetensors(tensors: Mapping[str, np.ndarray], path) -> None:
  """Writes `tensors` as a `.safetensors` file (local or gs://) that PyTorch `from_pretrained` reads."""
  from safetensors import numpy as safetensors_numpy

  contiguous = {name: np.ascontiguousarray(value, np.float32) for name, value in tensors.items()}
  epath.Path(path).write_bytes(safetensors_numpy.save(contiguous, metadata={"format": "pt"}))


def _present(entries, tensors) -> bool:
  return any(hf in tensors for hf, _, _ in entries)


def params_from_hf(tensors: Mapping[str, np.ndarray], config: BertConfig) -> dict:
  """Converts the HF tensors of `config.model_type`'s family (see hf_names.py) to a bert_jax params tree (nested
  dicts of float32 numpy arrays, unrolled layers).

  The result holds `bert` (the encoder, and the pooler when the file has one: transformers' RobertaForMaskedLM,
  token and span models have none); each group of pretraining heads the file has (`mlm_transform`,
  `mlm_layer_norm`, `mlm_output_bias`; the sentence head `nsp`); and a fine-tuning head when it has one (BERT's
  `classifier` or `qa_outputs`; ModernBERT's `head` and `classifier`: model/heads.py). Raises ValueError, naming
  the tensors, if the encoder is incomplete, if a shape disagrees with `config`, if a head or the pooler is only
  partly present, if a tied tensor differs from the one it is tied to, or if copies of one shared parameter differ.
  """
  tensors = {_canonical(name): value for name, value in tensors.items()}
  family_prefix = hf_names.PREFIXES[config.model_type]
  prefix = family_prefix if any(name.startswith(family_prefix) for name in tensors) else ""
  names = hf_names.names(config, prefix)
  for fused, parts in names.fused.items():  # ModernBERT's Wqkv: its parts, by name.
    if fused in tensors:
      value = tensors.pop(fused)
      if value.shape[0] % len(parts):
        raise ValueError(f"Hugging Face tensor {fused} has shape {value.shape}: not {len(parts)} equal parts.")
      tensors.update(zip(parts, np.split(value, len(parts)), strict=True))
  # A task head is there when its output layer is; the names it holds are its own (ModernBERT's `head` is the masked
  # LM's transform only beside the decoder).
  task = [entry for layer, entries in names.task_heads.items() if f"{layer}.weight" in tensors for entry in entries]
  claimed = {hf for hf, _, _ in task}
  table = list(names.encoder)
  table += [
    entry
    for group in names.heads.values()
    if _present([entry for entry in group if entry[0] not in claimed], tensors)
    for entry in group
  ]
  table += task
  if _present(names.pooler, tensors):  # Absent: the caller gives it a value (handoff/pretrained.py).
    table += names.pooler

  missing = [hf for hf, _, _ in table if hf not in tensors]
  if missing:
    raise ValueError(
      f"The Hugging Face weights lack {len(missing)} tensor(s) that a {config.model_type} model with "
      f"num_layers={config.num_layers} needs: {missing[:8]}{' ...' if len(missing) > 8 else ''}"
    )
  _check_identity(names.identity, tensors, config)
  used = {hf for hf, _, _ in table} | set(names.tied) | {f"{layer}.{kind}" for layer in names.identity for kind in _WB}
  unexpected = [name for name in tensors if name not in used and not name.endswith(_IGNORED_SUFFIXES)]
  if unexpected:
    raise ValueError(
      f"The Hugging Face weights hold tensors that this {config.model_type} config has no place for (more layers "
      f"than num_layers={config.num_layers}, or another architecture?): {unexpected[:8]}"
    )
  for tied, source in names.tied.items():
    if tied in tensors and not np.array_equal(tensors[tied], tensors[source]):
      raise ValueError(
        f"{tied} differs from {source}; bert_jax ties the MLM decoder to the word embeddings as BERT does, so an "
        "untied decoder cannot be loaded."
      )

  expected = _expected_shapes(config)
  params: dict = {}
  written: dict[tuple, str] = {}
  for hf, path, kind in table:
    shape = np.shape(tensors[hf])
    if path[0] in hf_names.TASK_HEADS:  # The task's width: only the input side is the model's.
      expected["/".join(path)] = (config.hidden_size, shape[0]) if path[-1] == "kernel" else shape
    try:
      value = np.asarray(_KINDS[kind][0](np.asarray(tensors[hf]), config.num_heads, config.head_dim), np.float32)
    except ValueError:  # A reshape into heads that cannot fit.
      value = None
    if value is None or value.shape != expected["/".join(path)]:
      raise ValueError(
        f"Hugging Face tensor {hf} has shape {shape}, which does not fit this config "
        f"(hidden_size={config.hidden_size}, embedding_size={config.embedding_width}, "
        f"num_heads={config.num_heads}, intermediate_size={config.intermediate_size}, "
        f"vocab_size={config.vocab_size}, max_position_embeddings={config.max_position_embeddings}, "
        f"type_vocab_size={config.type_vocab_size})."
      )
    node = params
    for key in path[:-1]:
      node = node.setdefault(key, {})
    if path in written and not np.array_equal(node[path[-1]], value):  # Copies of one shared parameter.
      raise ValueError(
        f"{hf} differs from {written[path]}; with model.layer_sharing={config.layer_sharing!r} both are "
        f"{'/'.join(path)}."
      )
    node[path[-1]] = value
    written.setdefault(path, hf)
  return params


def _head_groups(params: Mapping, config: BertConfig) -> list[str]:
  """The pretraining head groups of `config`'s family (hf_names.py) that `params` hold."""
  heads = hf_names.names(config, "").heads
  return [group for group, entries in heads.items() if entries[0][1][0] in params]


def architecture(params: Mapping, config: BertConfig) -> str:
  """The transformers class `hf_from_params` writes `params` as: the family's pretraining model when `params`
  hold its heads (ELECTRA's generator alone: ElectraForMaskedLM), else its encoder. (A fine-tuned model's task
  model: model/heads.py HF_ARCHITECTURES.)"""
  names = hf_names.names(config, hf_names.PREFIXES[config.model_type])
  groups = _head_groups(params, config)
  if not groups:
    return names.encoder_only
  if len(groups) == 1 and groups[0] in names.head_architectures:
    return names.head_architectures[groups[0]]
  return names.pretraining


def hf_from_params(params: Mapping, config: BertConfig) -> dict[str, np.ndarray]:
  """A bert_jax params tree (unrolled layers; heads optional) -> the tensors of `architecture(params, config)` (or,
  with a task head, of the family's task model) as numpy, named and laid out as `transformers` saves them (tied
  tensors left out; a shared parameter copied to every layer that uses it). Heads the family's model has no place
  for (RoBERTa's sentence head) are left out. A bare encoder's names have no prefix, as transformers writes them."""
  flat = traverse_util.flatten_dict(params)
  has_task = any(head in params for head in hf_names.TASK_HEADS)
  bare = not _head_groups(params, config) and not has_task
  names = hf_names.names(config, "" if bare else hf_names.PREFIXES[config.model_type])
  task = [entry for layer, entries in names.task_heads.items() if layer in params for entry in entries]
  if has_task and not task:
    raise ValueError(
      f"A fine-tuned {config.model_type} model has BERT's task head, which transformers' {config.model_type} task "
      "models do not have: export it as a bundle."
    )
  heads = [entry for group in names.heads.values() if group[0][1][0] in params for entry in group]
  pooler = list(names.pooler) if task or bare or names.pooler_with_heads else []
  tensors = {}
  for hf, path, kind in [*names.encoder, *pooler, *heads, *task]:
    if path not in flat:
      raise ValueError(f"The params lack {'/'.join(path)} (for {hf}); are the layers scanned? Convert them first.")
    value = np.asarray(jax.device_get(flat[path]), np.float32)
    tensors[hf] = np.ascontiguousarray(_KINDS[kind][1](value, config.num_heads, config.head_dim))
  for fused, parts in names.fused.items():
    tensors[fused] = np.concatenate([tensors.pop(part) for part in parts])
  for layer in names.identity:
    tensors[f"{layer}.weight"], tensors[f"{layer}.bias"] = _identity(config)
  return tensors


_WB = ("weight", "bias")


def _identity(config: BertConfig) -> tuple[np.ndarray, np.ndarray]:
  """The weight and bias of a hidden_size -> hidden_size linear layer that changes nothing."""
  return np.eye(config.hidden_size, dtype=np.float32), np.zeros(config.hidden_size, np.float32)


def _check_identity(layers: tuple[str, ...], tensors: Mapping[str, np.ndarray], config: BertConfig) -> None:
  """Raises ValueError unless each of `layers` (hf_names' `identity`) is absent or the identity: bert_jax's model of
  `config` has no place for anything else."""
  for layer in layers:
    found = [tensors.get(f"{layer}.{kind}") for kind in _WB]
    if all(value is None for value in found):
      continue
    identity = _identity(config)
    if any(value is None or not np.array_equal(value, want) for value, want in zip(found, identity, strict=True)):
      raise ValueError(
        f"Hugging Face tensor {layer} is not the identity; with embedding_size = hidden_size = {config.hidden_size} "
        f"a bert_jax {config.model_type} has no projection of its embeddings, so only the identity can be read."
      )


def _expected_shapes(config: BertConfig) -> dict[str, tuple]:
  """'/'-joined param path -> shape of the unrolled model (abstractly: nothing is allocated): BertForPretraining's,
  the family's task model's (its output layer's width is the file's), and for ELECTRA the discriminator's head too
  (the generator's file is a masked LM of its own config)."""
  config = dataclasses.replace(config, scan_layers=False)
  models = [BertForPretraining(config), task_model(config, "regression")]
  models += [ElectraForPretraining(config)] if config.model_type == "electra" else []
  shapes = {}
  for model in models:
    flat = traverse_util.flatten_dict(nn.meta.unbox(abstract_params(config, model)), sep="/")
    shapes.update({path: value.shape for path, value in flat.items()})
  return shapes
