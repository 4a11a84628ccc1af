"""Multi-head self-attention, the sub-module every layer part attends with: the query, key, value and output
projections, and the kernel `config.attention` picks for the platform (model/attention.py), masked by the layer's
span (model/attention_patterns.py)."""

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.model import attention, remat
from bert_jax.model.bert_config import BertConfig
from bert_jax.model.layers import Dropout, constrain, current_activation_rules, dense

Array = jax.Array

_HEADS = ("act_batch", "act_length", "act_heads", "act_kv")


class SelfAttention(nn.Module):
  """Multi-head self-attention within each token's instance (see `attention.attention_mask`) and the span's keys."""

  config: BertConfig

  @nn.compact
  def __call__(
    self, x: Array, input_mask: Array, deterministic: bool, head_mask: Array | None = None, *, span
  ) -> Array:
    # x: [batch, seq, hidden]; input_mask: [batch, seq] instance numbers (0: padding); head_mask: [heads] or None;
    # span: which keys each query sees (a span of model/attention_patterns.py).
    config = self.config
    heads = (config.num_heads, config.head_dim)
    query, key, value = (
      remat.tag(constrain(dense(config, heads, ("embed", "heads", "kv"), name=name)(x), _HEADS), tag)
      for name, tag in (("query", remat.QUERY), ("key", remat.KEY), ("value", remat.VALUE))
    )
    query = query / jnp.sqrt(config.head_dim).astype(query.dtype)
    kind = attention.resolve(
      config.attention,
      attention.current_platform(),
      attention_dropout_prob=config.attention_dropout_prob,
      dtype=config.dtype,
    )
    if kind == "splash":
      context = attention.splash_attention(
        query, key, value, input_mask, rules=current_activation_rules(), splash_mask=span.splash_mask
      )
    elif kind == "cudnn":
      context = attention.dot_product_attention(
        query, key, value, input_mask, implementation="cudnn", mask=span.mask(input_mask)
      )
    else:
      scores = jnp.einsum("bqhd,bkhd->bhqk", query, key).astype(jnp.float32)  # [batch, heads, q, k]
      # `where`, not an additive -1e4: a padded key gets exactly zero weight, in any dtype.
      scores = jnp.where(span.mask(input_mask), scores, jnp.finfo(jnp.float32).min)
      probs = jax.nn.softmax(scores, axis=-1)
      self.sow("intermediates", "attention_probs", probs)  # Kept only when `intermediates` is mutable.
      probs = probs.astype(config.compute_dtype)
      probs = Dropout(config.attention_dropout_prob)(probs, deterministic=deterministic)
      context = jnp.einsum("bhqk,bkhd->bqhd", probs, value)
    if head_mask is not None:  # transformers' head_mask scales the probabilities; a head's context is linear in them.
      context = context * head_mask.astype(context.dtype)[:, None]
    context = remat.tag(constrain(context, _HEADS), remat.CONTEXT)  # [batch, seq, heads, head_dim]
    return dense(config, config.hidden_size, ("heads", "kv", "embed"), axis=(-2, -1), name="output")(context)


def make_self_attention(config: BertConfig, name: str) -> SelfAttention:
  """A layer's `attention` sub-module (or the one layers share, `layer_sharing="attention"`)."""
  return SelfAttention(config, name=name)
