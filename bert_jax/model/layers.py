"""The encoder's transformer layers and how they are stacked: one post-LN layer, its rematerialisation, the two
parameter layouts and the sharing of parameters across layers; and the building blocks every module of the model
uses (BERT's dense layer and LayerNorm, the activation, the activation sharding constraints).

`make_stack(config)` builds, inside a module's `setup`, the optional projection of the embeddings to the hidden
width (`embeddings_project`, when `config.embedding_width` differs from `hidden_size`: ALBERT, ELECTRA) and the
layers; the parameters land directly in the calling module's scope:

  layer_sharing  unrolled                                      scanned (`scan_layers`)
  "none"         `layer_{i}/...`                                `layers/...`, stacked on a leading layer axis
  "all"          `shared_layer/...`, called num_layers times    `shared_layer/...`, broadcast to every step
  "attention"    `shared_attention`, `shared_attention_layer_norm`, and `layer_{i}/{intermediate,output,
                 output_layer_norm}`                            refused (BertConfig)
  "ffn"          `shared_intermediate`, `shared_output`, `shared_output_layer_norm`, and `layer_{i}/{attention,
                 attention_layer_norm}`                         refused (BertConfig)

Shared parameters are never named `layers`: LAMB (train/optim.py) takes a trust ratio per slice of that key's
leading axis.
"""

import contextlib
import contextvars
import dataclasses
import functools
from collections.abc import Mapping, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.model import attention
from bert_jax.model.bert_config import BertConfig

Array = jax.Array

HIDDEN = ("act_batch", "act_length", "act_embed")
_HEADS = ("act_batch", "act_length", "act_heads", "act_kv")
# model.hidden_act: BERT's GELU is the exact (erf) form; "gelu_new" is the tanh approximation (ALBERT; transformers'
# NewGELUActivation).
ACTIVATIONS = {
  "gelu": functools.partial(jax.nn.gelu, approximate=False),
  "gelu_new": functools.partial(jax.nn.gelu, approximate=True),
}


def kernel_init(config: BertConfig, axes: tuple):
  return nn.with_logical_partitioning(nn.initializers.truncated_normal(config.initializer_range), axes)


def zeros(axes: tuple):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


def dense(config: BertConfig, features, kernel_axes: tuple, axis=-1, name=None) -> nn.DenseGeneral:
  """A dense layer with BERT's init; the bias is named by the output axes of the kernel."""
  num_out = 1 if isinstance(features, int) else len(features)
  return nn.DenseGeneral(
    features=features,
    axis=axis,
    dtype=config.compute_dtype,
    param_dtype=jnp.float32,
    kernel_init=kernel_init(config, kernel_axes),
    bias_init=zeros(kernel_axes[-num_out:]),
    name=name,
  )


def layer_norm(config: BertConfig, name: str) -> nn.LayerNorm:
  return nn.LayerNorm(
    epsilon=config.layer_norm_eps,
    dtype=config.compute_dtype,
    param_dtype=jnp.float32,
    scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)),
    bias_init=zeros(("embed",)),
    name=name,
  )


_ACTIVATION_RULES: contextvars.ContextVar[tuple] = contextvars.ContextVar("activation_rules", default=())


@contextlib.contextmanager
def activation_rules(rules: Sequence[tuple]):
  """While tracing inside this context (and a mesh context), activations are constrained by `rules`.

  Not flax's `nn.logical_axis_rules`: under it, DenseGeneral's parameter shape check applies the kernel's
  logical names to its flattened 2-D init and fails.
  """
  token = _ACTIVATION_RULES.set(tuple(tuple(rule) for rule in rules))
  try:
    yield
  finally:
    _ACTIVATION_RULES.reset(token)


def constrain(x: Array, logical_axes: tuple) -> Array:
  rules = _ACTIVATION_RULES.get()
  return nn.with_logical_constraint(x, logical_axes, rules=rules) if rules else x


class SelfAttention(nn.Module):
  """Multi-head self-attention within each token's instance (see `attention.attention_mask`), by the kernel
  `config.attention` picks for the platform (see model/attention.py)."""

  config: BertConfig

  @nn.compact
  def __call__(self, x: Array, input_mask: Array, deterministic: bool, head_mask: Array | None = None) -> Array:
    # x: [batch, seq, hidden]; input_mask: [batch, seq] instance numbers (0: padding); head_mask: [heads] or None.
    config = self.config
    heads = (config.num_heads, config.head_dim)
    query, key, value = (
      constrain(dense(config, heads, ("embed", "heads", "kv"), name=name)(x), _HEADS)
      for name in ("query", "key", "value")
    )
    query = query / jnp.sqrt(config.head_dim).astype(query.dtype)
    kind = attention.resolve(
      config.attention,
      attention.current_platform(),
      attention_dropout_prob=config.attention_dropout_prob,
      dtype=config.dtype,
    )
    if kind == "splash":
      context = attention.splash_attention(query, key, value, input_mask, rules=_ACTIVATION_RULES.get())
    elif kind == "cudnn":
      context = attention.dot_product_attention(query, key, value, input_mask, implementation="cudnn")
    else:
      scores = jnp.einsum("bqhd,bkhd->bhqk", query, key).astype(jnp.float32)  # [batch, heads, q, k]
      # `where`, not an additive -1e4: a padded key gets exactly zero weight, in any dtype.
      scores = jnp.where(attention.attention_mask(input_mask), scores, jnp.finfo(jnp.float32).min)
      probs = jax.nn.softmax(scores, axis=-1)
      self.sow("intermediates", "attention_probs", probs)  # Kept only when `intermediates` is mutable.
      probs = probs.astype(config.compute_dtype)
      probs = nn.Dropout(config.attention_dropout_prob)(probs, deterministic=deterministic)
      context = jnp.einsum("bhqk,bkhd->bqhd", probs, value)
    if head_mask is not None:  # transformers' head_mask scales the probabilities; a head's context is linear in them.
      context = context * head_mask.astype(context.dtype)[:, None]
    context = constrain(context, _HEADS)  # [batch, seq, heads, head_dim]
    return dense(config, config.hidden_size, ("heads", "kv", "embed"), axis=(-2, -1), name="output")(context)


# A layer's sub-modules by name, and the names each partial `layer_sharing` mode shares.
_SUBLAYERS = {
  "attention": lambda config, name: SelfAttention(config, name=name),
  "attention_layer_norm": layer_norm,
  "intermediate": lambda config, name: dense(config, config.intermediate_size, ("embed", "mlp"), name=name),
  "output": lambda config, name: dense(config, config.hidden_size, ("mlp", "embed"), name=name),
  "output_layer_norm": layer_norm,
}
_SHARED_SUBLAYERS = {
  "attention": ("attention", "attention_layer_norm"),
  "ffn": ("intermediate", "output", "output_layer_norm"),
}


class TransformerLayer(nn.Module):
  """One post-LN encoder layer: attention, add & norm, feed-forward, add & norm. `shared` maps sub-module names
  (of `_SUBLAYERS`) to modules that other layers use too (partial `layer_sharing`); the rest are the layer's own."""

  config: BertConfig
  shared: Mapping[str, nn.Module] | None = None

  @nn.compact
  def __call__(self, x: Array, input_mask: Array, deterministic: bool, head_mask: Array | None = None) -> Array:
    config = self.config
    shared = self.shared or {}
    sub = {name: shared[name] if name in shared else make(config, name) for name, make in _SUBLAYERS.items()}
    dropout = nn.Dropout(config.hidden_dropout_prob)
    attended = sub["attention"](x, input_mask, deterministic, head_mask)
    x = sub["attention_layer_norm"](x + dropout(attended, deterministic=deterministic))
    hidden = ACTIVATIONS[config.hidden_act](sub["intermediate"](x))
    hidden = constrain(hidden, ("act_batch", "act_length", "act_mlp"))
    out = sub["output"](hidden)
    x = constrain(sub["output_layer_norm"](x + dropout(out, deterministic=deterministic)), HIDDEN)
    self.sow("intermediates", "hidden_states", x)
    return x


class _ScannedLayer(TransformerLayer):
  """A TransformerLayer in `nn.scan`'s (carry, inputs) -> (carry, outputs) form."""

  def __call__(self, x: Array, input_mask: Array, deterministic: bool, head_mask=None) -> tuple[Array, None]:
    return super().__call__(x, input_mask, deterministic, head_mask), None


_REMAT_POLICIES = {"full": None, "save_dots": jax.checkpoint_policies.checkpoint_dots}


def _layer_class(config: BertConfig, layer_cls: type[nn.Module]) -> type[nn.Module]:
  if config.remat == "none":
    return layer_cls
  # `deterministic` (argument 3, counting self) switches dropout: static, not traced.
  return nn.remat(
    layer_cls, policy=_REMAT_POLICIES[config.remat], prevent_cse=not config.scan_layers, static_argnums=(3,)
  )


def _scanned_layers(config: BertConfig) -> nn.Module:
  """All layers as one scanned module: parameters stacked on a leading `layers` axis, one dropout key each."""
  return nn.scan(
    _layer_class(config, _ScannedLayer),
    variable_axes={"params": 0, "intermediates": 0},
    split_rngs={"params": True, "dropout": True},
    in_axes=(nn.broadcast, nn.broadcast, 0),  # input_mask, deterministic, each layer's head mask.
    length=config.num_layers,
    metadata_params={nn.PARTITION_NAME: "layers"},
  )(config, name="layers")


def _scanned_shared_layer(config: BertConfig) -> nn.Module:
  """One layer's parameters, broadcast to every step of the scan; one dropout key per step (else every layer
  would drop the same units)."""
  return nn.scan(
    _layer_class(config, _ScannedLayer),
    variable_broadcast="params",
    variable_axes={"intermediates": 0},
    split_rngs={"params": False, "dropout": True},
    in_axes=(nn.broadcast, nn.broadcast, 0),  # input_mask, deterministic, each layer's head mask.
    length=config.num_layers,
  )(config, name="shared_layer")


def sublayer_path(config: BertConfig, layer: int, name: str) -> tuple[str, ...]:
  """Where the sub-module `name` (of `_SUBLAYERS`) of layer `layer` lives below the encoder, unrolled."""
  if config.layer_sharing == "all":
    return ("shared_layer", name)
  if name in _SHARED_SUBLAYERS.get(config.layer_sharing, ()):
    return (f"shared_{name}",)
  return (f"layer_{layer}", name)


@dataclasses.dataclass(frozen=True)
class Stack:
  """The embeddings' projection (None when the tables are hidden_size wide) and the layers, as `make_stack` built
  them in a module's `setup`: `stack(stack.project(embedded), input_mask, deterministic)` -> [batch, seq, hidden]."""

  projection: nn.Module | None
  layers: tuple[nn.Module, ...]  # Called in order; a shared layer appears num_layers times.
  scanned: bool  # `layers` is one scanned module, in nn.scan's (carry, outputs) form.

  def project(self, embedded: Array) -> Array:
    """[batch, seq, embedding_width] -> [batch, seq, hidden]."""
    return embedded if self.projection is None else constrain(self.projection(embedded), HIDDEN)

  def __call__(self, x: Array, input_mask: Array, deterministic: bool, head_mask: Array | None = None) -> Array:
    """head_mask: [layers, heads], each head's output scaled by its value (0: the head is pruned), or None."""
    if self.scanned:
      return self.layers[0](x, input_mask, deterministic, head_mask)[0]
    for i, layer in enumerate(self.layers):
      x = layer(x, input_mask, deterministic, None if head_mask is None else head_mask[i])
    return x


def make_stack(config: BertConfig) -> Stack:
  """The projection and the layers of `config`, created in the calling module's `setup` (their parameters are
  its children; see the module docstring for the names)."""
  project = None
  if config.embedding_width != config.hidden_size:
    project = dense(config, config.hidden_size, ("embed_out", "embed"), name="embeddings_project")
  sharing, count = config.layer_sharing, config.num_layers
  if config.scan_layers:  # "none" or "all" (BertConfig refuses partial sharing with scan_layers).
    scanned = _scanned_layers(config) if sharing == "none" else _scanned_shared_layer(config)
    return Stack(project, (scanned,), scanned=True)
  layer_cls = _layer_class(config, TransformerLayer)
  if sharing == "all":
    return Stack(project, (layer_cls(config, name="shared_layer"),) * count, scanned=False)
  names = _SHARED_SUBLAYERS.get(sharing, ())
  shared = {name: _SUBLAYERS[name](config, f"shared_{name}") for name in names}
  layers = tuple(layer_cls(config, shared=shared or None, name=f"layer_{i}") for i in range(count))
  return Stack(project, layers, scanned=False)
