"""The table of architectures: each family (`BertConfig.model_type`) as a named composition of parts, one name per
role; the parts themselves are in the tables of model/parts.py.

  model_type  embeddings  layer      feed_forward  attention_pattern  pretraining_head  pooler  task_head
  bert        absolute    post_norm  dense         global             bert              tanh    bert
  roberta     absolute    post_norm  dense         global             bert              tanh    bert
  albert      absolute    post_norm  dense         global             bert              tanh    bert
  electra     absolute    post_norm  dense         global             electra           tanh    bert
  modernbert  token       pre_norm   glu           local_global       mlm               none    prediction

The families that share parts differ in numbers, which stay `BertConfig` fields because Hugging Face configs carry
them: RoBERTa's `position_offset`, ALBERT's `embedding_size`, `hidden_act` and `layer_sharing`, ELECTRA's
`embedding_size`, ModernBERT's `rope_theta`, `local_rope_theta`, `local_attention`, `global_attention_every`, `norm`,
`norm_bias`, `linear_bias`, `hidden_act` ("silu": SwiGLU, as NeoBERT) and its prediction head's `classifier_*`. A
module never asks which family it is in: it asks the composition for its part.

Only names live here (nothing is imported from the package), so that `BertConfig` can check `model_type` against
this table without an import cycle; an unknown part name is refused where the model is built (`parts.lookup`).
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Architecture:
  """One family's parts, by role; each name is a key of that role's table in model/parts.py."""

  # The family's name as people write it (a run header's model row).
  name: str = "BERT"
  # The token embeddings (parts.EMBEDDINGS): the module named `embeddings` under the encoder.
  embeddings: str = "absolute"
  # One encoder layer (parts.LAYERS): the order of attention, feed-forward, norms and residuals.
  layer: str = "post_norm"
  # The layer's feed-forward (parts.FEED_FORWARDS).
  feed_forward: str = "dense"
  # Which keys each layer's queries attend to (parts.ATTENTION_PATTERNS).
  attention_pattern: str = "global"
  # The heads of the pretraining models (parts.PRETRAINING_HEADS): BertForPretraining's masked-LM and sentence
  # heads, and ELECTRA's generator and discriminator heads where the family has them.
  pretraining_head: str = "bert"
  # BERT's pooler (dense and tanh on [CLS]) under the encoder, "tanh", or "none" (the family's task heads pool).
  pooler: str = "tanh"
  # The fine-tuning heads (model/heads.py's TASK_MODELS): "bert" (BERT's: dropout and a dense layer on the
  # pooler's output or on every token) or "prediction" (ModernBERT's: pooled by `classifier_pooling` or on every
  # token, a prediction head of dense, activation and norm, dropout, a dense layer).
  task_head: str = "bert"

  @property
  def has_sentence_head(self) -> bool:
    return self.pretraining_head in WITH_SENTENCE_HEAD


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
  # ModernBERT (Warner et al. 2024): token embeddings and a norm, pre-norm layers with a gated feed-forward, rotary
  # positions, local attention with a global layer every `global_attention_every`, a final norm; masked LM alone.
  "modernbert": Architecture(
    name="ModernBERT",
    embeddings="token",
    layer="pre_norm",
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
