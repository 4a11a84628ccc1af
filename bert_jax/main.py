"""Entry point, run on every host: `python -m bert_jax.main --config=configs/tiny.py --workdir=DIR`.

`--mode` picks the job from the front door's table (`bert_jax/jobs.py`: pretrain, finetune, prepare, dry_run, plan,
export, features and the BERTology analyses, each with what it does); without it, a config that sets
`finetune.task` fine-tunes and any other pretrains. main checks the config there once, sets the process up (the
multi-host job, libtpu's settings, the devices) and starts the job; what a user must fix ends with one line.

The only module that defines flags. `--config.key=value` overrides any key of the config file; an unknown key
is an error. `--verbose` shows what the libraries underneath print (see console.py); `--log_dir=DIR` keeps
absl's full log in a file there.

bert_jax's other modules are imported once the flags are parsed and the console is set up: importing TensorFlow
is where its native start-up lines are printed, or left out.
"""

import math
import os
import signal
import sys

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from bert_jax import console, jobs  # jobs: the table of modes (it imports no TensorFlow).

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints and TensorBoard logs go (a path or gs://).")
_MODE = flags.DEFINE_enum(
  "mode",
  None,
  list(jobs.JOBS),
  "Without --mode: finetune when the config sets finetune.task, else pretrain. "
  + " ".join(f"{name}: {job.summary}" for name, job in jobs.JOBS.items()),
)
_VERBOSE = flags.DEFINE_bool(
  "verbose",
  False,
  "Show everything the libraries underneath print (TensorFlow's and XLA's start-up lines, JAX's backend probes, "
  "per-checkpoint INFO lines), in absl's log format. Without it the console shows bert_jax's lines and every "
  "warning and error.",
)
flags.mark_flags_as_required(["config", "workdir"])


def _parse_flags(argv: list[str]) -> list[str]:
  try:
    return flags.FLAGS(argv)
  except (AttributeError, KeyError) as error:  # How ml_collections reports an unknown `--config.key`.
    overrides = [arg.split("=")[0] for arg in argv[1:] if arg.startswith("--config.")]
    sys.exit(
      f"Unknown config key {error} in the overrides {overrides}. Every key is defined, with a comment, "
      "in configs/default.py."
    )
  except flags.Error as error:
    sys.exit(f"{error}\nUsage: python -m bert_jax.main --config=configs/tiny.py --workdir=DIR [--config.key=value ...]")


def _quiet_closed_loop_callbacks(unraisable) -> None:
  # After a failed background save, tensorstore still calls back into Orbax's closed event loop, once per pending
  # write: dozens of identical "Event loop is closed" tracebacks that would bury the one line saying what failed.
  if isinstance(unraisable.exc_value, RuntimeError) and str(unraisable.exc_value) == "Event loop is closed":
    return
  sys.__unraisablehook__(unraisable)


def _fake_cpu_devices_for_dry_run(config) -> None:
  """A dry run on CPU gets as many (fake) devices as the mesh names, unless XLA_FLAGS already sets a count."""
  sizes = list(config.mesh.to_dict().values())
  if -1 not in sizes and "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    jax.config.update("jax_num_cpu_devices", math.prod(sizes))


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  try:
    console.configure(_VERBOSE.value, flags.FLAGS.log_dir)
  except ValueError as error:
    raise app.UsageError(str(error)) from None
  sys.unraisablehook = _quiet_closed_loop_callbacks
  config = _CONFIG.value
  try:
    mode = jobs.mode_of(config, _MODE.value)
  except ValueError as error:
    sys.exit(str(error))
  try:
    checked = jobs.check(config, mode)  # Once, before anything is imported, read or written.
  except ValueError as error:
    sys.exit(f"--mode={mode}: {error}")
  job = jobs.JOBS[mode]
  from bert_jax import distributed

  if job.one_machine and distributed.settings(config.distributed)[1] not in (None, 1):
    sys.exit(f"--mode={mode} runs on one machine; unset the distributed settings (process count > 1).")
  if job.compiles_ahead:
    if config.dry_run.topology:
      # Compile-only TPU devices come from libtpu (tpu_topology.devices); this process runs on the CPU backend, so
      # JAX's look at the devices below does not load libtpu before its settings are made.
      jax.config.update("jax_platforms", "cpu")
      # JAX's persistent compilation cache (JAX_COMPILATION_CACHE_DIR) would keep their programs, which a compile-only
      # client cannot load back: every later dry run warned "Error reading persistent compilation cache entry ...
      # PjRtCompiler must be constructed with a Client to call DeserializeLoadedExecutable". This process compiles
      # nothing else; JAX decides once per process, at its first compilation, so it is off from the start.
      jax.config.update("jax_enable_compilation_cache", False)
    else:
      _fake_cpu_devices_for_dry_run(config)
  # On a TPU VM the runtime compiles with libtpu too: the same fiber stacks as the compile-only devices get.
  from bert_jax.dry_run import tpu_topology

  if init_args := tpu_topology.libtpu_init_args(os.environ.get("LIBTPU_INIT_ARGS", "")):
    os.environ["LIBTPU_INIT_ARGS"] = init_args
  # JAX's first look at the devices, where libtpu (if installed) prints its start-up lines on a machine without TPU.
  with console.native_noise_left_out():
    if job.joins_job:  # Preparation, export and the analyses run on one machine: they join no job.
      distributed.initialize(config.distributed)  # Before anything touches a device.
    jax.devices()
  distributed.watch_for_failures()
  # Progress and evaluation lines come from process 0; the others' consoles show warnings and errors.
  console.name_process(jax.process_index(), jax.process_count())
  logging.info(
    "JAX %s, process %d of %d, %d local / %d global devices (%s).",
    jax.__version__,
    jax.process_index(),
    jax.process_count(),
    jax.local_device_count(),
    jax.device_count(),
    jax.devices()[0].platform,
  )
  try:
    _run(config, checked)
  except BaseException as error:
    if jax.process_count() == 1 or isinstance(error, SystemExit) and not error.code:
      raise
    # A failing process tells the others (they stop at once) and leaves without the interpreter's shutdown, which
    # would wait for them at JAX's shutdown barrier.
    distributed.report_failure(error)
    logging.exception("This process failed; the job's other processes stop too.")
    logging.flush()
    sys.stderr.flush()
    os._exit(1)


def _run(config, checked) -> None:
  """The job, through the front door (`jobs.start`); what a user must fix ends with one line naming it, and nothing
  cut short is kept."""
  from bert_jax import paths
  from bert_jax.data import beam_options, vocabulary
  from bert_jax.dry_run import tpu_topology
  from bert_jax.handoff import export_errors

  mode, workdir = checked.mode, _WORKDIR.value
  if mode in ("pretrain", "finetune"):
    _train(config, workdir, checked)
    return
  try:
    result = jobs.start(config, workdir, checked)
  except (export_errors.ExportError, export_errors.ExportStopped) as error:  # One line: what failed, what is left.
    print(error, file=sys.stderr, flush=True)
    sys.exit(error.exit_code)
  except vocabulary.Interrupted as error:  # Without the interpreter's shutdown, which the trainer's thread outlives.
    print(error, file=sys.stderr, flush=True)
    os._exit(128 + signal.SIGINT)
  # Bad input, a corpus there from other input, an output directory in use, a full disk, no libtpu, a failed Beam run.
  except (
    FileNotFoundError,
    FileExistsError,
    ValueError,
    paths.WriteError,
    tpu_topology.LibtpuMissing,
    beam_options.BeamPipelineError,
  ) as error:
    sys.exit(f"--mode={mode}: {error}")
  if mode == "plan" and result["choice"] is None:
    sys.exit(f"The job does not fit {config.dry_run.topology} at batch {config.batch_size}: see the plan above.")
  if mode == "dry_run" and not all(step["fits"] for step in result["steps"].values()):
    sys.exit(f"The job does not fit {result['target']}: see the report above.")


def _train(config, workdir: str, checked) -> None:
  """Pretraining or fine-tuning; a run that must stop (a non-finite step under guard.nonfinite='stop', a failed
  save, a workdir another run holds, a write at its start that fails: a full disk) ends with one line saying why and
  a non-zero exit."""
  from bert_jax import distributed, paths
  from bert_jax.train import guard
  from bert_jax.workdir import checkpoints, lease

  try:
    jobs.start(config, workdir, checked)
  except (guard.TrainingStopped, checkpoints.SaveError, lease.LeaseError, paths.WriteError) as error:
    distributed.report_failure(error)
    # The run has closed its checkpoints, logs and lease. This line is its last: the storage library's threads
    # still running (writes of a save the new holder's cleanup cut short) report their failures to the log file
    # only, and the process leaves without the interpreter's shutdown, where they would print their tracebacks.
    console.only_this_thread()
    logging.error("%s", error)
    logging.flush()
    sys.stderr.flush()
    os._exit(1)


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
