"""Each head's training loss as a step `Loss` (see train/step.py), equal to `transformers`' BERT task models'.

Every fine-tuning batch carries `weight` [batch] float32: 1 for a real row, 0 for a row that only pads the last
evaluation batch. A loss is a weighted mean over real rows (over real first word pieces for the token head);
metrics leave as sums with their counts, like pretraining's:
  classification / choice: cross-entropy of `label`;  regression: squared error of `label` (MSE);
  span: (start cross-entropy + end cross-entropy) / 2;  token: cross-entropy of `labels` where `label_weights`.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax.train.step import Loss

MODEL_INPUTS = ("input_ids", "input_mask", "segment_ids")


def logits(params, batch: dict, model, dropout_key=None) -> jax.Array:
  """The model's float32 logits for `batch` (deterministic without `dropout_key`)."""
  deterministic = dropout_key is None
  rngs = {} if deterministic else {"dropout": dropout_key}
  inputs = [batch[name] for name in MODEL_INPUTS]
  return model.apply({"params": params}, *inputs, deterministic=deterministic, rngs=rngs)["logits"]


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


def row_loss(params, batch: dict, model, dropout_key=None, normalizers=None, *, head: str):
  """Classification, regression, span and choice heads: a weighted mean over rows."""
  out = logits(params, batch, model, dropout_key)
  loss, correct = _per_row(head, out, batch)
  weight = batch["weight"]
  (count,) = _row_normalizers(batch) if normalizers is None else normalizers
  metrics = dict(task_loss=jnp.sum(loss * weight), task_accuracy=jnp.sum(correct * weight), task_count=jnp.sum(weight))
  return jnp.sum(loss * weight) / count, metrics


def token_loss(params, batch: dict, model, dropout_key=None, normalizers=None):
  """Token head: a weighted mean over the labelled pieces (the first piece of each word) of real rows."""
  out = logits(params, batch, model, dropout_key)  # [batch, seq, labels]
  weights = batch["label_weights"] * batch["weight"][:, None]
  xent = optax.softmax_cross_entropy_with_integer_labels(out, batch["labels"])
  correct = (jnp.argmax(out, -1) == batch["labels"]).astype(jnp.float32)
  (count,) = _token_normalizers(batch) if normalizers is None else normalizers
  metrics = dict(
    task_loss=jnp.sum(xent * weights), task_accuracy=jnp.sum(correct * weights), task_count=jnp.sum(weights)
  )
  return jnp.sum(xent * weights) / count, metrics


def batch_shapes(head: str, batch_size: int, seq: int, num_choices: int = 0) -> dict:
  """Feature name -> (shape, dtype) of a fine-tuning batch of `head` (task.py's `Encoded.features` plus `weight`)."""
  rows = (batch_size, num_choices, seq) if head == "choice" else (batch_size, seq)
  shapes = {name: (rows, np.int32) for name in MODEL_INPUTS}
  shapes["weight"] = ((batch_size,), np.float32)
  if head == "span":
    shapes.update(start_positions=((batch_size,), np.int32), end_positions=((batch_size,), np.int32))
  elif head == "token":
    shapes.update(labels=((batch_size, seq), np.int32), label_weights=((batch_size, seq), np.float32))
  else:
    shapes["label"] = ((batch_size,), np.float32 if head == "regression" else np.int32)
  return shapes


def make_loss(head: str) -> Loss:
  if head == "token":
    return Loss(value=token_loss, normalizers=_token_normalizers)
  return Loss(value=functools.partial(row_loss, head=head), normalizers=_row_normalizers)
