"""The table of architectures: each family (`BertConfig.model_type`) as a named composition of parts, one per role;
the parts themselves are in the tables of model/parts.py.

  model_type  embeddings  layer      feed_forward  attention_pattern  pretraining_head  pooler  task_head
  bert        absolute    post_norm  dense         global             bert              tanh    bert
  roberta     absolute    post_norm  dense         global             bert              tanh    bert
  albert      absolute    post_norm  dense         global             bert              tanh    bert
  electra     absolute    post_norm  dense         global             electra           tanh    bert
  modernbert  token       pre_norm*  glu           local_global       mlm               none    prediction

  * modernbert: layer=Part('pre_norm', first_attention_norm=False)

(tests/test_docs.py renders this table from ARCHITECTURES and checks it here.) A role names its part, or gives it
arguments: `Part(name, **arguments)`, a family's quirk as an argument of the part, not a constant of it (ModernBERT's
first layer without a norm before its attention). What each role's part takes as arguments is in model/parts.py.

The families that share parts differ in numbers, which stay `BertConfig` fields because Hugging Face configs carry
them: RoBERTa's `position_offset`, ALBERT's `embedding_size`, `hidden_act` and `layer_sharing`, ELECTRA's
`embedding_size`, ModernBERT's `rope_theta`, `local_rope_theta`, `local_attention`, `global_attention_every`, `norm`,
`norm_bias`, `linear_bias`, `hidden_act` ("silu": SwiGLU) and its prediction head's `classifier_*`. A module never
asks which family it is in: it asks the composition for its part.

Only names live here (nothing is imported from the package), so that `BertConfig` can check `model_type` against
this table without an import cycle; an unknown part name, or an argument its part does not take, is refused where
the model is built (`parts.resolve`).
"""

import dataclasses


@dataclasses.dataclass(frozen=True, init=False)
class Part:
  """A part of a role's table by name, with the arguments the composition gives it: `Part("pre_norm",
  first_attention_norm=False)`. A role given a bare name takes its part with none."""

  name: str
  arguments: tuple[tuple[str, object], ...]  # (name, value) pairs, sorted: a Part is hashable.

  def __init__(self, name: str, **arguments):
    object.__setattr__(self, "name", name)
    object.__setattr__(self, "arguments", tuple(sorted(arguments.items())))

  def __repr__(self) -> str:
    return f"Part({', '.join([repr(self.name), *(f'{key}={value!r}' for key, value in self.arguments)])})"


@dataclasses.dataclass(frozen=True)
class Architecture:
  """One family's parts, by role: each a key of that role's table in model/parts.py, or a `Part` of that key with
  arguments."""

  # The family's name as people write it (a run header's model row).
  name: str = "BERT"
  # The token embeddings (parts.EMBEDDINGS): the module named `embeddings` under the encoder.
  embeddings: str | Part = "absolute"
  # One encoder layer (parts.LAYERS): the order of attention, feed-forward, norms and residuals.
  layer: str | Part = "post_norm"
  # The layer's feed-forward (parts.FEED_FORWARDS).
  feed_forward: str | Part = "dense"
  # Which keys each layer's queries attend to (parts.ATTENTION_PATTERNS).
  attention_pattern: str | Part = "global"
  # The heads of the pretraining models (parts.PRETRAINING_HEADS): the masked-LM head with its decoder, the sentence
  # head, and ELECTRA's generator and discriminator heads where the family has them.
  pretraining_head: str | Part = "bert"
  # What the encoder puts on [CLS] (parts.POOLERS): BERT's dense and tanh, or none (the family's task heads pool).
  pooler: str | Part = "tanh"
  # The fine-tuning heads (parts.TASK_HEADS), which model/heads.py's task models put on the encoder.
  task_head: str | Part = "bert"

  def part(self, role: str) -> Part:
    """The part `role` names, with its arguments (none for a bare name)."""
    value = getattr(self, role)
    return value if isinstance(value, Part) else Part(value)

  @property
  def has_sentence_head(self) -> bool:
    return self.part("pretraining_head").name in WITH_SENTENCE_HEAD


# The pretraining-head entries (model/parts.py's PRETRAINING_HEADS) that have a sentence head: a family with another
# trains no sentence task (config_checks refuses one; tests/test_architectures.py checks the two tables agree).
WITH_SENTENCE_HEAD = ("bert", "electra")


ARCHITECTURES = {
  "bert": Architecture(),
  # Post-LN BERT with positions from `position_offset` on (model/embeddings.py); trained without a sentence task,
  # its pretraining model keeps BERT's heads (the Hugging Face file has no sentence head).
  "roberta": Architecture(name="RoBERTa"),
  # BERT's parts; `embedding_size`-wide tables projected to the hidden width, `layer_sharing` (model/stack.py).
  "albert": Architecture(name="ALBERT"),
  # BERT's encoder; ELECTRA's model (model/electra.py) takes the generator's and the discriminator's heads.
  "electra": Architecture(name="ELECTRA", pretraining_head="electra"),
  # ModernBERT (Warner et al. 2024): token embeddings and a norm, pre-norm layers with a gated feed-forward (the first
  # without a norm before its attention: the embeddings end with one), rotary positions, local attention with a global
  # layer every `global_attention_every`, a final norm; masked LM alone, no pooler, its own task heads.
  "modernbert": Architecture(
    name="ModernBERT",
    embeddings="token",
    layer=Part("pre_norm", first_attention_norm=False),
    feed_forward="glu",
    attention_pattern="local_global",
    pretraining_head="mlm",
    pooler="none",
    task_head="prediction",
  ),
}


def architecture(model_type: str) -> Architecture:
  """The composition of `model_type`; raises ValueError naming it and the families there are."""
  if model_type not in ARCHITECTURES:
    raise ValueError(f"model.model_type={model_type!r} is not supported; expected one of {tuple(ARCHITECTURES)}.")
  return ARCHITECTURES[model_type]
