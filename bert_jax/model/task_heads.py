"""Task-head parts: what the fine-tuning models (model/heads.py) put on the encoder, named and shaped as
`transformers`' task models of the family, so that weights convert one to one (model/parts.py's TASK_HEADS).

A task-head part is a `TaskHeads`: one function per kind of head (`sequence`: classification and regression; `span`;
`token`; `choice`), each called inside the task model's `__call__` as `head(config, width, sequence_output,
pooled_output, input_mask, deterministic)` -> (logits [..., width] float32, the pooled output the model returns or
None), so that the modules it makes are the task model's own children (`classifier`, `qa_outputs`, `head`); and
`fields`, the `BertConfig` fields its heads read beyond the encoder's. `sequence_output` is [rows, seq, hidden],
`pooled_output` the pooler's [rows, hidden] (None without one); a choice head gets each choice as a row.

"bert" (BERT's; `classifier` / `qa_outputs` the output layer, on the pooler's output or on every token):
- sequence (`BertForSequenceClassification`): dropout `hidden_dropout_prob`, then a dense layer on the pooled [CLS]
  output -> [batch, num_labels] (regression: num_labels = 1).
- span (`BertForQuestionAnswering`): a dense layer `qa_outputs` on every token -> [batch, seq, 2], start and end
  logits (no dropout, as in `transformers` and the original BERT's run_squad).
- token (`BertForTokenClassification`): dropout, then a dense layer on every token -> [batch, seq, num_labels].
- choice (`BertForMultipleChoice`): dropout and a dense layer on each choice's pooled output, one score each.

"prediction" (ModernBERT's; `head` the prediction head: `head/dense` H -> H with bias `classifier_bias`,
`classifier_activation`, `head/norm`; then dropout `classifier_dropout` and the dense layer `classifier`):
- sequence (`ModernBertForSequenceClassification`): the last hidden states pooled by `classifier_pooling` ("cls":
  token 0; "mean": the mean over real tokens), then the head -> [batch, num_labels] (regression: 1).
- span and token (`ModernBertForTokenClassification`; with 2 outputs `ModernBertForQuestionAnswering`): the head on
  every token -> [batch, seq, num_labels].
- choice (`ModernBertForMultipleChoice`): each choice pooled as above ("cls": its first real token, as transformers
  takes the mask's argmax), one score each.
A row without real tokens (the padding rows of a last evaluation batch) mean-pools to zeros, where transformers'
division gives NaN.
"""

import dataclasses
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.model.bert_config import PREDICTION_HEAD_FIELDS, BertConfig
from bert_jax.model.layers import ACTIVATIONS, constrain, dense, layer_norm

Array = jax.Array
# (config, width, sequence_output, pooled_output, input_mask, deterministic) -> (logits, pooled output or None).
Head = Callable[[BertConfig, int, Array, Array | None, Array, bool], tuple[Array, Array | None]]


@dataclasses.dataclass(frozen=True)
class TaskHeads:
  """One task-head part: its head of each kind (see the module docstring). Not `heads.TaskHead`, which records what a
  fine-tuned model's head was trained on."""

  sequence: Head
  span: Head
  token: Head
  choice: Head
  fields: tuple[str, ...] = ()  # The `BertConfig` fields its heads read beyond the encoder's.


def _output(config: BertConfig, width: int, hidden: Array, name: str = "classifier") -> Array:
  return dense(config, width, ("embed", None), name=name, bias=True)(hidden).astype(jnp.float32)


def _bert_pooled(config, width, sequence_output, pooled_output, input_mask, deterministic):
  del sequence_output, input_mask
  hidden = nn.Dropout(config.hidden_dropout_prob)(pooled_output, deterministic=deterministic)
  return _output(config, width, hidden), pooled_output


def _bert_span(config, width, sequence_output, pooled_output, input_mask, deterministic):
  del input_mask, deterministic
  return _output(config, width, sequence_output, "qa_outputs"), pooled_output


def _bert_token(config, width, sequence_output, pooled_output, input_mask, deterministic):
  del input_mask
  hidden = nn.Dropout(config.hidden_dropout_prob)(sequence_output, deterministic=deterministic)
  return _output(config, width, hidden), pooled_output


BERT = TaskHeads(sequence=_bert_pooled, span=_bert_span, token=_bert_token, choice=_bert_pooled)


class PredictionHead(nn.Module):
  """transformers' ModernBertPredictionHead: `dense` (H -> H, a bias if `classifier_bias`), `classifier_activation`,
  then `norm` (the family's norm)."""

  config: BertConfig

  @nn.compact
  def __call__(self, hidden: Array) -> Array:
    config = self.config
    projection = dense(config, config.hidden_size, ("embed", "embed_out"), name="dense", bias=config.classifier_bias)
    return layer_norm(config, "norm")(ACTIVATIONS[config.classifier_activation](projection(hidden)))


def _pool(config: BertConfig, sequence_output: Array, input_mask: Array, first: Array | int) -> Array:
  """[batch, seq, hidden] -> [batch, hidden] by `config.classifier_pooling`: the token at `first` (an int, or one
  position per row), or the mean over the real tokens (summed in float32; a row without any: zeros)."""
  if config.classifier_pooling == "cls":
    if isinstance(first, int):
      pooled = sequence_output[:, first]
    else:
      pooled = jnp.take_along_axis(sequence_output, first[:, None, None], axis=1)[:, 0]
  else:
    real = (input_mask > 0).astype(jnp.float32)[..., None]
    total = jnp.sum(sequence_output.astype(jnp.float32) * real, axis=1)
    pooled = (total / jnp.maximum(jnp.sum(real, axis=1), 1.0)).astype(sequence_output.dtype)
  return constrain(pooled, ("act_batch", "act_embed"))


def _predict(config: BertConfig, hidden: Array, width: int, deterministic: bool) -> Array:
  """The prediction head `head`, dropout, the output layer `classifier` (in the calling model): [..., hidden] ->
  [..., width] float32."""
  hidden = PredictionHead(config, name="head")(hidden)
  hidden = nn.Dropout(config.classifier_dropout)(hidden, deterministic=deterministic)
  return _output(config, width, hidden)


def _prediction_sequence(config, width, sequence_output, pooled_output, input_mask, deterministic):
  del pooled_output
  pooled = _pool(config, sequence_output, input_mask, 0)
  return _predict(config, pooled, width, deterministic), pooled


def _prediction_token(config, width, sequence_output, pooled_output, input_mask, deterministic):
  del pooled_output, input_mask
  return _predict(config, sequence_output, width, deterministic), None


def _prediction_choice(config, width, sequence_output, pooled_output, input_mask, deterministic):
  del pooled_output
  pooled = _pool(config, sequence_output, input_mask, jnp.argmax(input_mask > 0, axis=-1))
  return _predict(config, pooled, width, deterministic), pooled


PREDICTION = TaskHeads(
  sequence=_prediction_sequence,
  span=_prediction_token,
  token=_prediction_token,
  choice=_prediction_choice,
  fields=PREDICTION_HEAD_FIELDS,
)
