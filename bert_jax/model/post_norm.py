"""BERT's post-LN encoder layer, the layer part "post_norm" (model/parts.py's LAYERS): attention, dropout, add &
norm; the feed-forward part, dropout, add & norm.

A layer part is a Flax module class made as `cls(config, feed_forward=..., span=..., shared=..., name=...)` by
model/stack.py, called as `layer(x, input_mask, deterministic, head_mask, positions, choice)` -> [batch, seq,
hidden] (positions: each token's position in its instance, for rotary positions; choice: the layer's index into a
`SpanTable` span, when one module runs layers whose spans differ), that sows its output as `hidden_states`; three
static methods tell the stack what it is made of: `sublayers(feed_forward)`, its sub-modules by name (the
feed-forward's among them), `sharing_groups(feed_forward)`, the sub-modules each partial `layer_sharing` mode
("attention", "ffn") shares across layers, and `stacking(**arguments)`, what the stack adds around the layers (a
`Stacking`), from the arguments an architecture gives the part (post_norm takes none).
"""

import dataclasses
from collections.abc import Callable, Mapping

import flax.linen as nn
import jax

from bert_jax.model.attention_patterns import Span
from bert_jax.model.bert_config import BertConfig
from bert_jax.model.feed_forward import FeedForward
from bert_jax.model.layers import HIDDEN, Dropout, constrain, layer_norm
from bert_jax.model.self_attention import make_self_attention

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Stacking:
  """What the stack adds around a layer part's layers: the attributes layer 0 is made with where it differs from the
  others (a scan then runs the others; layers that differ share no parameters), and whether a norm (`final_norm`)
  follows the last layer."""

  first_layer: tuple[tuple[str, object], ...] = ()  # (attribute, value) pairs.
  final_norm: bool = False


class PostNormLayer(nn.Module):
  """One post-LN layer. `shared` maps sub-module names (of `sublayers`) to modules that other layers use too
  (partial `layer_sharing`); the rest are the layer's own."""

  config: BertConfig
  feed_forward: FeedForward
  span: Span
  shared: Mapping[str, nn.Module] | None = None

  @staticmethod
  def stacking() -> Stacking:
    return Stacking()  # Every layer alike, each ending with its own norm.

  @staticmethod
  def sublayers(feed_forward: FeedForward) -> dict[str, Callable[[BertConfig, str], nn.Module]]:
    return {
      "attention": make_self_attention,
      "attention_layer_norm": layer_norm,
      **dict(feed_forward.sublayers),
      "output_layer_norm": layer_norm,
    }

  @staticmethod
  def sharing_groups(feed_forward: FeedForward) -> dict[str, tuple[str, ...]]:
    # Each sub-layer with the norm after it.
    return {"attention": ("attention", "attention_layer_norm"), "ffn": (*feed_forward.names, "output_layer_norm")}

  @nn.compact
  def __call__(
    self, x: Array, input_mask: Array, deterministic: bool, head_mask: Array | None = None, positions=None, choice=None
  ) -> Array:
    config = self.config
    shared = self.shared or {}
    sub = {
      name: shared[name] if name in shared else make(config, name)
      for name, make in self.sublayers(self.feed_forward).items()
    }
    dropout = Dropout(config.hidden_dropout_prob)
    attended = sub["attention"](
      x, input_mask, deterministic, head_mask, span=self.span, positions=positions, choice=choice
    )
    x = sub["attention_layer_norm"](x + dropout(attended, deterministic=deterministic))
    out = self.feed_forward.apply(config, sub, x, deterministic)
    x = constrain(sub["output_layer_norm"](x + dropout(out, deterministic=deterministic)), HIDDEN)
    self.sow("intermediates", "hidden_states", x)
    return x
