"""The tables of parts, one per role, and the parts of a config's composition (`resolve`).

  role               table               entries (module)                      what an entry is
  embeddings         EMBEDDINGS          absolute, token (embeddings.py)       a module class, `cls(config)`
  layer              LAYERS              post_norm (post_norm.py),             a module class, made by stack.py
                                         pre_norm (pre_norm.py)
  feed_forward       FEED_FORWARDS       dense, glu (feed_forward.py)          a `feed_forward.FeedForward`
  attention_pattern  ATTENTION_PATTERNS  global, local_global                  `pattern(config)` -> a span per layer
                                         (attention_patterns.py)
  pretraining_head   PRETRAINING_HEADS   bert, electra, mlm                    a `pretraining_heads.PretrainingHead`
                                         (pretraining_heads.py)

Each module's docstring states the contract of its role's entries. The modules that compose the model (the encoder,
the stack, the pretraining models) take their parts from here, by the names `config.architecture` gives; the parts
never import this module, so a part module imports only the building blocks (layers.py) and other parts.
"""

import dataclasses

from bert_jax.model import attention_patterns, embeddings, feed_forward, post_norm, pre_norm, pretraining_heads
from bert_jax.model.bert_config import BertConfig

EMBEDDINGS = {"absolute": embeddings.AbsoluteEmbeddings, "token": embeddings.TokenEmbeddings}
LAYERS = {"post_norm": post_norm.PostNormLayer, "pre_norm": pre_norm.PreNormLayer}
FEED_FORWARDS = {"dense": feed_forward.DENSE, "glu": feed_forward.GLU}
ATTENTION_PATTERNS = {"global": attention_patterns.global_attention, "local_global": attention_patterns.local_global}
PRETRAINING_HEADS = {
  "bert": pretraining_heads.BERT,
  "electra": pretraining_heads.ELECTRA,
  "mlm": pretraining_heads.MLM,
}

# Each role of model/architectures.py's `Architecture`, and its table.
TABLES = {
  "embeddings": EMBEDDINGS,
  "layer": LAYERS,
  "feed_forward": FEED_FORWARDS,
  "attention_pattern": ATTENTION_PATTERNS,
  "pretraining_head": PRETRAINING_HEADS,
}


@dataclasses.dataclass(frozen=True)
class Parts:
  """A composition's parts, looked up: one entry of each role's table."""

  embeddings: type
  layer: type
  feed_forward: feed_forward.FeedForward
  attention_pattern: object  # (config) -> a span per layer.
  pretraining_head: pretraining_heads.PretrainingHead


def resolve(config: BertConfig) -> Parts:
  """The parts of `config.model_type`'s composition. Raises ValueError naming the role, the name no table holds and
  the names it does."""
  architecture = config.architecture
  found = {}
  for role, table in TABLES.items():
    name = getattr(architecture, role)
    if name not in table:
      raise ValueError(
        f"model.model_type={config.model_type!r} composes {role}={name!r}, which is not a {role} part; expected one "
        f"of {tuple(table)} (model/parts.py)."
      )
    found[role] = table[name]
  return Parts(**found)
