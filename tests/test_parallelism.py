"""DP, FSDP, TP and mixes are config changes: one train step on 8 fake devices equals the step on 1 device."""

import jax
import numpy as np
import pytest

from bert_jax import sharding
from bert_jax.model import param_layout
from bert_jax.train import pretraining
from tests.helpers import synthetic_batches

MESHES = {
  "dp8": dict(data=8, fsdp=1, tensor=1),
  "fsdp8": dict(data=1, fsdp=8, tensor=1),
  "dp4_tp2": dict(data=4, fsdp=1, tensor=2),
  "fsdp4_tp2": dict(data=1, fsdp=4, tensor=2),
}


def _run(config, devices, mesh_shape):
  config.mesh.update(dict(dict(data=1, fsdp=1, tensor=1), **mesh_shape))
  return pretraining.make_run(config, devices)


def _step(config, devices, mesh_shape):
  run = _run(config, devices, mesh_shape)
  state = run.init_state(config.seed)
  state, metrics = run.train_step(
    state, sharding.global_batch(synthetic_batches(config, 1)[0], run.mesh), jax.random.key(3)
  )
  return state, float(metrics["loss"])


_ONE_DEVICE = {}


def _one_device_step(config) -> tuple[dict, float]:
  """The step on one device (parameters on the host, loss), made once per config: every mesh is compared with it."""
  key = config.to_json_best_effort(sort_keys=True)
  if key not in _ONE_DEVICE:
    state, loss = _step(config, jax.devices()[:1], dict(data=1))
    _ONE_DEVICE[key] = (jax.device_get(state.params), loss)
  return _ONE_DEVICE[key]


@pytest.fixture
def parallel_config(small_config):
  small_config.model.vocab_size = 104  # Divisible by the tensor axis.
  return small_config


@pytest.mark.parametrize("name", sorted(MESHES))
@pytest.mark.slow
def test_one_step_on_eight_devices_equals_one_device(parallel_config, name):
  reference_params, reference_loss = _one_device_step(parallel_config)
  state, loss = _step(parallel_config, jax.devices(), MESHES[name])
  np.testing.assert_allclose(loss, reference_loss, rtol=1e-5)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5), jax.device_get(state.params), reference_params
  )


def test_fsdp_splits_every_large_parameter_eight_ways(small_config):
  config = small_config
  config.model.update(
    vocab_size=4096, hidden_size=256, num_heads=4, intermediate_size=2048, max_position_embeddings=512
  )
  run = _run(config, jax.devices(), MESHES["fsdp8"])
  abstract, shardings = run.abstract, run.shardings
  large = 0
  for (path, leaf), leaf_sharding in zip(
    jax.tree_util.tree_leaves_with_path(abstract.params), jax.tree.leaves(shardings.params), strict=True
  ):
    nbytes = int(np.prod(leaf.shape)) * leaf.dtype.itemsize
    if nbytes > 1 << 20:  # Above 1 MiB: a device holds at most an eighth (plus padding).
      large += 1
      per_device = int(np.prod(leaf_sharding.shard_shape(leaf.shape))) * leaf.dtype.itemsize
      assert per_device <= nbytes / 8 + 4096, (jax.tree_util.keystr(path), leaf.shape, leaf_sharding.spec)
  assert large >= 5  # Word embeddings and both feed-forward kernels of each layer.


@pytest.mark.slow
def test_scanned_rematerialised_layers_on_fsdp_and_tensor_axes_equal_one_device(parallel_config):
  config = parallel_config
  config.model.update(hidden_dropout_prob=0.0, attention_dropout_prob=0.0)  # Scan splits dropout keys.
  reference, reference_loss = _step(config, jax.devices()[:1], dict(data=1))

  # The same initial state (scanned init draws other random numbers), in the scanned layout on FSDP 4 x TP 2.
  initial = _run(config, jax.devices()[:1], dict(data=1)).init_state(config.seed)
  config.model.update(scan_layers=True, remat="save_dots")
  run = _run(config, jax.devices(), MESHES["fsdp4_tp2"])
  state = jax.device_put(param_layout.convert(jax.device_get(initial), scanned=True), run.shardings)
  kernel = state.params["bert"]["layers"]["intermediate"]["kernel"]  # [layers, embed, mlp]
  assert kernel.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")

  batch = sharding.global_batch(synthetic_batches(config, 1)[0], run.mesh)
  state, metrics = run.train_step(state, batch, jax.random.key(3))
  np.testing.assert_allclose(float(metrics["loss"]), reference_loss, rtol=1e-5)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5),
    param_layout.convert(jax.device_get(state.params), scanned=False),
    jax.device_get(reference.params),
  )
