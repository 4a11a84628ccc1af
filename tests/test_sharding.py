import jax
import numpy as np
import pytest

from bert_jax import sharding


def test_minus_one_takes_the_remaining_devices():
  assert sharding.mesh_shape(dict(data=-1, fsdp=1, tensor=1), 8) == (8, 1, 1)
  assert sharding.mesh_shape(dict(data=2, fsdp=-1, tensor=2), 8) == (2, 2, 2)
  mesh = sharding.make_mesh(dict(data=-1, fsdp=1, tensor=2))
  assert dict(mesh.shape) == dict(data=4, fsdp=1, tensor=2)
  assert sharding.data_parallel_size(mesh) == 4


@pytest.mark.parametrize(
  "requested, message",
  [
    (dict(data=2, fsdp=1, tensor=1), r"needs 2 devices, but 8 are available"),
    (dict(data=3, fsdp=-1, tensor=1), r"cannot fill 8 devices"),
    (dict(data=-1, fsdp=-1, tensor=1), r"at most one -1"),
    (dict(data=-1, pipeline=2), r"Unknown mesh axes \['pipeline'\]"),
  ],
)
def test_a_mesh_that_does_not_match_the_devices_is_refused(requested, message):
  with pytest.raises(ValueError, match=message):
    sharding.make_mesh(requested)


def test_batch_must_divide_over_data_parallel_devices():
  mesh = sharding.make_mesh(dict(data=-1))
  sharding.check_batch_size(16, mesh)
  with pytest.raises(ValueError, match=r"Global batch size 12 is not divisible by the data-parallel size 8"):
    sharding.check_batch_size(12, mesh)


def test_host_batch_becomes_a_global_array_split_over_the_batch_axes():
  mesh = sharding.make_mesh(dict(data=4, fsdp=2, tensor=1))
  batch = {"input_ids": np.arange(16 * 3, dtype=np.int32).reshape(16, 3)}
  global_batch = sharding.global_batch(batch, mesh)["input_ids"]
  assert global_batch.shape == (16, 3)
  assert {shard.data.shape for shard in global_batch.addressable_shards} == {(2, 3)}
  np.testing.assert_array_equal(jax.device_get(global_batch), batch["input_ids"])
