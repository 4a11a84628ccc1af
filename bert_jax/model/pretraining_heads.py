"""Pretraining heads: what the pretraining models put on the encoder (model/parts.py's PRETRAINING_HEADS).

A pretraining-head entry is a `PretrainingHead`: one maker per head a pretraining model asks for, each called as
`make(owner, config)` in the owning module's `setup`, so that the head's parameters are that module's own children
(`mlm_transform`, `nsp`, ... where checkpoints and Hugging Face names expect them), and the FLOPs of its masked-LM
head. The slots, and who asks for them:

  masked_lm      BertForPretraining (model/encoder.py): the masked-LM head, its decoder included
  sentence       BertForPretraining: the 2-way sentence head `nsp` on the pooled [CLS] (NSP, SOP)
  generator      ElectraForPretraining (model/electra.py): the generator's masked-LM head
  discriminator  ElectraForPretraining: the replaced-token detection head

The slots each entry fills (tests/test_docs.py renders this table from PRETRAINING_HEADS and checks it here):

  entry    masked_lm  sentence  generator  discriminator
  bert     yes        yes       -          -
  electra  yes        yes       yes        yes
  mlm      yes        -         -          -

"bert" is BERT's; "electra" BERT's, with the generator a masked LM of exact GELU (transformers'
ElectraGeneratorPredictions) and ELECTRA's discriminator head; "mlm" the modern encoders' (ModernBERT's): a masked
LM alone, whose head is BERT's shape with the family's norm, and the dense layer's activation and bias those of its
prediction head (`classifier_activation`, `classifier_bias`: transformers' ModernBertPredictionHead, which its task
models share, model/task_heads.py).

A masked-LM head owns its decoder. An architecture's arguments for the entry go to its masked-LM heads
(`with_arguments`): `tied` (default True: the decoder is the word embeddings' table, an embeddings part's `attend`;
False: a dense layer of its own, `mlm_decoder`) and `transform` (default True: the dense layer `mlm_transform`, the
activation and `mlm_layer_norm` before the decoder; False: the decoder reads the encoder's output as it is). Either
way the logits add `mlm_output_bias`.
"""

import dataclasses
import functools
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.model.bert_config import BertConfig
from bert_jax.model.layers import ACTIVATIONS, HIDDEN, constrain, dense, gather_positions, layer_norm, zeros

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class MaskedLMHead:
  """A masked-LM head: BERT's transform (`mlm_transform`, hidden -> the embeddings' width, the activation,
  `mlm_layer_norm`), or none; then the decoder, tied to the word embeddings (None) or its own (`mlm_decoder`), plus
  `mlm_output_bias`."""

  transform: nn.Module | None
  layer_norm: nn.Module | None
  output_bias: Array  # [vocab]
  activation: str  # A key of layers.ACTIVATIONS.
  decoder: nn.Module | None = None  # None: tied to the word embeddings.

  def hidden(self, sequence_output: Array, masked_lm_positions: Array) -> Array:
    """[batch, seq, hidden], [batch, predictions] -> [batch, predictions, the decoder's input width]: only the masked
    positions reach the vocabulary-sized decoder (~6x fewer FLOPs there at seq 128)."""
    hidden = constrain(gather_positions(sequence_output, masked_lm_positions), HIDDEN)
    if self.transform is None:
      return hidden
    return self.layer_norm(ACTIVATIONS[self.activation](self.transform(hidden)))

  def logits(self, embeddings: nn.Module, hidden: Array) -> Array:
    """`hidden`'s logits [batch, predictions, vocab] (float32): by the word table of `embeddings` (the encoder's
    embeddings part: its `attend`) where the decoder is tied, else by the head's own."""
    decoded = embeddings.attend(hidden) if self.decoder is None else self.decoder(hidden)
    return decoded.astype(jnp.float32) + self.output_bias


def masked_lm_head(
  owner: nn.Module,
  config: BertConfig,
  activation: str | None = None,
  bias: bool | None = None,
  tied: bool = True,
  transform: bool = True,
) -> MaskedLMHead:
  """The masked-LM head of `owner` (in its setup); `activation` default `config.hidden_act`, the transform's `bias`
  default `config.linear_bias`; `tied` and `transform` as the module docstring says. Raises ValueError for a tied
  decoder without the transform when the word table is narrower than the encoder's output."""
  if tied and not transform and config.embedding_width != config.hidden_size:
    raise ValueError(
      f"model.model_type={config.model_type!r}: a decoder tied to the {config.embedding_width}-wide word table, "
      f"without the transform, would read the {config.hidden_size}-wide encoder output; give the pretraining head "
      "transform=True or tied=False (model/architectures.py)."
    )
  width = config.embedding_width if transform else config.hidden_size  # The decoder's input.
  return MaskedLMHead(
    transform=dense(config, width, ("embed", "embed_out"), name="mlm_transform", bias=bias) if transform else None,
    layer_norm=layer_norm(config, "mlm_layer_norm") if transform else None,
    output_bias=owner.param("mlm_output_bias", zeros(("vocab",)), (config.vocab_size,), jnp.float32),
    activation=activation or config.hidden_act,
    decoder=None if tied else dense(config, config.vocab_size, ("embed", "vocab"), name="mlm_decoder", bias=False),
  )


def prediction_masked_lm_head(
  owner: nn.Module, config: BertConfig, tied: bool = True, transform: bool = True
) -> MaskedLMHead:
  """ModernBERT's masked-LM head: the transform is its prediction head's dense layer, of `classifier_activation` and
  `classifier_bias`."""
  return masked_lm_head(owner, config, config.classifier_activation, config.classifier_bias, tied, transform)


def masked_lm_flops(config: BertConfig, activation=None, bias=None, tied: bool = True, transform: bool = True) -> int:
  """Forward matmul FLOPs of a masked-LM head at one prediction: the transform (if any) and the decoder, tied or not
  (the same product either way)."""
  del activation, bias, tied
  hidden, width = config.hidden_size, config.embedding_width if transform else config.hidden_size
  return 2 * ((hidden * width if transform else 0) + width * config.vocab_size)


@dataclasses.dataclass(frozen=True)
class SentenceHead:
  """The 2-way sentence head on the pooled [CLS] output (`nsp`: next sentence, or ALBERT's sentence order)."""

  dense: nn.Module

  def __call__(self, pooled_output: Array) -> Array:
    """[batch, (instances,) hidden] -> [batch, (instances,) 2] float32."""
    return self.dense(pooled_output).astype(jnp.float32)


def sentence_head(owner: nn.Module, config: BertConfig) -> SentenceHead:
  del owner  # Its one parameter-holding module names itself.
  return SentenceHead(dense(config, 2, ("embed", None), name="nsp", bias=True))


@dataclasses.dataclass(frozen=True)
class ReplacedTokenHead:
  """ELECTRA's replaced-token detection head: `rtd_dense` (hidden -> hidden), `hidden_act`, `rtd_prediction` (one
  logit per token), as transformers' `ElectraDiscriminatorPredictions`."""

  dense: nn.Module
  prediction: nn.Module
  activation: str

  def __call__(self, sequence_output: Array) -> Array:
    """[batch, seq, hidden] -> [batch, seq] float32, > 0: replaced."""
    hidden = ACTIVATIONS[self.activation](self.dense(sequence_output))
    return self.prediction(hidden)[..., 0].astype(jnp.float32)


def replaced_token_head(owner: nn.Module, config: BertConfig) -> ReplacedTokenHead:
  del owner
  return ReplacedTokenHead(
    dense=dense(config, config.hidden_size, ("embed", "embed_out"), name="rtd_dense"),
    prediction=dense(config, 1, ("embed", None), name="rtd_prediction", bias=True),
    activation=config.hidden_act,
  )


HeadMaker = Callable[[nn.Module, BertConfig], object]


@dataclasses.dataclass(frozen=True)
class PretrainingHead:
  """The heads of one pretraining-head entry, by slot (see the module docstring); None: the entry has none (a
  pretraining model without a sentence head returns no `nsp_logits`; ELECTRA's model is refused). `masked_lm_flops`
  (config) is its masked-LM heads' forward matmul FLOPs at one prediction (bert_jax/flops.py)."""

  masked_lm: HeadMaker
  sentence: HeadMaker | None = None
  generator: HeadMaker | None = None
  discriminator: HeadMaker | None = None
  masked_lm_flops: Callable[[BertConfig], int] = masked_lm_flops

  def with_arguments(self, **arguments) -> "PretrainingHead":
    """This entry with `arguments` (`tied`, `transform`, ...: `masked_lm_head`'s) given to its masked-LM heads and to
    their FLOPs."""
    given = {
      slot: functools.partial(getattr(self, slot), **arguments)
      for slot in ("masked_lm", "generator", "masked_lm_flops")
      if getattr(self, slot) is not None
    }
    return dataclasses.replace(self, **given)


BERT = PretrainingHead(masked_lm=masked_lm_head, sentence=sentence_head)
# transformers' ElectraGeneratorPredictions: exact GELU whatever `hidden_act` says.
ELECTRA = PretrainingHead(
  masked_lm=masked_lm_head,
  sentence=sentence_head,
  generator=functools.partial(masked_lm_head, activation="gelu"),
  discriminator=replaced_token_head,
)

MLM = PretrainingHead(masked_lm=prediction_masked_lm_head)
