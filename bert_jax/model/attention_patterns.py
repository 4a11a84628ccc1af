"""Attention patterns: which keys each layer's queries attend to, and with which rotary base, as one span per layer.

An attention pattern is a function `pattern(config, **arguments) -> tuple of spans`, one per layer (model/parts.py's
ATTENTION_PATTERNS; its keyword arguments, if any, are those an architecture may give it). A span says which keys a
query may see within its own instance: all of them (`window` 0), or those within `window // 2` tokens on either side
(a local layer, as ModernBERT's), and the base of the rotary positions the layer's queries and keys take
(`rope_theta`; 0: none, as BERT's position table). It gives them in the
form each attention kernel of model/attention.py takes:

  mask(input_mask)   [batch, seq] instance numbers -> [batch, 1, q, k] bool, for the "xla" and "cudnn" kernels;
  splash_mask(seq)   splash's mask object over `seq` tokens (the segment ids keep each token to its instance);
  keys_per_query(seq)  how many keys a query attends to in a sequence of `seq` (for model FLOPs, bert_jax/flops.py).

Spans are frozen and hashable: a layer holds its span. One layer module run for several layers whose spans differ
(a scan over ModernBERT's local and global layers) holds a `SpanTable` of them and takes each layer's choice as a
traced index (model/stack.py): the mask and the rotary base are then chosen by it, and splash switches between one
compiled kernel per distinct span. Any object with `mask`, `splash_mask`, `keys_per_query` and `rope_theta` is a
span (`Span` is the one the patterns here make).
"""

import dataclasses

import jax
import jax.numpy as jnp

from bert_jax.model import attention
from bert_jax.model.bert_config import BertConfig


def _local(input_mask: jax.Array, half_window) -> jax.Array:
  """[batch, 1, q, k] bool: keys within `half_window` tokens of the query (a traced number or an int)."""
  seq = input_mask.shape[-1]
  distance = jnp.abs(jnp.arange(seq)[:, None] - jnp.arange(seq)[None, :])
  return (distance <= half_window)[None, None]


@dataclasses.dataclass(frozen=True)
class Span:
  """Which keys a layer's queries see within their instance, and the layer's rotary base (see the module
  docstring). `window` 0 with `rope_theta` 0 is BERT's attention."""

  window: int = 0  # 0: global; else the query sees keys within window // 2 tokens on each side.
  rope_theta: float = 0.0  # 0: no rotary positions.

  def mask(self, input_mask: jax.Array) -> jax.Array:
    mask = attention.attention_mask(input_mask)
    return mask & _local(input_mask, self.window // 2) if self.window else mask

  def splash_mask(self, seq: int):
    if not self.window:
      return attention.full_splash_mask(seq)
    return attention.local_splash_mask(seq, self.window // 2)

  def keys_per_query(self, seq: int) -> int:
    return min(seq, self.window + 1) if self.window else seq


@dataclasses.dataclass(frozen=True)
class SpanTable:
  """The distinct spans of the layers one module runs (`spans`) and which each layer takes (`choices`, an index into
  `spans` per layer): a scanned stack hands each layer its index as a traced number."""

  spans: tuple[Span, ...]
  choices: tuple[int, ...]

  @classmethod
  def of(cls, layer_spans: tuple[Span, ...]) -> "SpanTable":
    distinct = tuple(dict.fromkeys(layer_spans))
    if len({bool(span.rope_theta) for span in distinct}) > 1:
      raise ValueError(f"Layers run by one module must all use rotary positions or none: {distinct}.")
    return cls(distinct, tuple(distinct.index(span) for span in layer_spans))

  def mask(self, input_mask: jax.Array, choice: jax.Array) -> jax.Array:
    """The chosen span's mask; `choice` a traced index into `spans` (each span's boolean mask is computed: a few
    [batch, 1, q, k] booleans, beside the float32 scores)."""
    return jnp.stack([span.mask(input_mask) for span in self.spans])[choice]

  def rope_theta(self, choice: jax.Array) -> jax.Array:
    """The chosen span's rotary base (the spans all have one, or none has: then 0)."""
    return jnp.asarray([span.rope_theta for span in self.spans], jnp.float32)[choice]


def global_attention(config: BertConfig) -> tuple[Span, ...]:
  """Global attention in every layer, at the config's rotary base (BERT: none)."""
  return (Span(0, config.rope_theta),) * config.num_layers


def local_global(config: BertConfig) -> tuple[Span, ...]:
  """ModernBERT's: layer i attends globally (at `rope_theta`) when i is a multiple of `global_attention_every`, else
  locally within `local_attention` (at `local_rope_theta`, or `rope_theta` when that is 0)."""
  local = Span(config.local_attention, config.local_rope_theta or config.rope_theta)
  every = config.global_attention_every
  return tuple(
    Span(0, config.rope_theta) if i % every == 0 or not config.local_attention else local
    for i in range(config.num_layers)
  )
