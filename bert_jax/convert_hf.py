"""Hugging Face BERT weights -> bert_jax params.

Reads the tensor names of `BertForPreTraining` (prefix `bert.` and the `cls.` heads) or of `BertModel` (no
prefix, no heads), from a `model.safetensors` file or from a dict of numpy arrays (a PyTorch `state_dict`
turned into numpy). Old Google-converted files name LayerNorm parameters `gamma`/`beta`; both spellings load.
"""

from collections.abc import Mapping

import flax.linen as nn
import jax
import numpy as np
from flax import traverse_util

from bert_jax.model import BertForPretraining
from bert_jax.model_config import BertConfig


def hf_config_dict(config: BertConfig) -> dict:
  """The Hugging Face `BertConfig` fields (as in its `config.json`) of the same architecture."""
  return dict(
    vocab_size=config.vocab_size,
    hidden_size=config.hidden_size,
    num_hidden_layers=config.num_layers,
    num_attention_heads=config.num_heads,
    intermediate_size=config.intermediate_size,
    max_position_embeddings=config.max_position_embeddings,
    type_vocab_size=config.type_vocab_size,
    hidden_act="gelu",
    hidden_dropout_prob=config.hidden_dropout_prob,
    attention_probs_dropout_prob=config.attention_dropout_prob,
    initializer_range=config.initializer_range,
    layer_norm_eps=config.layer_norm_eps,
  )


def _linear(weight):  # torch Linear stores [out, in]; a Flax kernel is [in, out].
  return np.asarray(weight).T


def _layer_norm(hf: str, ours: tuple) -> list:
  return [(f"{hf}.weight", ours + ("scale",), np.asarray), (f"{hf}.bias", ours + ("bias",), np.asarray)]


def _dense(hf: str, ours: tuple, kernel_fn=_linear, bias_fn=np.asarray) -> list:
  return [(f"{hf}.weight", ours + ("kernel",), kernel_fn), (f"{hf}.bias", ours + ("bias",), bias_fn)]


def _encoder_table(config: BertConfig, prefix: str) -> list:
  """(HF tensor name, path in bert_jax params, numpy transform) for the encoder and pooler."""
  heads, head_dim, hidden = config.num_heads, config.head_dim, config.hidden_size
  split_heads = lambda w: _linear(w).reshape(hidden, heads, head_dim)  # noqa: E731
  merge_heads = lambda w: _linear(w).reshape(heads, head_dim, hidden)  # noqa: E731
  head_bias = lambda b: np.asarray(b).reshape(heads, head_dim)  # noqa: E731
  embed = ("bert", "embeddings")
  table = [
    (f"{prefix}embeddings.word_embeddings.weight", embed + ("word_embeddings", "embedding"), np.asarray),
    (f"{prefix}embeddings.position_embeddings.weight", embed + ("position_embeddings", "embedding"), np.asarray),
    (f"{prefix}embeddings.token_type_embeddings.weight", embed + ("token_type_embeddings", "embedding"), np.asarray),
    *_layer_norm(f"{prefix}embeddings.LayerNorm", embed + ("layer_norm",)),
    *_dense(f"{prefix}pooler.dense", ("bert", "pooler")),
  ]
  for i in range(config.num_layers):
    hf, ours = f"{prefix}encoder.layer.{i}", ("bert", f"layer_{i}")
    for name in ("query", "key", "value"):
      table += _dense(f"{hf}.attention.self.{name}", ours + ("attention", name), split_heads, head_bias)
    table += _dense(f"{hf}.attention.output.dense", ours + ("attention", "output"), merge_heads)
    table += _layer_norm(f"{hf}.attention.output.LayerNorm", ours + ("attention_layer_norm",))
    table += _dense(f"{hf}.intermediate.dense", ours + ("intermediate",))
    table += _dense(f"{hf}.output.dense", ours + ("output",))
    table += _layer_norm(f"{hf}.output.LayerNorm", ours + ("output_layer_norm",))
  return table


_HEADS_TABLE = [
  *_dense("cls.predictions.transform.dense", ("mlm_transform",)),
  *_layer_norm("cls.predictions.transform.LayerNorm", ("mlm_layer_norm",)),
  ("cls.predictions.bias", ("mlm_output_bias",), np.asarray),
  *_dense("cls.seq_relationship", ("nsp",)),
]

# Tensors that carry nothing bert_jax needs: buffers, and the decoder tied to the word embeddings.
_IGNORED_SUFFIXES = ("embeddings.position_ids", "cls.predictions.decoder.bias")


def _canonical(name: str) -> str:
  return name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")


def load_safetensors(path: str) -> dict[str, np.ndarray]:
  """Every tensor of a `.safetensors` file as float32 numpy arrays."""
  from safetensors.numpy import load_file  # Only needed for this format; `safetensors` ships with transformers.

  return {name: np.asarray(tensor, np.float32) for name, tensor in load_file(path).items()}


def params_from_hf(tensors: Mapping[str, np.ndarray], config: BertConfig) -> dict:
  """Converts HF BERT tensors to a bert_jax params tree (nested dicts of float32 numpy arrays).

  The result always holds `bert` (encoder and pooler); it also holds the pretraining heads
  (`mlm_transform`, `mlm_layer_norm`, `mlm_output_bias`, `nsp`) when the file has them. Raises ValueError,
  naming the tensors, if the encoder is incomplete, if a shape disagrees with `config`, if the heads are
  only partly present, or if the MLM decoder is not tied to the word embeddings.
  """
  tensors = {_canonical(name): value for name, value in tensors.items()}
  prefix = "bert." if any(name.startswith("bert.") for name in tensors) else ""
  encoder_table = _encoder_table(config, prefix)
  has_heads = any(name.startswith("cls.") for name in tensors)
  table = encoder_table + (_HEADS_TABLE if has_heads else [])

  missing = [hf for hf, _, _ in table if hf not in tensors]
  if missing:
    raise ValueError(
      f"The Hugging Face weights lack {len(missing)} tensor(s) that a BERT with "
      f"num_layers={config.num_layers} needs: {missing[:8]}{' ...' if len(missing) > 8 else ''}"
    )
  used = {hf for hf, _, _ in table}
  unexpected = [
    name
    for name in tensors
    if name not in used and not name.endswith(_IGNORED_SUFFIXES) and name != "cls.predictions.decoder.weight"
  ]
  if unexpected:
    raise ValueError(
      f"The Hugging Face weights hold tensors that this config has no place for (more layers "
      f"than num_layers={config.num_layers}, or another architecture?): {unexpected[:8]}"
    )

  decoder = tensors.get("cls.predictions.decoder.weight")
  word_embeddings = tensors[f"{prefix}embeddings.word_embeddings.weight"]
  if decoder is not None and not np.array_equal(decoder, word_embeddings):
    raise ValueError(
      "cls.predictions.decoder.weight differs from the word embeddings; bert_jax ties the "
      "MLM decoder to the word embeddings as BERT does, so an untied decoder cannot be loaded."
    )

  expected = _expected_shapes(config)
  params: dict = {}
  for hf, path, transform in table:
    shape = np.shape(tensors[hf])
    try:
      value = np.asarray(transform(tensors[hf]), np.float32)
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


def _expected_shapes(config: BertConfig) -> dict[str, tuple]:
  """'/'-joined param path -> shape, from the model itself (abstractly: nothing is allocated)."""

  def init():
    ids = jax.numpy.zeros((1, 1), jax.numpy.int32)
    return BertForPretraining(config).init(jax.random.key(0), ids, ids, ids, ids)["params"]

  flat = traverse_util.flatten_dict(nn.meta.unbox(jax.eval_shape(init)), sep="/")
  return {path: value.shape for path, value in flat.items()}
