"""Joining the processes of a multi-host job (`jax.distributed.initialize`), before JAX touches a device.

* TPU VM slices: nothing to configure. The slice's metadata tells JAX the coordinator, process count and id.
* Elsewhere (GPU clusters, several CPU processes): `config.distributed.coordinator_address` (host:port of
  process 0), `num_processes` and `process_id`, or the environment variables JAX_COORDINATOR_ADDRESS,
  JAX_NUM_PROCESSES and JAX_PROCESS_ID for keys left empty. Under SLURM or Open MPI the address alone suffices:
  JAX reads the process count and id from the cluster.
* A single machine without these settings runs as one process (so does a TPU host without slice metadata).
"""

import glob
import os

import jax
from absl import logging


def settings(config) -> tuple[str, int | None, int | None]:
  """(coordinator address, process count, process id) from `config.distributed` and the environment."""
  address = config.coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS", "")
  num_processes = config.num_processes or int(os.environ.get("JAX_NUM_PROCESSES", "0"))
  process_id = config.process_id if config.process_id >= 0 else int(os.environ.get("JAX_PROCESS_ID", "-1"))
  if num_processes < 0:
    raise ValueError(f"distributed.num_processes={num_processes} must be positive (0: from the cluster).")
  if num_processes and not -1 <= process_id < num_processes:
    raise ValueError(f"distributed.process_id={process_id} must be in [0, num_processes={num_processes}).")
  if (num_processes or process_id >= 0) and not address:
    raise ValueError(
      f"distributed.num_processes={num_processes} / process_id={process_id} are set but no coordinator address: "
      "set distributed.coordinator_address (host:port of process 0) or JAX_COORDINATOR_ADDRESS."
    )
  return address, num_processes or None, process_id if process_id >= 0 else None


def _on_tpu_vm() -> bool:
  # TPU chips appear as /dev/accel* (v2-v4) or VFIO groups (v5e, v5p, v6e).
  return bool(glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*"))


def initialize(config) -> None:
  """Joins this process to the job described by `config.distributed` (see the module docstring)."""
  if jax.distributed.is_initialized():
    return
  address, num_processes, process_id = settings(config)
  if address:
    logging.info("Joining coordinator %s as process %s of %s.", address, process_id, num_processes)
    jax.distributed.initialize(address, num_processes=num_processes, process_id=process_id)
  elif _on_tpu_vm():
    try:
      jax.distributed.initialize()
    except ValueError as error:  # A single TPU host without slice metadata (e.g. Colab): one process.
      logging.info("Not joining a multi-host job (%s); running as one process.", error)
