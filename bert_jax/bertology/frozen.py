"""Small models trained on a frozen encoder's hidden states (the probes, the feature-based tagger): the features, and
one loop that fits such a model on a task's train split and predicts its evaluation split.

The encoder runs inside the jitted step, under `stop_gradient`, once per batch: no feature is stored, so a task of
any size fits in host memory. One step is in flight at a time (XLA CPU's collectives on 8 fake devices starve when
steps queue up without end; on an accelerator it costs a host sync per step of a small model).
"""

import dataclasses
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging

from bert_jax import progress, sharding
from bert_jax.finetune import rows
from bert_jax.finetune.contract import Encoded
from bert_jax.model.bert_config import BertConfig
from bert_jax.model.encoder import BertModel, encoder_intermediates
from bert_jax.model.mesh_context import with_activation_rules


def hidden_states(model_cfg: BertConfig, encoder_params, batch: dict) -> jax.Array:
  """Every layer's hidden states, the embeddings' output first: [layers + 1, batch, seq, hidden] float32, with no
  gradient into the encoder."""
  inputs = (batch["input_ids"], batch["input_mask"], batch["segment_ids"])
  _, state = BertModel(model_cfg).apply({"params": encoder_params}, *inputs, mutable=["intermediates"])
  hidden = encoder_intermediates(state["intermediates"], model_cfg)["hidden_states"].astype(jnp.float32)
  return jax.lax.stop_gradient(hidden)


@dataclasses.dataclass(frozen=True)
class Fit:
  params: dict  # The trained model's, on the host.
  final_loss: float
  predictions: np.ndarray  # [members, rows, ...] of the evaluation split (one member per model `predict` returns).


def fit(
  name: str,
  params: dict,
  loss: Callable,  # (params, encoder_params, batch) -> scalar
  predict: Callable,  # (params, encoder_params, batch) -> [members, batch, ...]
  encoder_params,
  train: Encoded,
  evaluation: Encoded,
  config,
  mesh,
) -> Fit:
  """Adam on `loss` (`bertology.probe_learning_rate`) for `bertology.probe_epochs` epochs of `train` in batches of
  `bertology.batch_size` (a permutation of its rows per epoch, from `config.seed`), with a progress line every 10 s;
  then `predict` on every row of `evaluation`."""
  settings, seed, rules = config.bertology, config.seed, config.logical_axis_rules
  epochs, batch_size = settings.probe_epochs, settings.batch_size
  optimizer = optax.adam(settings.probe_learning_rate)

  def train_step(params, opt_state, encoder_params, batch):
    value, grads = jax.value_and_grad(loss)(params, encoder_params, batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value

  encoder_shardings = jax.tree.map(lambda x: x.sharding, encoder_params)
  replicated, batch_sharding = sharding.replicated(mesh), sharding.batch_sharding(mesh)
  params = jax.device_put(params, replicated)
  opt_state = jax.device_put(optimizer.init(params), replicated)
  train_step = jax.jit(
    with_activation_rules(train_step, mesh, rules),
    in_shardings=(replicated, replicated, encoder_shardings, batch_sharding),
    out_shardings=replicated,
    donate_argnums=(0, 1),
  )
  predict = jax.jit(
    with_activation_rules(predict, mesh, rules),
    in_shardings=(replicated, encoder_shardings, batch_sharding),
    out_shardings=replicated,
  )
  steps = epochs * -(-train.num_rows // batch_size)
  done, start_time, last_log, value = 0, time.perf_counter(), time.perf_counter(), jnp.nan
  for epoch in range(epochs):
    order = np.random.default_rng([seed, epoch]).permutation(train.num_rows)
    for batch, _ in rows.row_batches(train, batch_size, mesh, order=order):
      params, opt_state, value = train_step(params, opt_state, encoder_params, batch)
      value.block_until_ready()  # One step in flight (see the module docstring).
      done += 1
      if time.perf_counter() - last_log > 10 or done == steps:
        last_log = time.perf_counter()
        rate = done / (last_log - start_time)
        logging.info(
          "%s: step %d/%d (epoch %d) | loss %.4f | %.1f steps/s | ETA %s",
          name,
          done,
          steps,
          epoch + 1,
          float(value),
          rate,
          progress.duration((steps - done) / rate),
        )
  predictions = rows.predict(lambda p, b: predict(p, encoder_params, b), params, evaluation, batch_size, mesh)
  return Fit(jax.device_get(params), float(value), predictions)
