"""The fine-tuning heads on the BERT encoder, named and shaped as `transformers`' BERT task models, so that
weights convert one to one (`bert` is the encoder, `classifier` / `qa_outputs` the head).

- `BertForSequenceClassification`: dropout, then a dense layer on the pooled [CLS] output -> [batch, num_labels]
  (regression: num_labels = 1).
- `BertForQuestionAnswering`: a dense layer on every token -> [batch, seq, 2], start and end logits (no dropout,
  as in `transformers` and the original BERT's run_squad).
- `BertForTokenClassification`: dropout, then a dense layer on every token -> [batch, seq, num_labels].
- `BertForMultipleChoice`: each choice is a sequence; dropout and a dense layer on each pooled output give one
  score per choice -> [batch, num_choices].

Every model takes (input_ids, input_mask, segment_ids, deterministic) and returns a dict with `logits` (float32)
and the encoder's `sequence_output` and `pooled_output`; `dummy_inputs()` gives the shapes `init` needs.
"""

import dataclasses

import flax.linen as nn
import jax.numpy as jnp

from bert_jax.model.bert_config import BertConfig
from bert_jax.model.encoder import Array, BertModel
from bert_jax.model.layers import dense

HEADS = ("classification", "regression", "span", "token", "choice")
# transformers' class of each head, the `architectures` of a Hugging Face config.json.
HF_ARCHITECTURES = {
  "classification": "BertForSequenceClassification",
  "regression": "BertForSequenceClassification",
  "span": "BertForQuestionAnswering",
  "token": "BertForTokenClassification",
  "choice": "BertForMultipleChoice",
}


def num_outputs(head: str, labels: tuple[str, ...]) -> int:
  """The head's output width: one per label (classification, token), 1 (regression, choice), 2 (span)."""
  return {"regression": 1, "span": 2, "choice": 1}.get(head, len(labels))


@dataclasses.dataclass(frozen=True)
class TaskHead:
  """What a fine-tuned model's head is, as checkpoints and exports record it: the task it was trained on (e.g.
  "mrpc"), the head (one of HEADS) and the label names in id order (classes or tags; empty for regression and
  span)."""

  task: str
  head: str
  labels: tuple[str, ...] = ()

  def __post_init__(self):
    if self.head not in HEADS:
      raise ValueError(f"Unknown head {self.head!r}; expected one of {HEADS}.")

  @property
  def num_labels(self) -> int:
    return num_outputs(self.head, self.labels)

  def model(self, config: BertConfig) -> nn.Module:
    return task_model(config, self.head, self.num_labels)

  def to_json(self) -> dict:
    return dict(task=self.task, head=self.head, labels=list(self.labels))

  @classmethod
  def from_json(cls, value: dict) -> "TaskHead":
    return cls(value["task"], value["head"], tuple(value.get("labels", ())))


def _ids(*shape: int) -> Array:
  return jnp.zeros(shape, jnp.int32)


class BertForSequenceClassification(nn.Module):
  config: BertConfig
  num_labels: int

  @nn.compact
  def __call__(
    self, input_ids: Array, input_mask: Array, segment_ids: Array, deterministic: bool = True, head_mask=None
  ) -> dict:
    config = self.config
    sequence_output, pooled_output = BertModel(config, name="bert")(
      input_ids, input_mask, segment_ids, deterministic, head_mask=head_mask
    )
    hidden = nn.Dropout(config.hidden_dropout_prob)(pooled_output, deterministic=deterministic)
    logits = dense(config, self.num_labels, ("embed", None), name="classifier", bias=True)(hidden).astype(jnp.float32)
    return dict(logits=logits, sequence_output=sequence_output, pooled_output=pooled_output)

  def dummy_inputs(self) -> tuple[Array, ...]:
    return _ids(1, 1), _ids(1, 1), _ids(1, 1)


class BertForQuestionAnswering(nn.Module):
  config: BertConfig

  @nn.compact
  def __call__(
    self, input_ids: Array, input_mask: Array, segment_ids: Array, deterministic: bool = True, head_mask=None
  ) -> dict:
    config = self.config
    sequence_output, pooled_output = BertModel(config, name="bert")(
      input_ids, input_mask, segment_ids, deterministic, head_mask=head_mask
    )
    logits = dense(config, 2, ("embed", None), name="qa_outputs", bias=True)(sequence_output).astype(jnp.float32)
    return dict(logits=logits, sequence_output=sequence_output, pooled_output=pooled_output)

  def dummy_inputs(self) -> tuple[Array, ...]:
    return _ids(1, 1), _ids(1, 1), _ids(1, 1)


class BertForTokenClassification(nn.Module):
  config: BertConfig
  num_labels: int

  @nn.compact
  def __call__(
    self, input_ids: Array, input_mask: Array, segment_ids: Array, deterministic: bool = True, head_mask=None
  ) -> dict:
    config = self.config
    sequence_output, pooled_output = BertModel(config, name="bert")(
      input_ids, input_mask, segment_ids, deterministic, head_mask=head_mask
    )
    hidden = nn.Dropout(config.hidden_dropout_prob)(sequence_output, deterministic=deterministic)
    logits = dense(config, self.num_labels, ("embed", None), name="classifier", bias=True)(hidden).astype(jnp.float32)
    return dict(logits=logits, sequence_output=sequence_output, pooled_output=pooled_output)

  def dummy_inputs(self) -> tuple[Array, ...]:
    return _ids(1, 1), _ids(1, 1), _ids(1, 1)


class BertForMultipleChoice(nn.Module):
  """Inputs [batch, num_choices, seq]; every choice runs through the encoder as a sequence of its own."""

  config: BertConfig

  @nn.compact
  def __call__(
    self, input_ids: Array, input_mask: Array, segment_ids: Array, deterministic: bool = True, head_mask=None
  ) -> dict:
    config = self.config
    batch, choices, seq = input_ids.shape
    flat = [x.reshape(batch * choices, seq) for x in (input_ids, input_mask, segment_ids)]
    sequence_output, pooled_output = BertModel(config, name="bert")(*flat, deterministic, head_mask=head_mask)
    hidden = nn.Dropout(config.hidden_dropout_prob)(pooled_output, deterministic=deterministic)
    scores = dense(config, 1, ("embed", None), name="classifier", bias=True)(hidden).astype(jnp.float32)
    return dict(
      logits=scores.reshape(batch, choices),
      sequence_output=sequence_output.reshape(batch, choices, seq, -1),
      pooled_output=pooled_output.reshape(batch, choices, -1),
    )

  def dummy_inputs(self) -> tuple[Array, ...]:
    return _ids(1, 1, 1), _ids(1, 1, 1), _ids(1, 1, 1)


def task_model(config: BertConfig, head: str, num_labels: int = 0) -> nn.Module:
  """The model for `head` (one of HEADS); `num_labels` classes or tags (classification, token)."""
  if head == "classification":
    return BertForSequenceClassification(config, num_labels)
  if head == "regression":
    return BertForSequenceClassification(config, 1)
  if head == "span":
    return BertForQuestionAnswering(config)
  if head == "token":
    return BertForTokenClassification(config, num_labels)
  if head == "choice":
    return BertForMultipleChoice(config)
  raise ValueError(f"Unknown head {head!r}; expected one of {HEADS}.")
