"""Apache Beam's pipeline options from `data.beam_options` (its command-line flags), checked before any work: the
corpus preparation pipeline (`prepare_beam`) and TFDS's Beam-built datasets (`text.prepare_tfds`) run with them; and
a pipeline run to its end (`run_pipeline`), whose failure, a runner that cannot start included, is one line.

The local runner does not notice a worker process that dies (the out-of-memory killer's SIGKILL): its other workers
wait for bundles that never come, with no line and no CPU, for ever. `run_pipeline` watches the local runner's worker
processes (`_WorkerWatch`) and ends such a run with one line naming the dead worker and the rerun that resumes it.
"""

import contextlib
import os
import pathlib
import shlex
import signal
import sys
import threading
import time

from absl import logging

# The local runner's default: Beam's DirectRunner with a worker process per core (each loads the tokenizer once).
_LOCAL_FLAGS = ("--runner=DirectRunner", "--direct_running_mode=multi_processing")


class BeamPipelineError(RuntimeError):
  """A Beam pipeline that failed, or whose runner could not start; the message is one line naming the runner,
  `data.beam_options` and the cause (`--mode=prepare` prints it alone)."""


def run_pipeline(pipeline, options, flags: str, key: str = "data.beam_options") -> object:
  """Runs `pipeline` to its end; returns its result. Whatever the runner raises (a runner that cannot start: Flink's
  job server that cannot be fetched without network; a worker's error) becomes one `BeamPipelineError` line."""
  watched = runner_name(options) == "DirectRunner" and sys.platform == "linux"
  try:
    with _WorkerWatch() if watched else contextlib.nullcontext():
      result = pipeline.run()
      result.wait_until_finish()
  except Exception as error:  # noqa: BLE001 - whatever the runner raised.
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    cause = f"{type(error).__name__}: {lines[0] if lines else 'no message'}"
    raise BeamPipelineError(
      f"The Beam pipeline on {runner_name(options)} ({key}={flags!r}) failed: {cause}"
      + ("" if cause.endswith(".") else ".")
    ) from None
  return result


_WORKER = b"apache_beam.runners.worker.sdk_worker_main"


def _worker_processes() -> dict[int, int]:
  """The local runner's worker processes among this process's descendants (from /proc): pid -> its parent's (the
  shell the runner started it with)."""
  parents, commands = {}, {}
  for entry in pathlib.Path("/proc").iterdir():
    if not entry.name.isdigit():
      continue
    try:
      stat = (entry / "stat").read_text()
      command = (entry / "cmdline").read_bytes()
    except OSError:  # Gone meanwhile.
      continue
    parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    commands[int(entry.name)] = command
  mine, found = {os.getpid()}, {}
  for _ in range(8):  # The runner's children are a shell and the worker it starts.
    mine |= {pid for pid, parent in parents.items() if parent in mine}
  for pid in mine:
    if _WORKER in commands.get(pid, b"") and not commands[pid].startswith(b"/bin/sh"):
      found[pid] = parents[pid]
  return found


class _WorkerWatch:
  """While a local pipeline runs, a thread notes its worker processes every `interval_s`. A worker that is gone with
  no new one started within `grace_s` (Beam starts one when it notices a death; a pipeline's end stops them all and
  returns at once) is a dead worker the runner would wait on for ever: the watch stops the other workers and ends the
  process with one line (exit 1); the runner's thread cannot be woken. The shards written are kept and the staged
  ones are removed by the rerun, which resumes."""

  def __init__(self, interval_s: float = 1.0, grace_s: float = 30.0):
    self.interval_s, self.grace_s = interval_s, grace_s
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._watch, name="Beam worker watch", daemon=True)

  def __enter__(self):
    self._thread.start()
    return self

  def __exit__(self, *exc):
    self._stop.set()
    self._thread.join()
    return False

  def _watch(self) -> None:
    seen, gone = {}, {}
    while not self._stop.wait(self.interval_s):
      live = _worker_processes()
      if live.keys() - seen.keys():  # A new worker: the runner (re)started one.
        gone.clear()
      for pid in seen.keys() - live.keys() - gone.keys():
        gone[pid] = time.monotonic()
      seen.update(live)
      dead = [pid for pid, since in gone.items() if time.monotonic() - since > self.grace_s]
      if dead and not self._stop.is_set():
        self._end(dead[0], live)

  def _end(self, pid: int, live: dict) -> None:
    threading.excepthook = lambda args: None  # The runner's threads fail as its workers go: the line says why.
    for worker, shell in live.items():  # The shell first, or it reports its worker's death ("Killed").
      for process in (shell, worker) if shell != os.getpid() else (worker,):
        try:
          os.kill(process, signal.SIGKILL)
        except OSError:
          pass
    logging.error(
      "A Beam worker process (pid %d) died mid-run (killed: out of memory?); the local runner would wait for it for "
      "ever: stopped after %.0f s. The shards written are kept: rerun the same command to resume, with fewer workers "
      "(--direct_num_workers in data.beam_options) or more memory.",
      pid,
      self.grace_s,
    )
    logging.flush()
    sys.stderr.flush()
    os._exit(1)


def require_beam(key: str):
  """Imports apache_beam, or raises naming `key` (the setting that asked for it) and the install command."""
  try:
    import apache_beam
  except ImportError as error:
    raise ImportError(
      f"{key} needs Apache Beam, which is not installed: pip install -e '.[beam]' (or pip install apache-beam)."
    ) from error
  return apache_beam


def pipeline_options(flags: str, key: str = "data.beam_options"):
  """Beam's PipelineOptions from `flags` (command-line flags, e.g. "--runner=DataflowRunner --project=P"). Without
  `--runner`: the local runner, a worker process per core (`--direct_num_workers` overrides). Refuses flags Beam does
  not know, naming them, before any work (Beam itself would ignore them with a warning)."""
  require_beam(key)
  from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

  try:
    args = shlex.split(flags)
  except ValueError as error:
    raise ValueError(f"{key}={flags!r} is not a list of command-line flags: {error}.") from error
  options = PipelineOptions(args)
  known = options.get_all_options(drop_default=True)
  unknown = sorted(set(options.get_all_options(retain_unknown_options=True, drop_default=True)) - set(known))
  if unknown:
    raise ValueError(
      f"{key}={flags!r}: Beam knows no option {', '.join('--' + name for name in unknown)} (expected Beam's pipeline "
      "flags, e.g. --runner=DataflowRunner --project=P --region=R --temp_location=gs://B/tmp)."
    )
  if options.view_as(StandardOptions).runner is None:
    options = PipelineOptions([*_LOCAL_FLAGS, *args])
    if "direct_num_workers" not in known:
      options.view_as(DirectOptions).direct_num_workers = os.cpu_count() or 1
  return options


def runner_name(options) -> str:
  from apache_beam.options.pipeline_options import StandardOptions

  runner = options.view_as(StandardOptions).runner
  return runner if isinstance(runner, str) else type(runner).__name__


def check_runner(options, key: str = "data.beam_options") -> None:
  """Refuses a runner Beam cannot create (a misspelled name; a runner whose package is not installed), before any
  work, naming it."""
  from apache_beam.runners.runner import create_runner

  name = runner_name(options)
  try:
    create_runner(name)
  except (ValueError, ImportError) as error:
    raise ValueError(f"{key} names runner {name!r}, which Beam cannot create: {error}") from error
