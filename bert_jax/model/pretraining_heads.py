"""Pretraining heads: what the pretraining models put on the encoder (model/parts.py's PRETRAINING_HEADS).

A pretraining-head entry is a `PretrainingHead`: one maker per head a pretraining model asks for, each called as
`make(owner, config)` in the owning module's `setup`, so that the head's parameters are that module's own children
(`mlm_transform`, `nsp`, ... where checkpoints and Hugging Face names expect them).

  slot           asked for by                          "bert"                  "electra"              "mlm"
  masked_lm      BertForPretraining (model/encoder.py)  BERT's masked-LM head   BERT's (its generator  BERT's
                                                                                as a masked LM)
  sentence       BertForPretraining                     `nsp` (NSP, SOP)        `nsp`                  -
  generator      ElectraForPretraining's generator      -                       masked LM, exact GELU  -
  discriminator  ElectraForPretraining                  -                       replaced-token         -
                                                                                detection

"mlm" is the modern encoders' (ModernBERT's): a masked LM alone, whose head is BERT's shape (dense, activation, norm,
tied decoder with an output bias) with the family's norm, and the dense layer's activation and bias those of its
prediction head (`classifier_activation`, `classifier_bias`: transformers' ModernBertPredictionHead, which its task
models share, model/heads.py).
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
  """BERT's masked-LM head: `mlm_transform` (hidden -> the embeddings' width), the activation, `mlm_layer_norm`;
  then the decoder tied to the word embeddings, plus `mlm_output_bias`."""

  transform: nn.Module
  layer_norm: nn.Module
  output_bias: Array  # [vocab]
  activation: str  # A key of layers.ACTIVATIONS.

  def hidden(self, sequence_output: Array, masked_lm_positions: Array) -> Array:
    """[batch, seq, hidden], [batch, predictions] -> [batch, predictions, embedding_width]: only the masked positions
    reach the vocabulary-sized decoder (~6x fewer FLOPs there at seq 128)."""
    hidden = constrain(gather_positions(sequence_output, masked_lm_positions), HIDDEN)
    return self.layer_norm(ACTIVATIONS[self.activation](self.transform(hidden)))


def tied_decoder(embeddings: nn.Module, hidden: Array, output_bias: Array) -> Array:
  """[batch, predictions, embedding_width] -> logits [batch, predictions, vocab] (float32), by the embeddings'
  word table (an embeddings part's `attend`)."""
  return embeddings.attend(hidden).astype(jnp.float32) + output_bias


def masked_lm_head(
  owner: nn.Module, config: BertConfig, activation: str | None = None, bias: bool | None = None
) -> MaskedLMHead:
  """The masked-LM head of `owner` (in its setup); `activation` default `config.hidden_act`, the transform's `bias`
  default `config.linear_bias`."""
  return MaskedLMHead(
    transform=dense(config, config.embedding_width, ("embed", "embed_out"), name="mlm_transform", bias=bias),
    layer_norm=layer_norm(config, "mlm_layer_norm"),
    output_bias=owner.param("mlm_output_bias", zeros(("vocab",)), (config.vocab_size,), jnp.float32),
    activation=activation or config.hidden_act,
  )


def prediction_masked_lm_head(owner: nn.Module, config: BertConfig) -> MaskedLMHead:
  """ModernBERT's masked-LM head: the transform is its prediction head's dense layer, of `classifier_activation` and
  `classifier_bias`."""
  return masked_lm_head(owner, config, config.classifier_activation, config.classifier_bias)


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
  pretraining model without a sentence head returns no `nsp_logits`; ELECTRA's model is refused)."""

  masked_lm: HeadMaker
  sentence: HeadMaker | None = None
  generator: HeadMaker | None = None
  discriminator: HeadMaker | None = None


BERT = PretrainingHead(masked_lm=masked_lm_head, sentence=sentence_head)
# transformers' ElectraGeneratorPredictions: exact GELU whatever `hidden_act` says.
ELECTRA = PretrainingHead(
  masked_lm=masked_lm_head,
  sentence=sentence_head,
  generator=functools.partial(masked_lm_head, activation="gelu"),
  discriminator=replaced_token_head,
)

MLM = PretrainingHead(masked_lm=prediction_masked_lm_head)
