"""Pooler parts: what the encoder puts on each instance's [CLS] for the sentence head and BERT's task heads
(model/parts.py's POOLERS).

A pooler part is a `Pooler`: `make(config, name)`, the module holding its parameters, made in the encoder's setup as
`pooler` (`bert/pooler/...`); `apply(module, cls)` [..., hidden] -> [..., hidden]; and `flops_per_instance(config)`,
its forward matmul FLOPs at one [CLS] (bert_jax/flops.py). The entry "none" is no pooler: the encoder returns no
pooled output, and the family's task heads pool for themselves (ModernBERT's, model/task_heads.py).

"tanh" (BERT's): a dense layer H -> H, then tanh.
"""

import dataclasses
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.model.bert_config import BertConfig
from bert_jax.model.layers import dense

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Pooler:
  """One pooler part (see the module docstring)."""

  make: Callable[[BertConfig, str | None], nn.Module]
  apply: Callable[[nn.Module, Array], Array]
  flops_per_instance: Callable[[BertConfig], int]


def make_pooler(config: BertConfig, name: str | None = None) -> nn.Module:
  """The dense layer of BERT's pooler (then tanh), H -> H."""
  return dense(config, config.hidden_size, ("embed", "embed_out"), name=name)


TANH = Pooler(
  make=make_pooler,
  apply=lambda module, cls: jnp.tanh(module(cls)),
  flops_per_instance=lambda config: 2 * config.hidden_size * config.hidden_size,
)
