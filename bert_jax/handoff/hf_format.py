"""Hugging Face BERT weights <-> bert_jax params, both ways.

Reads and writes the tensor names of `BertForPreTraining` (prefix `bert.` and the `cls.` heads) and reads those
of `BertModel` (no prefix, no heads), from and to `model.safetensors` (or, read only, a PyTorch
`pytorch_model.bin` when torch is installed), or a dict of numpy arrays. Old Google-converted files name
LayerNorm parameters `gamma`/`beta`; both spellings load. The MLM decoder is tied to the word embeddings, as in
BERT: written files leave the tied tensors out, as `transformers`' own `save_pretrained` does.
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
from bert_jax.model.bert_config import BertConfig, to_bert_json
from bert_jax.model.encoder import abstract_params

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"  # A model saved in several shards.
PYTORCH_BIN = "pytorch_model.bin"


def hf_config_dict(config: BertConfig) -> dict:
  """The Hugging Face `config.json` of the same architecture (a `BertForPreTraining`)."""
  return dict(to_bert_json(config), model_type="bert", architectures=["BertForPreTraining"])


# How a bert_jax leaf relates to its Hugging Face tensor: (to bert_jax, to Hugging Face), given (heads, head_dim).
_KINDS = {
  "copy": (lambda t, h, d: t, lambda p, h, d: p),
  # torch Linear stores [out, in]; a Flax kernel is [in, out].
  "linear": (lambda t, h, d: t.T, lambda p, h, d: p.T),
  "split_heads": (lambda t, h, d: t.T.reshape(t.shape[1], h, d), lambda p, h, d: p.reshape(p.shape[0], -1).T),
  "merge_heads": (lambda t, h, d: t.T.reshape(h, d, t.shape[0]), lambda p, h, d: p.reshape(-1, p.shape[-1]).T),
  "head_bias": (lambda t, h, d: t.reshape(h, d), lambda p, h, d: p.reshape(-1)),
}


def _layer_norm(hf: str, ours: tuple) -> list:
  return [(f"{hf}.weight", ours + ("scale",), "copy"), (f"{hf}.bias", ours + ("bias",), "copy")]


def _dense(hf: str, ours: tuple, kernel="linear", bias="copy") -> list:
  return [(f"{hf}.weight", ours + ("kernel",), kernel), (f"{hf}.bias", ours + ("bias",), bias)]


def _encoder_table(num_layers: int, prefix: str) -> list:
  """(HF tensor name, path in bert_jax params, kind) for the encoder and pooler."""
  embed = ("bert", "embeddings")
  table = [
    (f"{prefix}embeddings.word_embeddings.weight", embed + ("word_embeddings", "embedding"), "copy"),
    (f"{prefix}embeddings.position_embeddings.weight", embed + ("position_embeddings", "embedding"), "copy"),
    (f"{prefix}embeddings.token_type_embeddings.weight", embed + ("token_type_embeddings", "embedding"), "copy"),
    *_layer_norm(f"{prefix}embeddings.LayerNorm", embed + ("layer_norm",)),
    *_dense(f"{prefix}pooler.dense", ("bert", "pooler")),
  ]
  for i in range(num_layers):
    hf, ours = f"{prefix}encoder.layer.{i}", ("bert", f"layer_{i}")
    for name in ("query", "key", "value"):
      table += _dense(f"{hf}.attention.self.{name}", ours + ("attention", name), "split_heads", "head_bias")
    table += _dense(f"{hf}.attention.output.dense", ours + ("attention", "output"), "merge_heads")
    table += _layer_norm(f"{hf}.attention.output.LayerNorm", ours + ("attention_layer_norm",))
    table += _dense(f"{hf}.intermediate.dense", ours + ("intermediate",))
    table += _dense(f"{hf}.output.dense", ours + ("output",))
    table += _layer_norm(f"{hf}.output.LayerNorm", ours + ("output_layer_norm",))
  return table


HEADS_TABLE = [
  *_dense("cls.predictions.transform.dense", ("mlm_transform",)),
  *_layer_norm("cls.predictions.transform.LayerNorm", ("mlm_layer_norm",)),
  ("cls.predictions.bias", ("mlm_output_bias",), "copy"),
  *_dense("cls.seq_relationship", ("nsp",)),
]
# Fine-tuning heads (model/heads.py), named as transformers' BertFor{SequenceClassification, TokenClassification,
# MultipleChoice} (`classifier`) and BertForQuestionAnswering (`qa_outputs`); their width is the task's.
TASK_HEADS = ("classifier", "qa_outputs")
TASK_HEADS_TABLE = [entry for head in TASK_HEADS for entry in _dense(head, (head,))]
# The decoder is tied to the word embeddings (its bias to `cls.predictions.bias`): files may hold copies.
TIED = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
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


def params_from_hf(tensors: Mapping[str, np.ndarray], config: BertConfig) -> dict:
  """Converts HF BERT tensors to a bert_jax params tree (nested dicts of float32 numpy arrays, unrolled layers).

  The result always holds `bert` (encoder and pooler); it also holds the pretraining heads
  (`mlm_transform`, `mlm_layer_norm`, `mlm_output_bias`, `nsp`) when the file has them, and a fine-tuning head
  (`classifier` or `qa_outputs`, as in `transformers`' BERT task models) when it has one. Raises ValueError,
  naming the tensors, if the encoder is incomplete, if a shape disagrees with `config`, if the heads are
  only partly present, or if the MLM decoder is not tied to the word embeddings.
  """
  tensors = {_canonical(name): value for name, value in tensors.items()}
  prefix = "bert." if any(name.startswith("bert.") for name in tensors) else ""
  has_heads = any(name.startswith("cls.") for name in tensors)
  table = _encoder_table(config.num_layers, prefix) + (HEADS_TABLE if has_heads else [])
  table += [entry for entry in TASK_HEADS_TABLE if entry[0].split(".")[0] in {n.split(".")[0] for n in tensors}]
  if f"{prefix}pooler.dense.weight" not in tensors and any(path[0] in TASK_HEADS for _, path, _ in table):
    # transformers' token-classification and question-answering models have no pooler: it stays fresh here.
    table = [entry for entry in table if entry[1][:2] != ("bert", "pooler")]

  missing = [hf for hf, _, _ in table if hf not in tensors]
  if missing:
    raise ValueError(
      f"The Hugging Face weights lack {len(missing)} tensor(s) that a BERT with "
      f"num_layers={config.num_layers} needs: {missing[:8]}{' ...' if len(missing) > 8 else ''}"
    )
  used = {hf for hf, _, _ in table} | set(TIED)
  unexpected = [name for name in tensors if name not in used and not name.endswith(_IGNORED_SUFFIXES)]
  if unexpected:
    raise ValueError(
      f"The Hugging Face weights hold tensors that this config has no place for (more layers "
      f"than num_layers={config.num_layers}, or another architecture?): {unexpected[:8]}"
    )
  for tied, source in zip(TIED, (f"{prefix}embeddings.word_embeddings.weight", "cls.predictions.bias"), strict=True):
    if tied in tensors and not np.array_equal(tensors[tied], tensors[source]):
      raise ValueError(
        f"{tied} differs from {source}; bert_jax ties the MLM decoder to the word embeddings as BERT does, so an "
        "untied decoder cannot be loaded."
      )

  expected = _expected_shapes(config)
  params: dict = {}
  for hf, path, kind in table:
    shape = np.shape(tensors[hf])
    if path[0] in TASK_HEADS:  # The task's width: only the input side is the model's.
      expected["/".join(path)] = (config.hidden_size, shape[0]) if path[-1] == "kernel" else shape
    try:
      value = np.asarray(_KINDS[kind][0](np.asarray(tensors[hf]), config.num_heads, config.head_dim), np.float32)
    except ValueError:  # A reshape into heads that cannot fit.
      value = None
    if value is None or value.shape != expected["/".join(path)]:
      raise ValueError(
        f"Hugging Face tensor {hf} has shape {shape}, which does not fit this config "
        f"(hidden_size={config.hidden_size}, num_heads={config.num_heads}, "
        f"intermediate_size={config.intermediate_size}, vocab_size={config.vocab_size}, "
        f"max_position_embeddings={config.max_position_embeddings}, "
        f"type_vocab_size={config.type_vocab_size})."
      )
    node = params
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value
  return params


def hf_from_params(params: Mapping, config: BertConfig) -> dict[str, np.ndarray]:
  """A bert_jax params tree (unrolled layers; heads optional) -> `BertForPreTraining` tensors (or, with a task
  head, the task model's) as numpy, named and laid out as `transformers` saves them (tied decoder tensors left
  out)."""
  flat = traverse_util.flatten_dict(params)
  has_heads = "nsp" in params
  table = _encoder_table(config.num_layers, "bert.") + (HEADS_TABLE if has_heads else [])
  table += [entry for entry in TASK_HEADS_TABLE if entry[1][0] in params]
  tensors = {}
  for hf, path, kind in table:
    if path not in flat:
      raise ValueError(f"The params lack {'/'.join(path)} (for {hf}); are the layers scanned? Convert them first.")
    value = np.asarray(jax.device_get(flat[path]), np.float32)
    tensors[hf] = np.ascontiguousarray(_KINDS[kind][1](value, config.num_heads, config.head_dim))
  return tensors


def _expected_shapes(config: BertConfig) -> dict[str, tuple]:
  """'/'-joined param path -> shape of the unrolled model (abstractly: nothing is allocated)."""
  boxed = abstract_params(dataclasses.replace(config, scan_layers=False))
  flat = traverse_util.flatten_dict(nn.meta.unbox(boxed), sep="/")
  return {path: value.shape for path, value in flat.items()}
