"""SpanBERT's span-boundary objective (`config.objective = "span_boundary"`; Joshi et al. 2020, section 3.2): the
masked LM, plus every masked token predicted a second time from the two tokens just outside its span and its position
within the span (the SBO); no sentence task. It owns the SBO head (`SpanBoundaryHead`), the pretraining model that
carries it (`SpanBertForPretraining`), the spans' boundaries (`span_boundaries`), the loss and the FLOPs it counts.

- The spans: `data.masking="spans"` (data/span_masking.py) selects spans of whole words; SpanBERT merges spans that
  overlap or touch before it writes their boundary pairs (`merge_intervals` in its masking.py), as the pipeline's
  replacement already does (data/masking.py: one decision per run of consecutive selected tokens). So a span here is a
  run of consecutive masked positions, read in the step from `masked_lm_positions`: the batch contract gains no
  feature, and every source, packed rows included, gives the spans. A run never crosses a token that cannot be
  selected ([CLS], [SEP], padding), so its boundaries lie within its instance, [CLS] or [SEP] at its edges (the
  paper's x_{s-1} and x_{e+1}; SpanBERT's code leaves a span at the very edge of its block out of the SBO instead).
- The head, as SpanBERT's `BertPairTargetPredictionHead`: for a masked token x_i of the span x_s..x_e,
  h0 = [x_{s-1}; x_{e+1}; p_{i-s+1}] (the encoder's outputs at the boundaries and a learned relative position
  embedding), h1 = LayerNorm(GeLU(W1 h0 + b1)), y = LayerNorm(GeLU(W2 h1 + b2)), and y goes through the decoder tied
  to the word embeddings, with its own output bias. The norms and the activation are the family's (`model.norm`,
  `model.hidden_act`); W2 maps to the embeddings' width, as the masked LM's transform does.
- The position table has `span_boundary.max_span_tokens` rows (SpanBERT's `--max-pair-targets`, 15) of width
  `span_boundary.position_embedding_size` (its 200). A span is up to `data.span_max_words` whole words, a word may be
  several tokens and touching spans merge, so a run can be longer than any word count: its tokens past the table
  have no SBO prediction (as SpanBERT cuts its pair targets) and the masked LM still predicts them. The bound is a
  key of its own, not the longest run possible (`data.max_predictions_per_seq`), so that the parameters' shapes do not
  follow a data key that a second phase changes (BERT's 20 predictions at 128 tokens, 80 at 512).
- The loss: the masked LM's cross-entropy over real predictions plus the SBO's over the predictions it makes, each a
  mean (+1e-5, as BERT's), from the whole batch when it runs in microbatches (SpanBERT's `pair_loss_weight` 1).
- FLOPs: BERT's (`flops.train_flops_per_step`) plus the head's at every prediction slot (`flops.span_boundary_flops`).
- Parameters: the family's pretraining model's tree and `span_boundary/`. What a hand-off reads (`pretrained.load`,
  export, fine-tuning) is the family's model: workdir/reading.py reads the head with the rest, verified, and leaves it
  behind.

What it asks of a config (spans for its masking, its keys' ranges) is checked with every objective's, by the front
door (`config_checks/training.py`, `check_objective`).
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from bert_jax import flops
from bert_jax.model.bert_config import BertConfig
from bert_jax.model.encoder import BertForPretraining
from bert_jax.model.layers import (
  ACTIVATIONS,
  HIDDEN,
  constrain,
  dense,
  gather_positions,
  kernel_init,
  layer_norm,
  zeros,
)
from bert_jax.train.objectives import bert
from bert_jax.train.objectives.objective import Objective
from bert_jax.train.step import Loss

Array = jax.Array


def span_boundaries(batch: dict, max_span_tokens: int) -> tuple[Array, Array, Array, Array]:
  """Each prediction slot's span, the run of consecutive masked positions it is in: (left, right, offsets, weights),
  each [batch, max_predictions]. `left` and `right` are the positions of the tokens just before and after the run,
  `offsets` the slot's position within the run (1 for its first token), `weights` 1.0 where the SBO predicts it (a
  real prediction, with a token on each side of its run, at most `max_span_tokens` into it), else 0 (left = right = 0,
  offset 1: a slot the head reads and the loss ignores)."""
  positions, real = batch["masked_lm_positions"], batch["masked_lm_weights"] > 0  # [batch, max_predictions]
  rows, seq = batch["input_ids"].shape
  masked = jnp.zeros((rows, seq), jnp.int32).at[jnp.arange(rows)[:, None], positions].max(real.astype(jnp.int32))
  index = jnp.arange(seq)
  # For every position, the last unmasked one at or before it and the first at or after it (-1, seq: none).
  before = jax.lax.cummax(jnp.where(masked > 0, -1, index), axis=1)
  after = jax.lax.cummin(jnp.where(masked > 0, seq, index), axis=1, reverse=True)
  left = jnp.take_along_axis(before, positions, axis=1)
  right = jnp.take_along_axis(after, positions, axis=1)
  offsets = positions - left
  predicted = real & (left >= 0) & (right < seq) & (offsets <= max_span_tokens)
  return (
    jnp.where(predicted, left, 0),
    jnp.where(predicted, right, 0),
    jnp.where(predicted, offsets, 1),
    predicted.astype(jnp.float32),
  )


class SpanBoundaryHead(nn.Module):
  """SpanBERT's span-boundary head (see the module docstring) up to the decoder: `position_embeddings`
  [max_span_tokens, position_embedding_size], `dense_1` ([left; right; position] -> hidden) and `layer_norm_1`,
  `dense_2` (hidden -> the embeddings' width) and `layer_norm_2`; and the decoder's `output_bias` [vocab], which its
  owner adds to the tied decoder's logits."""

  config: BertConfig
  max_span_tokens: int
  position_embedding_size: int

  def setup(self):
    config = self.config
    table = (self.max_span_tokens, self.position_embedding_size)
    self.position_embeddings = self.param("position_embeddings", kernel_init(config, (None, None)), table, jnp.float32)
    # Its input is 2 x hidden + the position width, which need not divide over the `embed` axis's devices.
    self.dense_1 = dense(config, config.hidden_size, (None, "embed_out"), name="dense_1")
    self.layer_norm_1 = layer_norm(config, "layer_norm_1")
    self.dense_2 = dense(config, config.embedding_width, ("embed", "embed_out"), name="dense_2")
    self.layer_norm_2 = layer_norm(config, "layer_norm_2")
    self.output_bias = self.param("output_bias", zeros(("vocab",)), (config.vocab_size,), jnp.float32)

  def __call__(self, sequence_output: Array, left: Array, right: Array, offsets: Array) -> Array:
    """sequence_output [batch, seq, hidden]; left, right, offsets [batch, predictions] (offsets from 1) -> [batch,
    predictions, embedding_width]."""
    boundaries = [constrain(gather_positions(sequence_output, ends), HIDDEN) for ends in (left, right)]
    positions = jnp.take(self.position_embeddings, offsets - 1, axis=0).astype(sequence_output.dtype)
    activation = ACTIVATIONS[self.config.hidden_act]
    hidden = self.layer_norm_1(activation(self.dense_1(jnp.concatenate([*boundaries, positions], axis=-1))))
    return self.layer_norm_2(activation(self.dense_2(hidden)))


class SpanBertForPretraining(BertForPretraining):
  """The family's pretraining model (`BertForPretraining`: its parameters where every hand-off expects them) with
  SpanBERT's head under `span_boundary/`. Returns its outputs and `sbo_logits` [batch, max_predictions, vocab]
  (float32) at the spans `span_left`, `span_right`, `span_offsets` ([batch, max_predictions], from
  `span_boundaries`; absent: every slot at offset 1 between positions 0, the shapes `init` needs)."""

  max_span_tokens: int
  position_embedding_size: int

  def setup(self):
    super().setup()
    self.span_boundary = SpanBoundaryHead(self.config, self.max_span_tokens, self.position_embedding_size)

  def __call__(
    self,
    *args,
    span_left: Array | None = None,
    span_right: Array | None = None,
    span_offsets: Array | None = None,
    **kwargs,
  ) -> dict[str, Array]:
    """`BertForPretraining`'s arguments, and the spans by keyword."""
    outputs = super().__call__(*args, **kwargs)
    first = jnp.zeros(outputs["mlm_logits"].shape[:2], jnp.int32)
    spans = (
      first if span_left is None else span_left,
      first if span_right is None else span_right,
      first + 1 if span_offsets is None else span_offsets,
    )
    hidden = self.span_boundary(outputs["sequence_output"], *spans)
    # The decoder tied to the word table (the embeddings part's `attend`), with the head's own bias.
    sbo_logits = self.bert.embeddings.attend(hidden).astype(jnp.float32) + self.span_boundary.output_bias
    outputs["sbo_logits"] = sbo_logits
    return outputs


def loss_normalizers(batch: dict, *, max_span_tokens: int) -> tuple[Array, Array]:
  """What the MLM and SBO loss sums are divided by: the real predictions and the SBO's (each +1e-5, guarding a batch
  with none, as BERT's). From the whole batch, so microbatches add up to the full-batch loss."""
  sbo_weights = span_boundaries(batch, max_span_tokens)[3]
  return jnp.sum(batch["masked_lm_weights"]) + 1e-5, jnp.sum(sbo_weights) + 1e-5


def span_boundary_loss(
  params,
  batch: dict,
  model: SpanBertForPretraining,
  dropout_key=None,
  normalizers: tuple | None = None,
  *,
  max_span_tokens: int,
):
  """The masked LM's mean cross-entropy + the SBO's (see the module docstring); `normalizers` (`loss_normalizers` of
  the whole batch) replace this batch's own counts when it is one microbatch of many. Returns (loss, metrics); metrics
  are sums with their counts: the masked LM's (`mlm_*`) and the SBO's (`sbo_*`) over the predictions it makes."""
  deterministic = dropout_key is None
  rngs = {} if deterministic else {"dropout": dropout_key}
  left, right, offsets, sbo_weights = span_boundaries(batch, max_span_tokens)
  spans = dict(span_left=left, span_right=right, span_offsets=offsets)
  outputs = model.apply({"params": params}, **bert.model_inputs(batch), **spans, deterministic=deterministic, rngs=rngs)
  labels, sbo_logits = batch["masked_lm_ids"], outputs["sbo_logits"]  # float32
  sbo_xent = optax.softmax_cross_entropy_with_integer_labels(sbo_logits, labels) * sbo_weights
  metrics = dict(
    bert.masked_lm_sums(outputs["mlm_logits"], batch),
    sbo_loss=jnp.sum(sbo_xent),
    sbo_accuracy=jnp.sum((jnp.argmax(sbo_logits, -1) == labels) * sbo_weights),
    sbo_count=jnp.sum(sbo_weights),
    **bert.row_sums(batch),
  )
  if normalizers is None:
    normalizers = loss_normalizers(batch, max_span_tokens=max_span_tokens)
  mlm_normalizer, sbo_normalizer = normalizers
  return metrics["mlm_loss"] / mlm_normalizer + metrics["sbo_loss"] / sbo_normalizer, metrics


def make_loss(max_span_tokens: int) -> Loss:
  """The span-boundary objective's `Loss`, the SBO predicting up to `max_span_tokens` tokens into a span."""
  value = functools.partial(span_boundary_loss, max_span_tokens=max_span_tokens)
  return Loss(value=value, normalizers=functools.partial(loss_normalizers, max_span_tokens=max_span_tokens))


def _model(config, model_cfg: BertConfig) -> SpanBertForPretraining:
  settings = config.span_boundary
  return SpanBertForPretraining(
    model_cfg, max_span_tokens=settings.max_span_tokens, position_embedding_size=settings.position_embedding_size
  )


def _flops(config, model_cfg: BertConfig, frozen, training: bool = True) -> float:
  """BERT's model FLOPs and the span-boundary head's per train step (forward and backward), or per eval step
  (forward) when not `training`."""
  batch, seq, preds = config.batch_size, config.data.max_seq_length, config.data.max_predictions_per_seq
  head = flops.span_boundary_flops(model_cfg, batch, preds, config.span_boundary.position_embedding_size)
  return (flops.train_flops_per_step(model_cfg, batch, seq, preds) + 3.0 * head) / (1 if training else 3)


OBJECTIVE = Objective(
  name="span_boundary",
  model=_model,
  loss=lambda config, frozen: make_loss(config.span_boundary.max_span_tokens),
  flops=_flops,
  shown=lambda config, evaluation: ("mlm_loss", "mlm_accuracy", "sbo_loss", "sbo_accuracy"),
)
