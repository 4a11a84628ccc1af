"""The pre-norm encoder layer of the modern encoders (ModernBERT, NeoBERT, MosaicBERT's successors), the layer part
"pre_norm" (model/parts.py's LAYERS): x + attention(norm(x)), then x + feed_forward(norm(x)); the stack ends with a
final norm. Its arguments (`stacking`): `first_attention_norm` False leaves out layer 0's norm before its attention
(ModernBERT's: its embeddings end with one), `final_norm` False the final norm. The layer-part contract is in
model/post_norm.py's docstring.

Dropout: on the attention's probabilities and output (`attention_dropout_prob`, as transformers' ModernBERT
`attention_dropout` and `out_drop`) and inside the feed-forward (`hidden_dropout_prob`, its `mlp_dropout`); none on
the residual sums.
"""

from collections.abc import Callable, Mapping

import flax.linen as nn
import jax

from bert_jax.model.attention_patterns import Span
from bert_jax.model.bert_config import BertConfig
from bert_jax.model.feed_forward import FeedForward
from bert_jax.model.layers import HIDDEN, Dropout, constrain, layer_norm
from bert_jax.model.post_norm import Stacking
from bert_jax.model.self_attention import make_self_attention

Array = jax.Array


class PreNormLayer(nn.Module):
  """One pre-norm layer; `attention_norm` False: none before the attention (the first layer, where the architecture
  asks for it: `stacking`)."""

  config: BertConfig
  feed_forward: FeedForward
  span: Span
  shared: Mapping[str, nn.Module] | None = None
  attention_norm: bool = True

  @staticmethod
  def stacking(first_attention_norm: bool = True, final_norm: bool = True) -> Stacking:
    return Stacking(first_layer=() if first_attention_norm else (("attention_norm", False),), final_norm=final_norm)

  @staticmethod
  def sublayers(feed_forward: FeedForward) -> dict[str, Callable[[BertConfig, str], nn.Module]]:
    return {
      "attention_norm": layer_norm,
      "attention": make_self_attention,
      "feed_forward_norm": layer_norm,
      **dict(feed_forward.sublayers),
    }

  @staticmethod
  def sharing_groups(feed_forward: FeedForward) -> dict[str, tuple[str, ...]]:
    del feed_forward
    return {}  # Layers share nothing (ALBERT's sharing is of post-norm layers).

  @nn.compact
  def __call__(
    self, x: Array, input_mask: Array, deterministic: bool, head_mask: Array | None = None, positions=None, choice=None
  ) -> Array:
    config = self.config
    made = self.sublayers(self.feed_forward)
    if not self.attention_norm:
      del made["attention_norm"]
    sub = {name: make(config, name) for name, make in made.items()}
    normed = sub["attention_norm"](x) if self.attention_norm else x
    attended = sub["attention"](
      normed, input_mask, deterministic, head_mask, span=self.span, positions=positions, choice=choice
    )
    x = x + Dropout(config.attention_dropout_prob)(attended, deterministic=deterministic)
    x = constrain(x + self.feed_forward.apply(config, sub, sub["feed_forward_norm"](x), deterministic), HIDDEN)
    self.sow("intermediates", "hidden_states", x)
    return x
