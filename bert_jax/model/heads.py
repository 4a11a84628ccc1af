"""The fine-tuning heads on the encoder, named and shaped as `transformers`' task models of the family, so that
weights convert one to one. The family's `Architecture.task_head` picks them (`task_model`); `bert` is the encoder.

BERT's ("bert", every family with BERT's pooler; `classifier` / `qa_outputs` the head):
- `BertForSequenceClassification`: dropout, then a dense layer on the pooled [CLS] output -> [batch, num_labels]
  (regression: num_labels = 1).
- `BertForQuestionAnswering`: a dense layer on every token -> [batch, seq, 2], start and end logits (no dropout,
  as in `transformers` and the original BERT's run_squad).
- `BertForTokenClassification`: dropout, then a dense layer on every token -> [batch, seq, num_labels].
- `BertForMultipleChoice`: each choice is a sequence; dropout and a dense layer on each pooled output give one
  score per choice -> [batch, num_choices].

ModernBERT's ("prediction"; `head` the prediction head: `head/dense` H -> H with bias `classifier_bias`,
`classifier_activation`, `head/norm`; then dropout `classifier_dropout` and the dense layer `classifier`):
- `ModernBertForSequenceClassification`: the last hidden states pooled by `classifier_pooling` ("cls": token 0;
  "mean": the mean over real tokens), then the head -> [batch, num_labels] (regression: 1).
- `ModernBertForTokenClassification`: the head on every token -> [batch, seq, num_labels]; with 2 outputs it is
  `transformers`' ModernBertForQuestionAnswering (start and end logits).
- `ModernBertForMultipleChoice`: each choice a sequence, pooled as above ("cls": its first real token, as
  transformers takes the mask's argmax), one score each -> [batch, num_choices].
A row without real tokens (the padding rows of a last evaluation batch) mean-pools to zeros, where transformers'
division gives NaN.

Every model takes (input_ids, input_mask, segment_ids, deterministic) and returns a dict with `logits` (float32),
the encoder's `sequence_output`, and `pooled_output`: BERT's pooler output, or what ModernBERT's sequence and choice
heads pooled (None for its token heads); `dummy_inputs()` gives the shapes `init` needs.
"""

import dataclasses

import flax.linen as nn
import jax.numpy as jnp

from bert_jax.model.bert_config import BertConfig
from bert_jax.model.encoder import Array, BertModel
from bert_jax.model.layers import ACTIVATIONS, constrain, dense, layer_norm

HEADS = ("classification", "regression", "span", "token", "choice")
# The task heads of `Architecture.task_head` that `task_model` builds.
TASK_MODELS = ("bert", "prediction")
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
_FIXED_WIDTHS = {"regression": 1, "span": 2, "choice": 1}


def num_outputs(head: str, labels: tuple[str, ...]) -> int:
  """The head's output width: one per label (classification, token), 1 (regression, choice), 2 (span)."""
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
  return dense(config, width, ("embed", None), name="classifier", bias=True)(hidden).astype(jnp.float32)


class ModernBertForSequenceClassification(nn.Module):
  config: BertConfig
  num_labels: int

  @nn.compact
  def __call__(
    self, input_ids: Array, input_mask: Array, segment_ids: Array, deterministic: bool = True, head_mask=None
  ) -> dict:
    config = self.config
    sequence_output, _ = BertModel(config, name="bert")(
      input_ids, input_mask, segment_ids, deterministic, head_mask=head_mask
    )
    pooled_output = _pool(config, sequence_output, input_mask, 0)
    logits = _predict(config, pooled_output, self.num_labels, deterministic)
    return dict(logits=logits, sequence_output=sequence_output, pooled_output=pooled_output)

  def dummy_inputs(self) -> tuple[Array, ...]:
    return _ids(1, 1), _ids(1, 1), _ids(1, 1)


class ModernBertForTokenClassification(nn.Module):
  """Token classification, and (num_labels 2: start, end) question answering."""

  config: BertConfig
  num_labels: int

  @nn.compact
  def __call__(
    self, input_ids: Array, input_mask: Array, segment_ids: Array, deterministic: bool = True, head_mask=None
  ) -> dict:
    config = self.config
    sequence_output, _ = BertModel(config, name="bert")(
      input_ids, input_mask, segment_ids, deterministic, head_mask=head_mask
    )
    logits = _predict(config, sequence_output, self.num_labels, deterministic)
    return dict(logits=logits, sequence_output=sequence_output, pooled_output=None)

  def dummy_inputs(self) -> tuple[Array, ...]:
    return _ids(1, 1), _ids(1, 1), _ids(1, 1)


class ModernBertForMultipleChoice(nn.Module):
  """Inputs [batch, num_choices, seq]; every choice runs through the encoder as a sequence of its own."""

  config: BertConfig

  @nn.compact
  def __call__(
    self, input_ids: Array, input_mask: Array, segment_ids: Array, deterministic: bool = True, head_mask=None
  ) -> dict:
    config = self.config
    batch, choices, seq = input_ids.shape
    ids, mask, segments = (x.reshape(batch * choices, seq) for x in (input_ids, input_mask, segment_ids))
    sequence_output, _ = BertModel(config, name="bert")(ids, mask, segments, deterministic, head_mask=head_mask)
    pooled_output = _pool(config, sequence_output, mask, jnp.argmax(mask > 0, axis=-1))
    scores = _predict(config, pooled_output, 1, deterministic)
    return dict(
      logits=scores.reshape(batch, choices),
      sequence_output=sequence_output.reshape(batch, choices, seq, -1),
      pooled_output=pooled_output.reshape(batch, choices, -1),
    )

  def dummy_inputs(self) -> tuple[Array, ...]:
    return _ids(1, 1, 1), _ids(1, 1, 1), _ids(1, 1, 1)


def task_model(config: BertConfig, head: str, num_labels: int = 0) -> nn.Module:
  """The model for `head` (one of HEADS) of the family's task heads (`config.architecture.task_head`); `num_labels`
  classes or tags (classification, token). Raises ValueError for an unknown head, or a task head not in
  TASK_MODELS."""
  if head not in HEADS:
    raise ValueError(f"Unknown head {head!r}; expected one of {HEADS}.")
  width = _FIXED_WIDTHS.get(head, num_labels)
  kind = config.architecture.task_head
  if kind == "bert":
    if head in ("classification", "regression"):
      return BertForSequenceClassification(config, width)
    if head == "span":
      return BertForQuestionAnswering(config)
    if head == "token":
      return BertForTokenClassification(config, width)
    return BertForMultipleChoice(config)
  if kind == "prediction":
    if head in ("classification", "regression"):
      return ModernBertForSequenceClassification(config, width)
    if head in ("span", "token"):
      return ModernBertForTokenClassification(config, width)
    return ModernBertForMultipleChoice(config)
  raise ValueError(
    f"model.model_type={config.model_type!r} composes task_head={kind!r}, which model/heads.py does not build; "
    f"expected one of {TASK_MODELS}."
  )
