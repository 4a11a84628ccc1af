"""Feed-forward parts: what a layer computes at each token after attending (model/parts.py's FEED_FORWARDS).

A feed-forward part names the sub-modules it makes in its layer's scope (so that their parameters sit beside the
layer's attention and norms, where checkpoints and Hugging Face names expect them) and what it computes with them.
The layer part makes them, or takes the ones layers share (`layer_sharing="ffn"`), and calls `apply`.
"""

import dataclasses
from collections.abc import Callable, Mapping

import flax.linen as nn
import jax

from bert_jax.model.bert_config import BertConfig
from bert_jax.model.layers import ACTIVATIONS, constrain, dense

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class FeedForward:
  """One feed-forward part: `sublayers` = (name, make(config, name) -> module) pairs, made in the layer's scope, and
  `apply(config, modules by name, x [batch, seq, hidden]) -> [batch, seq, hidden]`; `flops_per_token(config)` is its
  forward matmul FLOPs at one token (bert_jax/flops.py)."""

  sublayers: tuple[tuple[str, Callable[[BertConfig, str], nn.Module]], ...]
  apply: Callable[[BertConfig, Mapping[str, nn.Module], Array], Array]
  flops_per_token: Callable[[BertConfig], int]

  @property
  def names(self) -> tuple[str, ...]:
    return tuple(name for name, _ in self.sublayers)


def _dense_apply(config: BertConfig, modules: Mapping[str, nn.Module], x: Array) -> Array:
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
