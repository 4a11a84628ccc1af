"""Each head's training loss as a step `Loss` (see train/step.py), equal to `transformers`' BERT task models'.

Every fine-tuning batch carries `weight` [batch] float32: 1 for a real row, 0 for a row that only pads the last
evaluation batch. A loss is a weighted mean over real rows (over real first word pieces for the token head);
metrics leave as sums with their counts, like pretraining's:
  classification / choice: cross-entropy of `label`;  regression: squared error of `label` (MSE);
  span: (start cross-entropy + end cross-entropy) / 2;  token: cross-entropy of `labels` where `label_weights`.

Task distillation (`distilled`, with `config.distill.teacher` a model fine-tuned on the same task): each row's (each
labelled piece's) loss is `alpha_hard * the above + (1 - alpha_hard) * the soft one`: `T^2 * KL(softmax(teacher /
T) || softmax(student / T))` of the teacher's logits (span: over positions, start and end averaged), or for
regression the squared error to the teacher's prediction.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax.train.objectives.distillation import kl_divergence
from bert_jax.train.step import Loss

MODEL_INPUTS = ("input_ids", "input_mask", "segment_ids")


def logits(params, batch: dict, model, dropout_key=None, head_mask=None) -> jax.Array:
  """The model's float32 logits for `batch` (deterministic without `dropout_key`; `head_mask` [layers, heads]: see
  `BertModel`)."""
  deterministic = dropout_key is None
  rngs = {} if deterministic else {"dropout": dropout_key}
  inputs = [batch[name] for name in MODEL_INPUTS]
  masked = {} if head_mask is None else dict(head_mask=head_mask)  # Any model applies; only a BERT takes a mask.
  return model.apply({"params": params}, *inputs, deterministic=deterministic, rngs=rngs, **masked)["logits"]


def _row_normalizers(batch: dict) -> tuple[jax.Array]:
  return (jnp.sum(batch["weight"]) + 1e-5,)


def _token_normalizers(batch: dict) -> tuple[jax.Array]:
  return (jnp.sum(batch["label_weights"] * batch["weight"][:, None]) + 1e-5,)


def _per_row(head: str, out: jax.Array, batch: dict) -> tuple[jax.Array, jax.Array]:
  """(loss per row [batch], correct per row [batch]) for the row heads."""
  if head == "regression":
    error = out[:, 0] - batch["label"]
    return jnp.square(error), jnp.zeros_like(error)
  if head == "span":  # out: [batch, seq, 2]
    start = optax.softmax_cross_entropy_with_integer_labels(out[..., 0], batch["start_positions"])
    end = optax.softmax_cross_entropy_with_integer_labels(out[..., 1], batch["end_positions"])
    exact = (jnp.argmax(out[..., 0], -1) == batch["start_positions"]) & (
      jnp.argmax(out[..., 1], -1) == batch["end_positions"]
    )
    return (start + end) / 2, exact.astype(jnp.float32)
  # classification [batch, labels], choice [batch, choices]
  xent = optax.softmax_cross_entropy_with_integer_labels(out, batch["label"])
  return xent, (jnp.argmax(out, -1) == batch["label"]).astype(jnp.float32)


def _hard(head: str, out: jax.Array, batch: dict) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(loss, correct, weight) per row [batch], or per piece [batch, seq] for the token head (weighted on the
  labelled pieces of real rows)."""
  if head == "token":  # out: [batch, seq, labels]
    weights = batch["label_weights"] * batch["weight"][:, None]
    xent = optax.softmax_cross_entropy_with_integer_labels(out, batch["labels"])
    return xent, (jnp.argmax(out, -1) == batch["labels"]).astype(jnp.float32), weights
  return *_per_row(head, out, batch), batch["weight"]


def _soft(head: str, out: jax.Array, teacher: jax.Array, temperature: float) -> jax.Array:
  """The soft loss against the teacher's logits, per row (per piece for the token head)."""
  if head == "regression":
    return jnp.square(out[:, 0] - jax.lax.stop_gradient(teacher[:, 0]))
  if head == "span":  # A distribution over positions for the start, another for the end.
    return (
      kl_divergence(out[..., 0], teacher[..., 0], temperature)
      + kl_divergence(out[..., 1], teacher[..., 1], temperature)
    ) / 2
  return kl_divergence(out, teacher, temperature)


def _task_terms(params, batch: dict, model, dropout_key, normalizers, head: str, head_mask=None):
  """(logits, hard loss, weights, their normalizer, the task's metric sums) of `head` on `batch`."""
  out = logits(params, batch, model, dropout_key, head_mask)
  loss, correct, weights = _hard(head, out, batch)
  (count,) = _normalizers(head)(batch) if normalizers is None else normalizers
  metrics = dict(
    task_loss=jnp.sum(loss * weights), task_accuracy=jnp.sum(correct * weights), task_count=jnp.sum(weights)
  )
  return out, loss, weights, count, metrics


def task_loss(params, batch: dict, model, dropout_key=None, normalizers=None, *, head: str, head_mask=None):
  """A weighted mean over real rows (over the labelled pieces of real rows for the token head); `normalizers=(1,)`
  gives the sum."""
  _, loss, weights, count, metrics = _task_terms(params, batch, model, dropout_key, normalizers, head, head_mask)
  return jnp.sum(loss * weights) / count, metrics


def distilled_loss(
  params,
  batch: dict,
  model,
  dropout_key=None,
  normalizers=None,
  *,
  frozen: dict,
  head: str,
  teacher,
  temperature: float,
  alpha_hard: float,
):
  """`task_loss` with soft labels from the fine-tuned teacher's `frozen` params (see the module docstring); its
  metrics add `distill_loss` (the soft loss's sum) and `distill_count`."""
  out, loss, weights, count, metrics = _task_terms(params, batch, model, dropout_key, normalizers, head)
  taught = jax.lax.stop_gradient(logits(frozen, batch, teacher))  # The teacher without dropout.
  soft = _soft(head, out, taught, temperature)
  metrics.update(distill_loss=jnp.sum(soft * weights), distill_count=jnp.sum(weights))
  return jnp.sum((alpha_hard * loss + (1.0 - alpha_hard) * soft) * weights) / count, metrics


def batch_shapes(head: str, batch_size: int, seq: int, num_choices: int = 0) -> dict:
  """Feature name -> (shape, dtype) of a fine-tuning batch of `head` (task.py's `Encoded.features` plus `weight`)."""
  rows = (batch_size, num_choices, seq) if head == "choice" else (batch_size, seq)
  shapes = {name: (rows, np.int32) for name in MODEL_INPUTS}
  shapes["weight"] = ((batch_size,), np.float32)
  if head == "embedding":  # Rows to embed (the embeddings task's training batch: `embeddings.train_batch_shapes`).
    return shapes
  if head == "span":
    shapes.update(start_positions=((batch_size,), np.int32), end_positions=((batch_size,), np.int32))
  elif head == "token":
    shapes.update(labels=((batch_size, seq), np.int32), label_weights=((batch_size, seq), np.float32))
  else:
    shapes["label"] = ((batch_size,), np.float32 if head == "regression" else np.int32)
  return shapes


def _normalizers(head: str):
  return _token_normalizers if head == "token" else _row_normalizers


def make_loss(head: str) -> Loss:
  return Loss(value=functools.partial(task_loss, head=head), normalizers=_normalizers(head))


def distilled(head: str, teacher, temperature: float, alpha_hard: float) -> Loss:
  """`make_loss(head)` taught by `teacher` (the fine-tuned teacher's model; its params come as `frozen`)."""
  value = functools.partial(distilled_loss, head=head, teacher=teacher, temperature=temperature, alpha_hard=alpha_hard)
  return Loss(value=value, normalizers=_normalizers(head))
