"""Fine-tuning's rows on the mesh: the training stream (one permutation of the rows per epoch, per member's seed),
this host's share of a global batch, every row of a split in batches, and the jitted prediction over them. Used by
the fine-tuning job, the dry run and the BERTology tools that score a task's rows."""

import functools

import jax
import numpy as np

from bert_jax import sharding
from bert_jax.finetune import losses
from bert_jax.finetune.contract import Encoded
from bert_jax.model.mesh_context import with_activation_rules
from bert_jax.train.run import Run


@functools.lru_cache(maxsize=64)
def _permutation(seed: int, epoch: int, num_rows: int) -> np.ndarray:
  """The order of epoch `epoch` in the stream of `seed`, drawn once (every step of the epoch, every member reads it)."""
  permutation = np.random.default_rng([seed, epoch]).permutation(num_rows)
  permutation.flags.writeable = False
  return permutation


def training_rows(step: int, num_rows: int, batch_size: int, seed: int) -> np.ndarray:
  """[batch_size] row indices that step `step` (from 1) trains on in the stream of `seed` (a member's): one
  permutation of the rows per epoch, from (seed, epoch)."""
  positions = np.arange((step - 1) * batch_size, step * batch_size)
  epochs, offsets = np.divmod(positions, num_rows)
  rows = np.empty(batch_size, np.int64)
  for epoch in np.unique(epochs):
    permutation = _permutation(seed, int(epoch), num_rows)
    rows[epochs == epoch] = permutation[offsets[epochs == epoch]]
  return rows


def host_batch(features: dict, rows: np.ndarray, weight: np.ndarray) -> dict:
  """This host's share of the global batch `rows` ([batch], or [members, batch] with `weight` of the same shape):
  hosts take consecutive blocks of the last axis, as global_batch expects."""
  per_host = rows.shape[-1] // jax.process_count()
  mine = slice(jax.process_index() * per_host, (jax.process_index() + 1) * per_host)
  batch = {name: value[rows[..., mine]] for name, value in features.items()}
  batch["weight"] = weight[..., mine].astype(np.float32)
  return batch


def make_predict(run: Run):
  """Jitted (params with a member axis, batch) -> logits [members, batch, ...], replicated on every device."""

  def predict(params, batch):
    return jax.vmap(lambda p: losses.logits(p, batch, run.model), in_axes=0)(params)

  return jax.jit(
    with_activation_rules(predict, run.mesh, run.rules),
    in_shardings=(run.shardings.params, sharding.batch_sharding(run.mesh)),
    out_shardings=sharding.replicated(run.mesh),
  )


def row_batches(encoded: Encoded, batch_size: int, mesh, order: np.ndarray | None = None):
  """Every row of `encoded`, in `order` (a permutation of the rows; default: row order), as global batches of
  `batch_size` with `weight` (the last batch padded with weight-0 rows): yields (batch, how many rows are real)."""
  order = np.arange(encoded.num_rows) if order is None else np.asarray(order)
  for start in range(0, encoded.num_rows, batch_size):
    positions = np.arange(start, start + batch_size)
    weight = (positions < encoded.num_rows).astype(np.float32)
    rows = order[np.minimum(positions, encoded.num_rows - 1)]
    yield sharding.global_batch(host_batch(encoded.features, rows, weight), mesh), int(weight.sum())


def predict(predict_fn, params, encoded: Encoded, batch_size: int, mesh) -> np.ndarray:
  """Logits of every row of `encoded`, [members, rows, ...]."""
  outputs = []
  for batch, real in row_batches(encoded, batch_size, mesh):
    logits = predict_fn(params, batch)
    outputs.append(np.asarray(logits.addressable_data(0))[:, :real])
  return np.concatenate(outputs, axis=1)
