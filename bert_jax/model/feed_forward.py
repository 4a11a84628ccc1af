"""Feed-forward parts: what a layer computes at each token after attending (model/parts.py's FEED_FORWARDS):
"dense" (BERT's), and "glu", the gated feed-forward of the modern encoders (GeGLU with `hidden_act="gelu"`,
ModernBERT; SwiGLU with "silu", NeoBERT).

A feed-forward part names the sub-modules it makes in its layer's scope (so that their parameters sit beside the
layer's attention and norms, where checkpoints and Hugging Face names expect them) and what it computes with them.
The layer part makes them, or takes the ones layers share (`layer_sharing="ffn"`), and calls `apply`.
"""

import dataclasses
from collections.abc import Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.model.bert_config import BertConfig
from bert_jax.model.layers import ACTIVATIONS, Dropout, constrain, dense

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class FeedForward:
  """One feed-forward part: `sublayers` = (name, make(config, name) -> module) pairs, made in the layer's scope, and
  `apply(config, modules by name, x [batch, seq, hidden], deterministic) -> [batch, seq, hidden]`;
  `flops_per_token(config)` is its forward matmul FLOPs at one token (bert_jax/flops.py)."""

  sublayers: tuple[tuple[str, Callable[[BertConfig, str], nn.Module]], ...]
  apply: Callable[[BertConfig, Mapping[str, nn.Module], Array, bool], Array]
  flops_per_token: Callable[[BertConfig], int]

  @property
  def names(self) -> tuple[str, ...]:
    return tuple(name for name, _ in self.sublayers)


def _dense_apply(config: BertConfig, modules: Mapping[str, nn.Module], x: Array, deterministic: bool) -> Array:
  del deterministic  # BERT's dropout follows the feed-forward (the layer's), not inside it.
  hidden = ACTIVATIONS[config.hidden_act](modules["intermediate"](x))
  hidden = constrain(hidden, ("act_batch", "act_length", "act_mlp"))
  return modules["output"](hidden)


# BERT's: `intermediate` (hidden -> intermediate_size), `hidden_act`, `output` (back to hidden).
DENSE = FeedForward(
  sublayers=(
    ("intermediate", lambda config, name: dense(config, config.intermediate_size, ("embed", "mlp"), name=name)),
    ("output", lambda config, name: dense(config, config.hidden_size, ("mlp", "embed"), name=name)),
  ),
  apply=_dense_apply,
  flops_per_token=lambda config: 2 * 2 * config.hidden_size * config.intermediate_size,
)


def _glu_apply(config: BertConfig, modules: Mapping[str, nn.Module], x: Array, deterministic: bool) -> Array:
  gated, gate = jnp.moveaxis(modules["intermediate"](x), -2, 0)  # [2, batch, seq, intermediate]: input, gate.
  hidden = constrain(ACTIVATIONS[config.hidden_act](gated) * gate, ("act_batch", "act_length", "act_mlp"))
  return modules["output"](Dropout(config.hidden_dropout_prob)(hidden, deterministic=deterministic))


# The gated feed-forward: `intermediate` (hidden -> [2, intermediate_size], the input and the gate, in one matmul;
# transformers' `Wi`, whose rows are the input's then the gate's), act(input) * gate, dropout, `output` (back to
# hidden; its `Wo`).
GLU = FeedForward(
  sublayers=(
    (
      "intermediate",
      lambda config, name: dense(config, (2, config.intermediate_size), ("embed", None, "mlp"), name=name),
    ),
    ("output", lambda config, name: dense(config, config.hidden_size, ("mlp", "embed"), name=name)),
  ),
  apply=_glu_apply,
  flops_per_token=lambda config: 2 * 3 * config.hidden_size * config.intermediate_size,
)
