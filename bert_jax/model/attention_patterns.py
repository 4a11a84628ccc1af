"""Attention patterns: which keys each layer's queries attend to, as one span per layer.

An attention pattern is a function `pattern(config) -> tuple of spans`, one per layer (model/parts.py's
ATTENTION_PATTERNS). A span says which keys a query may see within its own instance, in the form each attention
kernel of model/attention.py takes:

  mask(input_mask)   [batch, seq] instance numbers -> [batch, 1, q, k] bool, for the "xla" and "cudnn" kernels;
  splash_mask(seq)   splash's mask object over `seq` tokens (the segment ids keep each token to its instance);
  keys_per_query(seq)  how many keys a query attends to in a sequence of `seq` (for model FLOPs, bert_jax/flops.py).

Spans are frozen and hashable: a layer holds its span, and one layer module run for several layers (a scanned stack,
`layer_sharing="all"`) needs them all alike (model/stack.py).
"""

import dataclasses
from typing import Protocol

import jax

from bert_jax.model import attention
from bert_jax.model.bert_config import BertConfig


class Span(Protocol):
  """What a layer's attention asks of its span (see the module docstring)."""

  def mask(self, input_mask: jax.Array) -> jax.Array: ...

  def splash_mask(self, seq: int): ...

  def keys_per_query(self, seq: int) -> int: ...


@dataclasses.dataclass(frozen=True)
class GlobalSpan:
  """Every query attends to every real token of its own instance (BERT's attention)."""

  def mask(self, input_mask: jax.Array) -> jax.Array:
    return attention.attention_mask(input_mask)

  def splash_mask(self, seq: int):
    return attention.full_splash_mask(seq)

  def keys_per_query(self, seq: int) -> int:
    return seq


def global_attention(config: BertConfig) -> tuple[GlobalSpan, ...]:
  """Global attention in every layer."""
  return (GlobalSpan(),) * config.num_layers
