"""Entry point, run on every host: `python -m bert_jax.main --config=configs/tiny.py --workdir=DIR`.

`--mode=prepare` prepares a corpus (once, on one machine); `--mode=dry_run` compiles the job's steps for the
configured mesh, on this machine's devices or a Cloud TPU topology (`dry_run.topology`), and reports memory, FLOPs,
collectives and shardings (see dry_run/ahead_of_time.py); `--mode=plan` finds the largest per-chip batch that fits a TPU
topology for each remat policy (dry_run/planner.py); `--mode=export` writes the workdir's
newest checkpoint as a bundle, a Hugging Face or a Google BERT directory (handoff/export.py); `--mode=features` writes
per-token vectors of text lines (handoff/extract_features.py); `--mode=attention` writes what each attention
head looks at over text lines, as JSON and heat maps (bertology/attention.py); `--mode=heads` each head's importance
to a fine-tuned model and its metric as heads are pruned (bertology/heads.py); `--mode=probe` probes on frozen
layers and their scalar mix (bertology/probe.py); `--mode=feature_based` a BiLSTM tagger on frozen layers
(bertology/feature_based.py); `--mode=pretrain` pretrains
(train/loop.py) and `--mode=finetune` fine-tunes (finetune/job.py; configs/glue.py, squad.py, ner.py, swag.py).
Without `--mode`, a config that sets `finetune.task` fine-tunes and any other pretrains.

The only module that defines flags. `--config.key=value` overrides any key of the config file; an unknown key
is an error. `--verbose` shows what the libraries underneath print (see console.py); `--log_dir=DIR` keeps
absl's full log in a file there.

bert_jax's other modules are imported once the flags are parsed and the console is set up: importing TensorFlow
is where its native start-up lines are printed, or left out.
"""

import math
import os
import sys

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from bert_jax import console

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints and TensorBoard logs go (a path or gs://).")
_MODE = flags.DEFINE_enum(
  "mode",
  None,
  [
    "pretrain",
    "finetune",
    "prepare",
    "dry_run",
    "plan",
    "export",
    "features",
    "attention",
    "heads",
    "probe",
    "feature_based",
  ],
  "pretrain: pretrain (resuming from the workdir). finetune: fine-tune finetune.task (resuming from the workdir). "
  "Without --mode: finetune when the config sets finetune.task, else pretrain. "
  "prepare: train the SentencePiece vocabulary if tokenizer.path is "
  "missing, then tokenize data.input_pattern / data.tfds_name into data.prepared_dir. dry_run: compile the train "
  "and eval steps on abstract inputs and report per-chip memory, whether it fits, FLOPs, collectives and parameter "
  "shardings, for dry_run.topology (a Cloud TPU accelerator type, e.g. v5p-128; needs libtpu) or this machine (on "
  "CPU, a mesh with no -1 gets that many fake devices). plan: the largest per-chip batch that fits "
  "dry_run.topology for each remat policy. export: write the workdir's newest checkpoint (or export.source) to "
  "export.dir as export.format (bundle, huggingface, google). features: per-token vectors of "
  "features.input_pattern's lines into features.output_dir (.npz). attention: what each attention head looks at "
  "over bertology.input_pattern's lines (entropy, [CLS], [SEP], previous/next/self, distance) into "
  "bertology.output_dir (JSON, PNG heat maps and attention maps). heads: each attention head's importance to a model "
  "fine-tuned on finetune.task (its dev split), and the metric as heads are pruned, into bertology.output_dir. "
  "probe: linear probes for finetune.task on each frozen layer and on their learned scalar mix. feature_based: the "
  "BERT paper's BiLSTM tagger for finetune.task on frozen layers (bertology.feature_layers).",
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
  mode = _mode(config)
  from bert_jax import config_checks  # After the console (see the docstring); it imports no TensorFlow.

  try:
    checked = config_checks.check(config, mode)  # Once, before anything is imported, read or written.
  except ValueError as error:
    sys.exit(f"--mode={mode}: {error}")
  from bert_jax import distributed
  from bert_jax.data import prepare
  from bert_jax.handoff import export, extract_features

  one_machine = ("export", "features", "attention", "heads", "probe", "feature_based")
  if mode in one_machine and distributed.settings(config.distributed)[1] not in (None, 1):
    sys.exit(f"--mode={mode} runs on one machine; unset the distributed settings (process count > 1).")
  if mode in ("dry_run", "plan"):
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
    if mode in ("pretrain", "finetune"):  # Preparation, export and features run on one machine: they join no job.
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
    _run(config, mode, checked, prepare, export, extract_features)
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


def _run(config, mode: str, checked, prepare, export, extract_features) -> None:
  from bert_jax import paths

  if mode == "prepare":
    try:
      prepare.prepare_for_run(config, _WORKDIR.value)
    # Bad input, a corpus there from other input, or a full disk: one line naming the file; nothing cut short is kept.
    except (FileNotFoundError, ValueError, paths.WriteError) as error:
      sys.exit(f"--mode=prepare: {error}")
  elif mode in ("dry_run", "plan"):
    _compile_ahead_of_time(config, mode)
  elif mode == "export":
    try:
      export.export(
        config.export.source or _WORKDIR.value, config.export.dir, config.export.format, config.export.overwrite
      )
    except (export.ExportError, export.ExportStopped) as error:  # One line: what failed, and that nothing is left.
      print(error, file=sys.stderr, flush=True)
      sys.exit(error.exit_code)
  elif mode == "features":
    extract_features.extract(config, _WORKDIR.value, checked)
  elif mode in ("attention", "heads", "probe", "feature_based"):
    from bert_jax.bertology import attention, feature_based, heads, probe

    jobs = dict(attention=attention, heads=heads, probe=probe, feature_based=feature_based)
    try:
      jobs[mode].analyse(config, _WORKDIR.value, checked)
    except (FileNotFoundError, FileExistsError, ValueError) as error:  # Bad input: named before anything is written.
      sys.exit(f"--mode={mode}: {error}")
  else:
    _train(config, _WORKDIR.value, checked)


def _mode(config) -> str:
  """The job: --mode, else finetune when the config names a task, else pretrain; a mode the config contradicts
  ends with one line."""
  task = config.finetune.task
  mode = _MODE.value or ("finetune" if task else "pretrain")
  if mode == "pretrain" and task:
    sys.exit(f"--mode=pretrain, but the config sets finetune.task={task!r}: use --mode=finetune, or unset the task.")
  if mode == "finetune" and not task:
    sys.exit("--mode=finetune needs finetune.task (configs/glue.py, squad.py, ner.py and swag.py set it).")
  return mode


def _compile_ahead_of_time(config, mode: str) -> None:
  """--mode=dry_run or plan: a bad value, or no libtpu, ends with one line; a step that does not fit exits 1."""
  from bert_jax.dry_run import ahead_of_time, planner, tpu_topology

  try:
    if mode == "plan":
      if planner.plan(config)["choice"] is None:
        sys.exit(f"The job does not fit {config.dry_run.topology} at batch {config.batch_size}: see the plan above.")
      return
    report = ahead_of_time.dry_run(config)
  except (ValueError, tpu_topology.LibtpuMissing) as error:
    sys.exit(f"--mode={mode}: {error}")
  if not all(step["fits"] for step in report["steps"].values()):
    sys.exit(f"The job does not fit {report['target']}: see the report above.")


def _train(config, workdir: str, checked) -> None:
  """Pretraining or fine-tuning; a run that must stop (a non-finite step under guard.nonfinite='stop', a failed
  save, a workdir another run holds, a write at its start that fails: a full disk) ends with one line saying why and
  a non-zero exit."""
  from bert_jax import distributed, paths
  from bert_jax.finetune import job
  from bert_jax.train import guard, pretraining
  from bert_jax.workdir import checkpoints, lease

  try:
    if checked.mode == "finetune":
      job.finetune(config, workdir, checked)
    else:
      pretraining.pretrain(config, workdir, checked)
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
