"""Multi-head self-attention, the sub-module every layer part attends with: the query, key, value and output
projections, rotary positions on queries and keys where the layer's span has a base (model/rotary.py), and the
kernel `config.attention` picks for the platform (model/attention.py), masked by the layer's span
(model/attention_patterns.py)."""

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.model import attention, remat, rotary
from bert_jax.model.attention_patterns import SpanTable
from bert_jax.model.bert_config import BertConfig
from bert_jax.model.layers import Dropout, constrain, current_activation_rules, dense, merged_output_dot

Array = jax.Array

_HEADS = ("act_batch", "act_length", "act_heads", "act_kv")


class SelfAttention(nn.Module):
  """Multi-head self-attention within each token's instance (see `attention.attention_mask`) and the span's keys."""

  config: BertConfig

  @nn.compact
  def __call__(
    self,
    x: Array,
    input_mask: Array,
    deterministic: bool,
    head_mask: Array | None = None,
    *,
    span,
    positions: Array | None = None,
    choice: Array | None = None,
  ) -> Array:
    # x: [batch, seq, hidden]; input_mask: [batch, seq] instance numbers (0: padding); head_mask: [heads] or None;
    # span: which keys each query sees and the rotary base (a span of model/attention_patterns.py), or a SpanTable
    # and `choice`, the traced index of this layer's span in it; positions: [batch or 1, seq], each token's position
    # in its instance (for rotary positions; default 0, 1, ...).
    config = self.config
    heads = (config.num_heads, config.head_dim)
    query, key, value = (
      constrain(dense(config, heads, ("embed", "heads", "kv"), name=name, dot_general=merged_output_dot)(x), _HEADS)
      for name in ("query", "key", "value")
    )
    table = span if isinstance(span, SpanTable) else None
    if (table.spans[0] if table else span).rope_theta:  # A table's spans all have a base, or none has.
      theta = table.rope_theta(choice) if table else span.rope_theta
      positions = jnp.arange(x.shape[1])[None] if positions is None else positions
      query, key = rotary.rotate(query, positions, theta), rotary.rotate(key, positions, theta)
    query, key, value = (
      remat.tag_heads(projected, tag)
      for projected, tag in ((query, remat.QUERY), (key, remat.KEY), (value, remat.VALUE))
    )
    query = query / jnp.sqrt(config.head_dim).astype(query.dtype)
    kind = attention.choose_kernel(
      config.attention,
      attention.current_platform(),
      attention_dropout_prob=config.attention_dropout_prob,
      dtype=config.dtype,
    )
    if kind == "splash":
      masks = dict(splash_masks=[one.splash_mask for one in table.spans]) if table else {}
      context = attention.splash_attention(
        query,
        key,
        value,
        input_mask,
        rules=current_activation_rules(),
        splash_mask=None if table else span.splash_mask,
        choice=choice,
        **masks,
      )
    else:
      mask = table.mask(input_mask, choice) if table else span.mask(input_mask)
    if kind == "cudnn":
      context = attention.dot_product_attention(query, key, value, input_mask, implementation="cudnn", mask=mask)
    elif kind != "splash":
      scores = jnp.einsum("bqhd,bkhd->bhqk", query, key).astype(jnp.float32)  # [batch, heads, q, k]
      # `where`, not an additive -1e4: a padded key gets exactly zero weight, in any dtype.
      scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
      probs = jax.nn.softmax(scores, axis=-1)
      self.sow("intermediates", "attention_probs", probs)  # Kept only when `intermediates` is mutable.
      probs = probs.astype(config.compute_dtype)
      probs = Dropout(config.attention_dropout_prob)(probs, deterministic=deterministic)
      context = jnp.einsum("bhqk,bkhd->bqhd", probs, value)
    if head_mask is not None:  # transformers' head_mask scales the probabilities; a head's context is linear in them.
      context = context * head_mask.astype(context.dtype)[:, None]
    context = constrain(context, _HEADS)  # [batch, seq, heads, head_dim]
    return dense(config, config.hidden_size, ("heads", "kv", "embed"), axis=(-2, -1), name="output")(context)


def make_self_attention(config: BertConfig, name: str) -> SelfAttention:
  """A layer's `attention` sub-module (or the one layers share, `layer_sharing="attention"`)."""
  return SelfAttention(config, name=name)
