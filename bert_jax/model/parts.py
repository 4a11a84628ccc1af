"""The tables of parts, one per role, and the parts of a config's composition (`resolve`).

  role               table               module                     entries
  embeddings         EMBEDDINGS          embeddings.py              absolute, token
  layer              LAYERS              post_norm.py, pre_norm.py  post_norm, pre_norm
  feed_forward       FEED_FORWARDS       feed_forward.py            dense, glu
  attention_pattern  ATTENTION_PATTERNS  attention_patterns.py      global, local_global
  pretraining_head   PRETRAINING_HEADS   pretraining_heads.py       bert, electra, mlm
  pooler             POOLERS             poolers.py                 tanh, none
  task_head          TASK_HEADS          task_heads.py              bert, prediction

(tests/test_docs.py renders this table from TABLES and checks it here.) What an entry is, and what it takes as
arguments (an architecture's `Part(name, **arguments)`, model/architectures.py):

  embeddings         a module class, made `cls(config, **arguments)`: the arguments are its attributes ("token":
                     `norm`, whether the embeddings end with a norm)
  layer              a module class, made by stack.py; `cls.stacking(**arguments)` says what the stack adds around
                     the layers ("pre_norm": `first_attention_norm`, `final_norm`)
  feed_forward       a `feed_forward.FeedForward`; no arguments
  attention_pattern  a function, `pattern(config, **arguments)` -> a span per layer
  pretraining_head   a `pretraining_heads.PretrainingHead`; the arguments go to its masked-LM heads and their FLOPs
                     (`tied`: the decoder tied to the word embeddings or its own; `transform`: with or without the
                     dense, activation and norm before it; "bert" and "electra" also the transform's `activation`
                     and `bias`)
  pooler             a `poolers.Pooler`, or None ("none"); no arguments
  task_head          a `task_heads.TaskHeads`; no arguments

Each module's docstring states the contract of its role's entries. The modules that compose the model (the encoder,
the stack, the pretraining and fine-tuning models) take their parts from here, by the names `config.architecture`
gives, with their arguments already given (`resolve`); the parts never import this module, so a part module imports
only the building blocks (layers.py) and other parts.
"""

import dataclasses
import functools
import inspect
from collections.abc import Callable

from bert_jax.model import (
  attention_patterns,
  embeddings,
  feed_forward,
  poolers,
  post_norm,
  pre_norm,
  pretraining_heads,
  task_heads,
)
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
POOLERS = {"tanh": poolers.TANH, "none": None}
TASK_HEADS = {"bert": task_heads.BERT, "prediction": task_heads.PREDICTION}

# Each role of model/architectures.py's `Architecture`, and its table.
TABLES = {
  "embeddings": EMBEDDINGS,
  "layer": LAYERS,
  "feed_forward": FEED_FORWARDS,
  "attention_pattern": ATTENTION_PATTERNS,
  "pretraining_head": PRETRAINING_HEADS,
  "pooler": POOLERS,
  "task_head": TASK_HEADS,
}


# Each role whose parts take arguments: what takes them (its keyword parameters are what the part accepts), and the
# entry with them given.
_TAKES = {
  "embeddings": lambda entry: entry,
  "layer": lambda entry: entry.stacking,
  "attention_pattern": lambda entry: entry,
  "pretraining_head": lambda entry: entry.masked_lm,
}
_GIVEN = {
  "embeddings": lambda entry, arguments: functools.partial(entry, **arguments),
  "layer": lambda entry, arguments: entry,  # The stack takes them: `Parts.stacking`.
  "attention_pattern": lambda entry, arguments: functools.partial(entry, **arguments),
  "pretraining_head": lambda entry, arguments: entry.with_arguments(**arguments),
}


def accepted_arguments(role: str, entry) -> tuple[str, ...]:
  """The arguments `entry` of `role` takes: the keyword parameters, with defaults, of what takes them (a module's
  attributes but Flax's own)."""
  if role not in _TAKES or entry is None:
    return ()
  parameters = inspect.signature(_TAKES[role](entry)).parameters.values()
  return tuple(p.name for p in parameters if p.default is not p.empty and p.name not in ("parent", "name"))


@dataclasses.dataclass(frozen=True)
class Parts:
  """A composition's parts, looked up: one entry of each role's table, given the composition's arguments."""

  embeddings: Callable  # (config) -> the embeddings module.
  layer: type
  stacking: post_norm.Stacking  # The layer part's `stacking(**arguments)`: what the stack adds around the layers.
  feed_forward: feed_forward.FeedForward
  attention_pattern: Callable  # (config) -> a span per layer.
  pretraining_head: pretraining_heads.PretrainingHead
  pooler: poolers.Pooler | None
  task_head: task_heads.TaskHeads


def resolve(config: BertConfig) -> Parts:
  """The parts of `config.model_type`'s composition, given their arguments. Raises ValueError naming the role, and
  the name no table holds and the names it does, or the arguments its part does not take and those it does."""
  architecture = config.architecture
  found = {}
  for role, table in TABLES.items():
    part = architecture.part(role)
    if part.name not in table:
      raise ValueError(
        f"model.model_type={config.model_type!r} composes {role}={part.name!r}, which is not a {role} part; expected "
        f"one of {tuple(table)} (model/parts.py)."
      )
    entry, arguments = table[part.name], dict(part.arguments)
    accepted = accepted_arguments(role, entry)
    unknown = tuple(name for name in arguments if name not in accepted)
    if unknown:
      raise ValueError(
        f"model.model_type={config.model_type!r} gives {role}={part.name!r} the arguments {unknown}, which it does not "
        f"take; it takes {accepted or 'none'} (model/parts.py)."
      )
    found[role] = _GIVEN[role](entry, arguments) if arguments else entry
  found["stacking"] = found["layer"].stacking(**dict(architecture.part("layer").arguments))
  return Parts(**found)
