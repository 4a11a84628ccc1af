"""Joining the processes of a multi-host job (`jax.distributed.initialize`), before JAX touches a device.

* TPU VM slices: nothing to configure. The slice's metadata tells JAX the coordinator, process count and id.
* Elsewhere (GPU clusters, several CPU processes): `config.distributed.coordinator_address` (host:port of
  process 0), `num_processes` and `process_id`, or the environment variables JAX_COORDINATOR_ADDRESS,
  JAX_NUM_PROCESSES and JAX_PROCESS_ID for keys left empty. Under SLURM or Open MPI the address alone suffices:
  JAX reads the process count and id from the cluster.
* A single machine without these settings runs as one process (so does a TPU host without slice metadata).

A process that fails brings the others down within a second, instead of leaving them blocked in a collective until
a timeout: it posts its error to the coordination service's key-value store (`report_failure`), and a thread on
every process (`watch_for_failures`) polls that key and ends its process with the failing one's error as its last
line.
"""

import atexit
import glob
import os
import sys
import threading

import jax
from absl import logging

_FAILED_KEY = "bert_jax/failed"


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


def _client():
  """The coordination service's client of a multi-process job, None otherwise."""
  from jax._src import distributed as jax_distributed  # The one handle JAX offers on its key-value store.

  return jax_distributed.global_state.client if jax.process_count() > 1 else None


def report_failure(error: BaseException) -> None:
  """Tells the job's other processes that this one fails with `error`; they end at once (see the module
  docstring). Does nothing in a one-process run."""
  client = _client()
  if client is None:
    return
  try:
    client.key_value_set(_FAILED_KEY, f"process {jax.process_index()} failed: {type(error).__name__}: {error}")
  except Exception as posting:  # Another process posted first, or the service is gone: nothing more to tell.
    logging.warning("Could not tell the other processes of this failure: %s", posting)


def watch_for_failures(poll_seconds: float = 0.5) -> None:
  """Starts a thread that ends this process (exit 1) once another process has reported a failure, with that
  process's error as the last line on this console. Does nothing in a one-process run.

  The thread is stopped and joined when the interpreter exits, before JAX's own exit handler shuts the
  coordination client down: a daemon thread still inside a call to the client when Python finalises is unwound
  through the binding's C++ frames, which aborts the process ("FATAL: exception not rethrown") after a clean run.
  """
  client = _client()
  if client is None:
    return
  stop = threading.Event()

  def watch():
    while not stop.wait(poll_seconds):
      try:
        message = client.key_value_try_get(_FAILED_KEY)
      except Exception:  # Not posted (or the job is shutting down).
        continue
      logging.error("Stopping: %s", message)
      logging.flush()
      sys.stderr.flush()
      os._exit(1)

  thread = threading.Thread(target=watch, name="failure-watch", daemon=True)
  thread.start()

  def stop_watching():
    stop.set()
    thread.join(timeout=30)

  atexit.register(stop_watching)  # Registered after JAX's, so it runs before JAX shuts the client down.
