"""The building blocks every part of the model is made of: BERT's dense layer and LayerNorm (with its initialisation
and the logical axis names of their parameters), the activations `hidden_act` names, and the activation sharding
constraints (`activation_rules`, `constrain`).

The parts themselves (embeddings, layers, feed-forwards, attention patterns, heads) are in the modules model/parts.py
lists; model/stack.py stacks the layers.
"""

import contextlib
import contextvars
import functools
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.model import remat
from bert_jax.model.bert_config import BertConfig

Array = jax.Array

HIDDEN = ("act_batch", "act_length", "act_embed")
# model.hidden_act: BERT's GELU is the exact (erf) form; "gelu_new" is the tanh approximation (ALBERT; transformers'
# NewGELUActivation).
ACTIVATIONS = {
  "gelu": functools.partial(jax.nn.gelu, approximate=False),
  "gelu_new": functools.partial(jax.nn.gelu, approximate=True),
  "silu": jax.nn.silu,
}


def kernel_init(config: BertConfig, axes: tuple):
  return nn.with_logical_partitioning(nn.initializers.truncated_normal(config.initializer_range), axes)


def zeros(axes: tuple):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


def merged_output_dot(lhs: jax.Array, rhs: jax.Array, dimension_numbers, precision=None) -> jax.Array:
  """`lax.dot_general` for a kernel [in, *features] contracted on its first axis, as one matmul into the features
  merged ([..., prod(features)]), then reshaped. The same products and sums; but the matmul's output, which the
  remat policies keep, is [..., heads * head_dim] rather than [..., heads, 64]: XLA:TPU tiles an array's two minor
  dimensions in HBM by (8, 128), and a kept query laid out for splash's kernel (head_dim minor) took twice its bytes
  (docs/tpu.md, "Where the memory goes")."""
  (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
  if tuple(rhs_contract) != (0,) or lhs_batch or rhs_batch:
    raise ValueError(f"merged_output_dot contracts a kernel's first axis only, not {dimension_numbers}.")
  out = jax.lax.dot_general(lhs, rhs.reshape(rhs.shape[0], -1), ((lhs_contract, (0,)), ((), ())), precision=precision)
  return out.reshape(*out.shape[:-1], *rhs.shape[1:])


def dense(
  config: BertConfig, features, kernel_axes: tuple, axis=-1, name=None, bias=None, dot_general=None
) -> nn.DenseGeneral:
  """A dense layer with BERT's init; the bias (`bias`, default `config.linear_bias`: the encoder's and its heads'
  hidden layers; a task's output layer has one in every family) is named by the output axes of the kernel;
  `dot_general`: flax's, e.g. `merged_output_dot`."""
  num_out = 1 if isinstance(features, int) else len(features)
  return nn.DenseGeneral(
    dot_general=dot_general,
    features=features,
    axis=axis,
    use_bias=config.linear_bias if bias is None else bias,
    dtype=config.compute_dtype,
    param_dtype=jnp.float32,
    kernel_init=kernel_init(config, kernel_axes),
    bias_init=zeros(kernel_axes[-num_out:]),
    name=name,
  )


def layer_norm(config: BertConfig, name: str) -> nn.Module:
  """A norm over the hidden axis, of kind `config.norm`: LayerNorm (with a bias unless `config.norm_bias` is off) or
  RMSNorm (a scale only); statistics in float32 whatever the compute dtype (flax's)."""
  scale_init = nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",))
  if config.norm == "rms_norm":
    return nn.RMSNorm(
      epsilon=config.layer_norm_eps,
      dtype=config.compute_dtype,
      param_dtype=jnp.float32,
      scale_init=scale_init,
      name=name,
    )
  return nn.LayerNorm(
    epsilon=config.layer_norm_eps,
    use_bias=config.norm_bias,
    dtype=config.compute_dtype,
    param_dtype=jnp.float32,
    scale_init=scale_init,
    bias_init=zeros(("embed",)),
    name=name,
  )


class Dropout(nn.Dropout):
  """flax's Dropout, the same draw from the same key (its name in a module is flax's, `Dropout_0`, ...), with its
  mask named `remat.DROPOUT_MASK` for the remat policies that keep it (model/remat.py), packed eight to a byte: a
  kept mask costs an eighth of a boolean one (for BERT-Base at 512 tokens, 0.4 MiB instead of 3 MiB per row and
  layer for the attention's), and the backward pass unpacks it (element-wise work, no random draw)."""

  @nn.compact
  def __call__(self, inputs, deterministic: bool | None = None, rng=None):
    if self.broadcast_dims:
      raise ValueError("bert_jax's Dropout draws one mask value per element: broadcast_dims is not supported.")
    deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
    if self.rate == 0.0 or deterministic:
      return inputs
    if self.rate == 1.0:  # As flax: no NaN gradients.
      return jnp.zeros_like(inputs)
    keep_prob = 1.0 - self.rate
    mask = jax.random.bernoulli(self.make_rng(self.rng_collection) if rng is None else rng, keep_prob, inputs.shape)
    mask = _packed_for_backward(mask)
    return jax.lax.select(mask, inputs / keep_prob, jnp.zeros_like(inputs))


def _packed_for_backward(mask: Array) -> Array:
  """`mask` as it is, through its bits packed along the last axis: the packed form is what a policy keeps."""
  packed = remat.tag(jnp.packbits(mask, axis=-1), remat.DROPOUT_MASK)
  return jnp.unpackbits(packed, axis=-1, count=mask.shape[-1]).astype(bool)


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


def current_activation_rules() -> tuple:
  """The rules of the innermost `activation_rules` context (empty outside one)."""
  return _ACTIVATION_RULES.get()


def gather_positions(sequence: Array, positions: Array) -> Array:
  """[batch, seq, hidden], [batch, num_positions] -> [batch, num_positions, hidden]."""
  return jnp.take_along_axis(sequence, positions[:, :, None], axis=1)
