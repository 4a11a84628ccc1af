"""The device mesh, and how logical axis names and batches map onto it.

Mesh axes are `data`, `fsdp` and `tensor`. Parameters carry logical names (see `model/encoder.py`); one short list of
rules in the config maps each name to mesh axes, so DP, FSDP, TP and mixes are config changes. Batches are
split over `data` x `fsdp` on their leading axis.
"""

from collections.abc import Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")


def mesh_shape(requested: dict, num_devices: int) -> tuple[int, ...]:
  """Resolves one `-1` axis to the remaining devices; raises if the product is not `num_devices`."""
  unknown = sorted(set(requested) - set(MESH_AXES))
  if unknown:
    raise ValueError(f"Unknown mesh axes {unknown}; the mesh has axes {MESH_AXES}.")
  sizes = [int(requested.get(axis, 1)) for axis in MESH_AXES]
  described = ", ".join(f"{axis}={size}" for axis, size in zip(MESH_AXES, sizes, strict=True))
  if sizes.count(-1) > 1 or any(size == 0 or size < -1 for size in sizes):
    raise ValueError(f"Mesh ({described}) must have positive sizes, with at most one -1.")
  if -1 in sizes:
    known = int(np.prod([size for size in sizes if size != -1]))
    if num_devices % known:
      raise ValueError(
        f"Mesh ({described}) cannot fill {num_devices} devices: {num_devices} is not divisible by {known}."
      )
    sizes[sizes.index(-1)] = num_devices // known
  if int(np.prod(sizes)) != num_devices:
    raise ValueError(
      f"Mesh ({described}) needs {int(np.prod(sizes))} devices, but {num_devices} are "
      f"available; set one mesh axis to -1 to take the rest."
    )
  return tuple(sizes)


def make_mesh(requested: dict, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """The mesh over `devices` (default: all). Devices of several TPU slices (multi-slice, joined over the data-center
  network) put the slices along `data`: only the data-parallel gradient reduction crosses slices."""
  devices = jax.devices() if devices is None else list(devices)
  shape = mesh_shape(requested, len(devices))
  # Auto axes: XLA's partitioner propagates shardings from the parameters and the batch (GSPMD).
  axis_types = (AxisType.Auto,) * len(MESH_AXES)
  slices = len({getattr(device, "slice_index", 0) for device in devices})
  if slices == 1:
    return jax.make_mesh(shape, MESH_AXES, devices=devices, axis_types=axis_types)
  if shape[0] % slices:
    raise ValueError(
      f"The devices span {slices} slices, which the mesh's data axis ({shape[0]}) must split over: "
      f"set mesh.data to a multiple of {slices}."
    )
  per_slice = (shape[0] // slices, *shape[1:])
  grid = mesh_utils.create_hybrid_device_mesh(per_slice, (slices, 1, 1), devices, allow_split_physical_axes=True)
  return Mesh(grid, MESH_AXES, axis_types=axis_types)


def data_parallel_size(mesh: Mesh) -> int:
  return int(np.prod([mesh.shape[axis] for axis in BATCH_AXES]))


def check_batch_size(global_batch_size: int, mesh: Mesh, num_microbatches: int = 1) -> None:
  size = data_parallel_size(mesh)
  if global_batch_size % (size * num_microbatches) or global_batch_size % jax.process_count():
    raise ValueError(
      f"Global batch size {global_batch_size} is not divisible by the data-parallel size {size} (mesh data x fsdp)"
      f" x {num_microbatches} microbatch(es), and by the {jax.process_count()} host(s)."
    )


def logical_to_sharding(logical_specs, mesh: Mesh, rules: Sequence[tuple]):
  """A tree of logical PartitionSpecs -> a tree of NamedShardings on `mesh`."""
  return nn.logical_to_mesh_sharding(logical_specs, mesh, [tuple(rule) for rule in rules])


def with_shardings(abstract, shardings):
  """`abstract` (a tree of arrays or ShapeDtypeStructs) as ShapeDtypeStructs placed in `shardings`."""
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)


def batch_sharding(mesh: Mesh, members: bool = False) -> NamedSharding:
  """Rows split over the batch axes; with `members`, behind a leading member axis (a sweep's own rows per member)
  that every device holds whole."""
  return NamedSharding(mesh, PartitionSpec(None, BATCH_AXES) if members else PartitionSpec(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def global_batch(host_batch: dict, mesh: Mesh, members: bool = False) -> dict:
  """This host's numpy batch -> global jax.Arrays sharded over the batch axes of `mesh` (with `members`: arrays
  [members, rows, ...], this host's rows of every member)."""
  sharding = batch_sharding(mesh, members)
  return {name: jax.make_array_from_process_local_data(sharding, value) for name, value in host_batch.items()}
