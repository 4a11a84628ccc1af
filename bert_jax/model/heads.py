"""The fine-tuning models: the encoder with the task head of its family's composition (`Architecture.task_head`,
model/task_heads.py: BERT's or ModernBERT's, named and shaped as `transformers`' task models so that weights convert
one to one), one model per kind of head (`task_model`); `bert` is the encoder.

Every model takes (input_ids, input_mask, segment_ids, deterministic) and returns a dict with `logits` (float32),
the encoder's `sequence_output`, and `pooled_output`: BERT's pooler output, or what ModernBERT's sequence and choice
heads pooled (None for its token heads); `dummy_inputs()` gives the shapes `init` needs. A multiple-choice model
takes [batch, num_choices, seq] inputs, runs every choice through the encoder as a sequence of its own, and returns
[batch, num_choices] scores.
"""

import dataclasses

import flax.linen as nn
import jax.numpy as jnp

from bert_jax.model import parts, sentence_embedding
from bert_jax.model.bert_config import BertConfig
from bert_jax.model.encoder import Array, BertModel

HEADS = ("classification", "regression", "span", "token", "choice", "embedding")
# The task-head part's head (model/task_heads.py's `TaskHeads`) of each kind of head.
_SLOTS = {"classification": "sequence", "regression": "sequence", "span": "span", "token": "token", "choice": "choice"}
# transformers' class of each head, by the families whose task models it names as bert_jax does: the `architectures`
# of a Hugging Face config.json.
HF_ARCHITECTURES = {
  "bert": {
    "classification": "BertForSequenceClassification",
    "regression": "BertForSequenceClassification",
    "span": "BertForQuestionAnswering",
    "token": "BertForTokenClassification",
    "choice": "BertForMultipleChoice",
  },
  "modernbert": {
    "classification": "ModernBertForSequenceClassification",
    "regression": "ModernBertForSequenceClassification",
    "span": "ModernBertForQuestionAnswering",
    "token": "ModernBertForTokenClassification",
    "choice": "ModernBertForMultipleChoice",
  },
}


# The output width of the heads that have one whatever the task's labels.
_FIXED_WIDTHS = {"regression": 1, "span": 2, "choice": 1, "embedding": 0}


def num_outputs(head: str, labels: tuple[str, ...]) -> int:
  """The head's output width: one per label (classification, token), 1 (regression, choice), 2 (span); 0 for the
  embedding head, which has no output layer (its width is the encoder's)."""
  return _FIXED_WIDTHS.get(head, len(labels))


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


class TaskModel(nn.Module):
  """The encoder and the composition's task head of kind `head` (one of HEADS but "choice"), `width` outputs."""

  config: BertConfig
  head: str
  width: int

  @nn.compact
  def __call__(
    self, input_ids: Array, input_mask: Array, segment_ids: Array, deterministic: bool = True, head_mask=None
  ) -> dict:
    config = self.config
    sequence_output, pooled_output = BertModel(config, name="bert")(
      input_ids, input_mask, segment_ids, deterministic, head_mask=head_mask
    )
    head = getattr(parts.resolve(config).task_head, _SLOTS[self.head])
    logits, pooled = head(config, self.width, sequence_output, pooled_output, input_mask, deterministic)
    return dict(logits=logits, sequence_output=sequence_output, pooled_output=pooled)

  def dummy_inputs(self) -> tuple[Array, ...]:
    return _ids(1, 1), _ids(1, 1), _ids(1, 1)


class MultipleChoiceModel(nn.Module):
  """Inputs [batch, num_choices, seq]; every choice runs through the encoder as a sequence of its own, and the
  composition's choice head scores it."""

  config: BertConfig

  @nn.compact
  def __call__(
    self, input_ids: Array, input_mask: Array, segment_ids: Array, deterministic: bool = True, head_mask=None
  ) -> dict:
    config = self.config
    batch, choices, seq = input_ids.shape
    ids, mask, segments = (x.reshape(batch * choices, seq) for x in (input_ids, input_mask, segment_ids))
    sequence_output, pooled_output = BertModel(config, name="bert")(
      ids, mask, segments, deterministic, head_mask=head_mask
    )
    scores, pooled = parts.resolve(config).task_head.choice(
      config, 1, sequence_output, pooled_output, mask, deterministic
    )
    return dict(
      logits=scores.reshape(batch, choices),
      sequence_output=sequence_output.reshape(batch, choices, seq, -1),
      pooled_output=pooled.reshape(batch, choices, -1),
    )

  def dummy_inputs(self) -> tuple[Array, ...]:
    return _ids(1, 1, 1), _ids(1, 1, 1), _ids(1, 1, 1)


class EmbeddingModel(nn.Module):
  """The encoder alone, its sequence output pooled into sentence embeddings (`sentence_embedding.pool`, normalised
  when `settings.normalized`): the embeddings task's model (`logits`: [batch, hidden] float32 embeddings). Its
  parameters are the encoder's (`bert`), so any source's encoder loads into it."""

  config: BertConfig
  settings: sentence_embedding.Settings = sentence_embedding.Settings()

  @nn.compact
  def __call__(
    self, input_ids: Array, input_mask: Array, segment_ids: Array, deterministic: bool = True, head_mask=None
  ) -> dict:
    sequence_output, _ = BertModel(self.config, name="bert")(
      input_ids, input_mask, segment_ids, deterministic, head_mask=head_mask
    )
    embeddings = sentence_embedding.pool(sequence_output, input_mask, self.settings.pooling)
    if self.settings.normalized:
      embeddings = sentence_embedding.normalize(embeddings)
    return dict(logits=embeddings, sequence_output=sequence_output, pooled_output=embeddings)

  def dummy_inputs(self) -> tuple[Array, ...]:
    return _ids(1, 1), _ids(1, 1), _ids(1, 1)


def task_model(config: BertConfig, head: str, num_labels: int = 0) -> nn.Module:
  """The model for `head` (one of HEADS) with the task head of `config`'s composition; `num_labels` classes or tags
  (classification, token). Raises ValueError for an unknown head, or a composition whose parts no table holds."""
  if head not in HEADS:
    raise ValueError(f"Unknown head {head!r}; expected one of {HEADS}.")
  parts.resolve(config)  # Refused here, naming the part, rather than where the model is first applied.
  if head == "choice":
    return MultipleChoiceModel(config)
  if head == "embedding":  # Its settings' pooling and normalisation (the task's: `finetune/embeddings.py`).
    return EmbeddingModel(config)
  return TaskModel(config, head, _FIXED_WIDTHS.get(head, num_labels))
