"""Cloud TPU slices as compile-only devices: a real TPU topology, on a machine without a TPU.

With libtpu installed (`pip install -e '.[tpu]'`), `jax.experimental.topologies.get_topology_desc` returns the
devices of a TPU slice that is not there, and `jax.jit(...).lower(...).compile()` runs XLA's TPU compiler for them:
the TPU's fusion, buffer assignment and HBM limit, the collectives SPMD partitioning inserts. Nothing can run on
these devices.

Accelerator types are Cloud TPU's names:
  v4-N, v5p-N   N counts TensorCores, two per chip (megacore: one JAX device per chip): v4-8 is 4 chips, 2x2x1;
  v5litepod-N (also v5e-N), v6e-N   N counts chips, one JAX device each: v5e-8 is 8 chips, 2x4.
Power-of-two sizes, from one host (v4-8, v5p-8, v5e-1/4/8, v6e-1/4/8) to full pods; hosts hold 4 chips (2x2x1)
except the single-host v5e/v6e slices, which hold all 8. `num_slices` > 1 gives a multi-slice topology (slices
joined over the data-center network), whose devices carry their `slice_index`.
"""

import contextlib
import dataclasses
import functools
import math
import mmap
import os
import re

import jax
import jax.numpy as jnp

INSTALL_HINT = "pip install -e '.[tpu]' in the repository (libtpu: XLA's TPU compiler; no TPU needed)"


@dataclasses.dataclass(frozen=True)
class Generation:
  prefix: str  # the topology name's prefix (v5p's is "v5")
  cores_per_chip: int  # how many units the accelerator-type name counts per chip
  dims: int  # 3-D torus (v4, v5p) or 2-D (v5e, v6e)
  chip_config_name: str  # "megacore": one device per chip of two TensorCores


GENERATIONS = {
  "v4": Generation("v4", 2, 3, "megacore"),
  "v5p": Generation("v5", 2, 3, "megacore"),
  "v5e": Generation("v5e", 1, 2, "default"),
  "v6e": Generation("v6e", 1, 2, "default"),
}
_ALIASES = {"v5litepod": "v5e", "v5lite": "v5e"}


@dataclasses.dataclass(frozen=True)
class Topology:
  """A Cloud TPU slice (or `num_slices` of them) by its accelerator type."""

  accelerator: str  # as named, e.g. "v5p-128"
  generation: str  # a key of GENERATIONS
  chips: int  # per slice
  shape: tuple[int, ...]  # chips along each torus axis
  num_slices: int = 1

  @property
  def name(self) -> str:
    """The topology name libtpu takes, e.g. "v5:4x4x4"."""
    return f"{GENERATIONS[self.generation].prefix}:{'x'.join(map(str, self.shape))}"

  @property
  def chips_per_host(self) -> tuple[int, int, int]:
    if GENERATIONS[self.generation].dims == 2 and self.chips <= 8:
      return (*self.shape, 1)  # v5e-8 and v6e-8 are one host with all eight chips.
    return (2, 2, 1)

  @property
  def hosts(self) -> int:
    return self.num_slices * self.chips // math.prod(self.chips_per_host)

  @property
  def wrap(self) -> tuple[bool, bool, bool]:
    """Wrap-around links: a 3-D slice of whole 4x4x4 cubes is a torus; a 2-D axis of 16 chips is a ring."""
    if GENERATIONS[self.generation].dims == 3:
      return (min(self.shape) >= 4,) * 3
    return (*(size == 16 for size in self.shape), False)

  def __str__(self) -> str:
    slices = f" x {self.num_slices} slices" if self.num_slices > 1 else ""
    return f"{self.accelerator} ({self.name}, {self.chips} chips{slices}, {self.hosts} hosts)"


def _shape(chips: int, dims: int) -> tuple[int, ...]:
  """Chips along each axis, as even as powers of two allow, smaller axes first (v4/v5p: 2x2x1 for 4 chips)."""
  if dims == 3 and chips == 4:
    return (2, 2, 1)
  shape = [1] * dims
  for _ in range(int(math.log2(chips))):
    shape[shape.index(min(shape))] *= 2
  return tuple(sorted(shape))


def parse(accelerator: str, num_slices: int = 1) -> Topology:
  """A Cloud TPU accelerator type ("v4-8", "v5litepod-16", "v5e-8", "v5p-128", "v6e-256") -> Topology; raises
  ValueError naming what is accepted."""
  match = re.fullmatch(r"(v\d+[a-z]*)-(\d+)", accelerator.strip().lower())
  accepted = "v4-N, v5p-N (N TensorCores: 8, 16, ... 8192), v5litepod-N / v5e-N, v6e-N (N chips: 1, 4, 8, 16, ... 256)"
  if not match:
    raise ValueError(f"dry_run.topology={accelerator!r} is not a Cloud TPU accelerator type; expected {accepted}.")
  family, count = _ALIASES.get(match[1], match[1]), int(match[2])
  if family not in GENERATIONS:
    raise ValueError(f"dry_run.topology={accelerator!r}: unknown TPU generation {match[1]!r}; expected {accepted}.")
  generation = GENERATIONS[family]
  chips, leftover = divmod(count, generation.cores_per_chip)
  # 2-D slices as Cloud TPU sells them; 3-D ones from a 2x2x1 host upwards.
  sizes = {1, 4, 8, 16, 32, 64, 128, 256} if generation.dims == 2 else {4 << k for k in range(11)}
  if leftover or chips not in sizes:
    raise ValueError(f"dry_run.topology={accelerator!r} names {count} of {family}'s units; expected {accepted}.")
  if num_slices < 1:
    raise ValueError(f"dry_run.num_slices={num_slices} must be at least 1.")
  return Topology(accelerator, family, chips, _shape(chips, generation.dims), num_slices)


class LibtpuMissing(RuntimeError):
  """A TPU topology was asked for where libtpu is not installed."""


# libtpu's compiler lowers a fused convolution's window search on fibers, and the recursion of its cost estimate can
# overflow a fiber's default stack: for BERT-Base's train step at 512 tokens on v6e-8 (attention dropout on, 16 rows a
# chip, remat none), libtpu 0.0.42.1 died with "SIGSEGV STACK OVERFLOW" in
# FusedSpatialMajorConvolution::CalculateClassicConvWindowsCost in 4 of 5 compiles, which of them varying from run to
# run; with the fibers' stacks at 16 MiB, 6 of 6 compiled (docs/tpu.md, "libtpu's compiler crash").
_FIBER_STACK_FLAG = "fibers_default_thread_stack_size"
FIBER_STACK_BYTES = 16 << 20


def libtpu_init_args(current: str) -> str:
  """LIBTPU_INIT_ARGS `current` with the compiler's fiber stacks raised to FIBER_STACK_BYTES, unless `current` sets
  them already or the installed libtpu does not know the flag (libtpu refuses to start on a flag it does not know)."""
  if _FIBER_STACK_FLAG in current or not _libtpu_knows(_FIBER_STACK_FLAG):
    return current
  return f"{current} --{_FIBER_STACK_FLAG}={FIBER_STACK_BYTES}".strip()


@functools.cache
def _libtpu_knows(flag: str) -> bool:
  """Whether the installed libtpu defines the command-line flag `flag` (its absl flag symbol is in the library)."""
  try:
    import libtpu
  except ImportError:
    return False
  try:
    with open(os.path.join(os.path.dirname(libtpu.__file__), "libtpu.so"), "rb") as library:
      with mmap.mmap(library.fileno(), 0, access=mmap.ACCESS_READ) as contents:
        return contents.find(f"FLAGS_{flag}".encode()) >= 0
  except (OSError, ValueError):
    return False


@contextlib.contextmanager
def _libtpu_environment(accelerator: str):
  """While libtpu loads: no metadata server to query (the topology is given, not discovered); a type and a worker
  so that it does not print four lines of warnings on a machine that is not a TPU VM (they only name this host);
  other processes may load libtpu at the same time (compile-only devices touch no chip; its lockfile otherwise
  refuses a second process: test workers, a dry run beside a run); and the compiler's fibers get stacks that its
  convolution lowering does not overflow (`libtpu_init_args`). Values already set are kept, and the environment is
  restored afterwards, so that no child process inherits these (a notebook would take itself for a TPU VM)."""
  settings = {
    "TPU_SKIP_MDS_QUERY": "1",
    "TPU_ACCELERATOR_TYPE": accelerator,
    "TPU_WORKER_HOSTNAMES": "localhost",
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
  }
  added = [name for name in settings if name not in os.environ]
  os.environ.update({name: settings[name] for name in added})
  init_args = os.environ.get("LIBTPU_INIT_ARGS")
  if raised := libtpu_init_args(init_args or ""):
    os.environ["LIBTPU_INIT_ARGS"] = raised
  try:
    yield
  finally:
    for name in added:
      os.environ.pop(name, None)
    if init_args is None:
      os.environ.pop("LIBTPU_INIT_ARGS", None)
    else:
      os.environ["LIBTPU_INIT_ARGS"] = init_args


def devices(topology: Topology) -> list[jax.Device]:
  """The slice's compile-only devices (every slice's, in slice order). Raises LibtpuMissing, saying how to install
  it, without libtpu."""
  from jax.experimental import topologies

  if not libtpu_available():
    raise LibtpuMissing(f"Compiling for {topology} needs libtpu: {INSTALL_HINT}.")
  with _libtpu_environment(topology.accelerator):  # libtpu reads it when it loads, on the first topology.
    description = topologies.get_topology_desc(
      topology_name=topology.name,
      platform="tpu",
      chip_config_name=GENERATIONS[topology.generation].chip_config_name,
      chips_per_host_bounds=topology.chips_per_host,
      wrap=topology.wrap,
      **({"num_slices": topology.num_slices} if topology.num_slices > 1 else {}),
    )
  return list(description.devices)


def libtpu_available() -> bool:
  try:
    import libtpu  # noqa: F401
  except ImportError:
    return False
  return True


_USABLE_HBM: dict[str, int | None] = {}


def usable_hbm_bytes(device: jax.Device) -> int | None:
  """The HBM one program may use on `device`'s chip, as XLA's TPU compiler reports it (less than the chip's HBM:
  the runtime keeps some); None if the compiler did not say. Asked once per chip kind: XLA names the limit when a
  program does not fit, so the probe asks for 1 TiB of temporaries."""
  if device.device_kind not in _USABLE_HBM:
    placed = jax.sharding.SingleDeviceSharding(device)
    probe = jax.jit(lambda x: jnp.broadcast_to(x, (1 << 38,)) * 3.0)
    try:
      probe.lower(jax.ShapeDtypeStruct((1,), jnp.float32, sharding=placed)).compile()
      found = {}
    except Exception as error:  # noqa: BLE001 (the compiler's error type is jaxlib's)
      found = parse_hbm_error(str(error))
    _USABLE_HBM[device.device_kind] = found.get("available")
  return _USABLE_HBM[device.device_kind]


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
_SIZE = r"([\d.]+)\s*([KMGTP]?)i?B?"


def _bytes(number: str, unit: str) -> int:
  return int(float(number) * _UNITS[unit])


def parse_hbm_error(message: str) -> dict:
  """The figures of XLA:TPU's RESOURCE_EXHAUSTED message: `required` and `available` bytes (and `exceeded_by`)
  where it names them; {} for another error."""
  if "RESOURCE_EXHAUSTED" not in message and "Ran out of memory" not in message:
    return {}
  found = {}
  for key, pattern in (
    ("required", rf"required for [^(]*\({_SIZE}\)"),
    ("available", rf"available HBM \({_SIZE}\)"),
    ("required", rf"Used {_SIZE} of"),
    ("available", rf"Used [\d.]+\s*[KMGTP]?i?B? of {_SIZE} hbm"),
    ("exceeded_by", rf"Exceeded hbm capacity by {_SIZE}"),
  ):
    match = re.search(pattern, message)
    if match and key not in found:
      found[key] = _bytes(match[1], match[2])
  if "required" in found and "available" in found:
    found.setdefault("exceeded_by", found["required"] - found["available"])
  return found
