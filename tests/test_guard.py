"""Steps that must not count: a non-finite or spiking step changes nothing, is counted and named; a run that
diverges stops or skips as configured, and never writes a checkpoint with non-finite parameters."""

import os

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from etils import epath

from bert_jax import jobs, progress, sharding
from bert_jax.train import guard
from tests.helpers import data_parallel_run, synthetic_batches


def _host(tree):
  return jax.tree.map(np.asarray, jax.device_get(tree))


def _moved(ema, params, decay: float):
  """The moving average's update, in numpy."""
  return jax.tree.map(lambda e, p: decay * e + (1 - decay) * p, ema, params)


def _assert_close(actual, expected):
  jax.tree.map(lambda a, e: np.testing.assert_allclose(a, e, rtol=1e-6, atol=1e-7), actual, expected)


@pytest.mark.slow
def test_a_non_finite_step_changes_neither_parameters_nor_optimizer_and_the_next_step_applies(small_config):
  """... nor the parameters' moving average (ema_decay), which an applied step moves towards the new parameters."""
  small_config.ema_decay = 0.9
  run, state = data_parallel_run(small_config, jax.devices()[:1])
  initial = _host(state)
  jax.tree.map(np.testing.assert_array_equal, initial.ema, initial.params)  # It starts at the parameters.
  good, other = synthetic_batches(small_config, 2)
  bad = dict(good, masked_lm_weights=good["masked_lm_weights"].copy())
  bad["masked_lm_weights"][0, 0] = np.nan  # The loss and every gradient become NaN.
  key = jax.random.key(7)
  state, metrics = run.train_step(state, sharding.global_batch(good, run.mesh), key)
  before = _host(state)
  _assert_close(before.ema, _moved(initial.ema, before.params, 0.9))
  state, metrics = run.train_step(state, sharding.global_batch(bad, run.mesh), key)
  after = _host(state)
  jax.tree.map(
    np.testing.assert_array_equal,
    (after.params, after.opt_state, after.ema),
    (before.params, before.opt_state, before.ema),
  )
  assert int(after.step) == 2  # The batch is consumed: data position and dropout stay an uninterrupted run's.
  assert float(metrics["skipped_count"]) == 1 and float(metrics["nonfinite_count"]) == 1
  assert np.isnan(float(metrics["skipped_loss"])) and float(metrics["loss"]) == 0  # Left out of the averages.
  summary = progress.summarize(_host(metrics), 1)
  assert summary["skipped_steps"] == 1 and summary["nonfinite_steps"] == 1
  state, metrics = run.train_step(state, sharding.global_batch(other, run.mesh), key)
  assert float(metrics["skipped_count"]) == 0 and np.isfinite(float(metrics["loss"]))
  changed = jax.tree.map(lambda a, b: not np.array_equal(a, b), _host(state.params), after.params)
  assert all(jax.tree.leaves(changed))
  assert int(state.opt_state[1][0].count) == 2  # Adam (and the schedule) counted the two applied steps only.
  _assert_close(_host(state.ema), _moved(after.ema, _host(state.params), 0.9))


@pytest.mark.slow
def test_a_loss_spike_above_the_running_average_is_skipped_when_asked(small_config):
  small_config.guard.update(spike_factor=2.0, spike_window=10)
  run, state = data_parallel_run(small_config, jax.devices()[:1])
  batch = sharding.global_batch(synthetic_batches(small_config, 1)[0], run.mesh)
  key = jax.random.key(7)
  initial = _host(state.params)
  low = state.replace(guard={"loss_average": np.float32(0.1), "finite_steps": np.int32(10)})  # Loss ~6 is a spike.
  skipped, metrics = run.train_step(low, batch, key)
  assert float(metrics["skipped_count"]) == 1 and float(metrics["nonfinite_count"]) == 0
  jax.tree.map(np.testing.assert_array_equal, _host(skipped.params), initial)
  young = run.init_state(small_config.seed).replace(
    guard={"loss_average": np.float32(0.1), "finite_steps": np.int32(9)}
  )  # Not judged yet.
  applied, metrics = run.train_step(young, batch, key)
  assert float(metrics["skipped_count"]) == 0
  assert float(applied.guard["finite_steps"]) == 10
  assert float(applied.guard["loss_average"]) == pytest.approx(0.1 + (float(metrics["loss"]) - 0.1) / 10, rel=1e-5)


def _checkpoint_params(workdir):
  steps = sorted(int(p) for p in os.listdir(os.path.join(workdir, "checkpoints")))
  root = epath.Path(workdir) / "checkpoints"
  return {step: ocp.StandardCheckpointer().restore(root / str(step) / "params") for step in steps}


@pytest.mark.parametrize("policy", ["stop", "skip"])
@pytest.mark.slow
def test_a_diverging_run_stops_naming_the_step_and_keeps_only_finite_checkpoints(small_config, tmp_path, policy):
  # Healthy for 4 steps (checkpoints 2 and 4), then a learning rate that overflows the parameters.
  small_config.update(num_train_steps=4, checkpoint_every_steps=2, keep_checkpoints=2, eval_steps=0)
  jobs.run(small_config, str(tmp_path), "pretrain")
  small_config.update(num_train_steps=20, learning_rate=1e30, max_grad_norm=1e30, warmup_steps=0)
  small_config.guard.update(nonfinite=policy, max_consecutive_skips=3)
  with pytest.raises(guard.TrainingStopped, match=r"Step (5|6|7|8)\b" if policy == "stop" else "3 consecutive") as e:
    jobs.run(small_config, str(tmp_path), "pretrain")
  saved = _checkpoint_params(str(tmp_path))
  for step, params in saved.items():
    assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(params)), step
  # The message names the checkpoint a resume would start from, and what it may hold.
  assert f"Its newest checkpoint is step {max(saved)}, with finite values only" in str(e.value)
