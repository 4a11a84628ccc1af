"""The training loop, one for every job: steps, progress, evaluation, checkpoints, preemption.

A job (pretraining in `train/pretraining.py`, fine-tuning in `finetune/job.py`) is a `Job`: it supplies what
differs (its run, batches, start, evaluation, what a checkpoint holds, what is written at the end). The loop owns
the rest, the same for every job:
- the workdir's lease, the checkpoint manager and the TensorBoard writers: every write into the workdir is
  preceded by `held.check()`, and every checkpoint commit too (`checkpoints.make_manager`), so a run that another
  run took over (it was stopped past the lease's timeout) writes nothing more and stops with `LeaseLostError`;
- the guard monitor (a non-finite step stops the run or is skipped, see `guard.py`), the metric sums, the ticker
  and the profile window;
- the cadence: a progress line every `log_every_steps`, an evaluation and a save where the job asks for one, and
  both at the last step;
- preemption: SIGTERM (or JAX's preemption sync point on several hosts) stops every host at one agreed step, with a
  checkpoint; the same command resumes;
- the header before the first step and the summary after the last.

Where a run starts (the workdir's newest readable checkpoint, else `init_from`, else a fresh seed) is
`train/start_order.py`, which the job's `start` calls with its own policy.
"""

import abc
import signal
import threading
import time

import jax
import jax.numpy as jnp
from absl import logging
from jax.experimental import multihost_utils

from bert_jax import console, progress
from bert_jax.train import guard
from bert_jax.train.run import Run
from bert_jax.train.start_order import Start
from bert_jax.workdir import checkpoints, lease


def train_dropout_key(seed: int) -> jax.Array:
  """The key every step's dropout derives from (with the step number): a function of the seed only."""
  return jax.random.fold_in(jax.random.key(seed), 1)


class StopRequest:
  """SIGTERM (how TPU VMs and schedulers announce preemption) asks the loop to checkpoint and stop cleanly.

  One process: a Python signal handler. Several: JAX's preemption service (started by
  `jax.distributed.initialize`) catches SIGTERM on any host and agrees with the others on one step to stop at;
  a Python handler here would take the signal from it.
  """

  def __init__(self):
    self.requested = False
    self._previous = None
    self._multihost = jax.process_count() > 1
    if not self._multihost and threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._handle)

  def _handle(self, signum, frame):
    logging.warning("Received signal %d: saving a checkpoint after this step, then stopping.", signum)
    self.requested = True

  def at(self, step: int) -> bool:
    if self._multihost and multihost_utils.reached_preemption_sync_point(step):
      logging.warning("Preemption notice: every host stops at step %d with a checkpoint.", step)
      return True
    return self.requested

  def close(self) -> None:
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


class Job(abc.ABC):
  """What a job supplies to the loop. `title` heads the console's header; `finished` its summary."""

  title: str
  finished: str
  config: object
  run: Run
  last_step: int

  @abc.abstractmethod
  def header_rows(self) -> list[tuple[str, str]]:
    """The header's rows before `start` (the job, its model, devices, data, batch, workdir)."""

  @abc.abstractmethod
  def start(self, manager) -> Start:
    """The state this launch starts from (see `train/start_order.py`), and the job's own bookkeeping from it."""

  @abc.abstractmethod
  def open_data(self, start: Start) -> None:
    """Opens the batch stream at `start`'s data position."""

  @abc.abstractmethod
  def batch(self, step: int) -> dict:
    """Step `step`'s global batch (a dict of global arrays)."""

  def compiles_at(self, step: int) -> bool:
    """Whether step `step` runs a train step this launch has not compiled yet (a batch-size warmup's new size), so
    that the loop leaves its compilation out of the speed; asked once for every step."""
    return False

  @abc.abstractmethod
  def dropout_key(self) -> jax.Array:
    """The dropout key of every step (the step derives its own from it): one per member for a sweep."""

  @abc.abstractmethod
  def ticker(self, first_step: int) -> progress.Progress:
    """The ticker of the console's progress lines, from the end of `first_step` (the compiling one)."""

  @abc.abstractmethod
  def summarize(self, step: int, sums: dict, steps: int) -> dict:
    """The metric sums of `steps` steps -> the means a progress line and TensorBoard show."""

  def evaluates_at(self, step: int) -> bool:
    """Whether the loop evaluates after `step`."""
    return False

  def evaluate(self, state, step: int, writer: progress.MetricWriter) -> None:
    """Evaluates `state` at `step`: logs, writes `writer`, keeps what the checkpoint and the summary need."""
    raise NotImplementedError(f"{type(self).__name__} evaluates at step {step} but has no evaluate().")

  @abc.abstractmethod
  def saves_at(self, step: int) -> bool:
    """Whether the loop checkpoints after `step` (it also does at the last step and where it stops)."""

  @abc.abstractmethod
  def checkpoint(self, step: int) -> tuple[dict, dict]:
    """Before a save of `step`: writes what lives beside the checkpoint, and returns its (data position,
    history)."""

  def saved(self, step: int) -> None:
    """After the (asynchronous) save of `step` has started: tidies what the job keeps beside the checkpoints."""
    return None

  tokenizer_item: dict | None = None

  # The run's hold on the workdir, set by the loop before `start`: a job calls `held.check()` before it writes into
  # the workdir (files of its own, checkpoint managers of its own made with it).
  held: lease.Holder | None = None

  @property
  def recorded_config(self):
    """The config a checkpoint records: the job's, unless the job planned values of its own (fine-tuning)."""
    return self.config

  def close(self, failed: bool) -> None:
    """Ends what the job opened (its own checkpoint managers) once the loop's saves have finished; `failed`: an
    error is on its way out, the one to show (a failed save of the job's then only logs)."""
    return None

  @abc.abstractmethod
  def finish(self, state, step: int, stopped: bool) -> list[tuple[str, str]]:
    """After the loop (its saves finished): what the job writes at the end, and its rows of the summary."""


def train(job: Job, workdir: str, started_at: float):
  """Runs `job` to its last step (or to a preemption's stop step) under the workdir's lease; returns the final
  state. Everything a job checks without compiling or writing must be checked before this is called."""
  config = job.config
  with lease.claim(workdir, config.lease_timeout_seconds, [checkpoints.checkpoint_dir(workdir)]) as held:
    return _train(job, workdir, held, started_at)


def _train(job: Job, workdir: str, held: lease.Holder, started_at: float):
  config = job.config
  job.held = held
  manager = checkpoints.make_manager(workdir, config.keep_checkpoints, held=held)
  stop = StopRequest()
  train_writer = progress.MetricWriter(workdir, "train")
  eval_writer = progress.MetricWriter(workdir, "eval")
  profile = progress.ProfileWindow(workdir, config.profile.start_step, config.profile.num_steps)
  saving = None  # The step of the newest save started.
  stopped = False
  try:
    start = job.start(manager)
    state = start.state
    logging.info("%s", console.block(job.title, [*job.header_rows(), ("start", start.started)]))
    first_step = state.host_step()
    job.open_data(start)
    dropout_key = job.dropout_key()
    last_step = job.last_step
    if first_step >= last_step:
      logging.info("Step %d is already at the last step, %d: nothing to train.", first_step, last_step)
    ticker, sums, steps_in_sums = None, None, 0
    monitor = guard.Monitor(config)
    monitor.newest_checkpoint = first_step if start.resumed else None
    loop_started = time.perf_counter()
    for step in range(first_step + 1, last_step + 1):
      profile.before(step)
      batch, compiling = job.batch(step), job.compiles_at(step)
      called = time.perf_counter()
      state, metrics = job.run.train_step(state, batch, dropout_key, *job.run.frozen_args)
      compiled = time.perf_counter() - called if compiling else 0.0  # The call returns once it has compiled.
      profiled = profile.after(step, metrics)
      if ticker:
        if compiling:
          logging.info("Step %d compiled a new train step in %.1f s (left out of the speed).", step, compiled)
        ticker.exclude(profiled + compiled)
      monitor.observe(step, metrics)
      checkpoints.check_saves(manager, saving, held)
      sums = metrics if sums is None else jax.tree.map(jnp.add, sums, metrics)
      steps_in_sums += 1
      if ticker is None:  # Time from the end of the first (compiling) step.
        jax.block_until_ready(metrics)
        ticker = job.ticker(step)
        ticker.first_step_seconds = time.perf_counter() - loop_started
      stopped = stop.at(step)
      if step % config.log_every_steps == 0 or step == last_step or stopped:
        summary = job.summarize(step, jax.device_get(sums), steps_in_sums)
        summary.update(ticker.report(step, summary))
        held.check()  # Every write into the workdir, TensorBoard's too, is one of a run that holds it.
        train_writer.write(step, summary)
        sums, steps_in_sums = None, 0
      evaluating = job.evaluates_at(step)
      saving_now = job.saves_at(step) or step == last_step or stopped
      if evaluating or saving_now:
        monitor.flush()  # A step the guard stops at is never evaluated as a result, nor saved.
        held.check()  # Nor one of a run whose workdir another run has taken over.
      if evaluating:
        eval_start = time.perf_counter()
        job.evaluate(state, step, eval_writer)
        ticker.exclude(time.perf_counter() - eval_start)
      if saving_now:
        save_start = time.perf_counter()
        checkpoints.check_saves(manager, saving, held, wait=True)
        held.check()  # Again: an evaluation, or the wait, may have been long. The commit checks once more.
        position, history = job.checkpoint(step)
        checkpoints.save(manager, step, state, position, job.recorded_config, job.tokenizer_item, history)  # Async.
        saving = monitor.newest_checkpoint = step
        held.check()  # What the job tidies after a save (old pipeline states) is in the workdir too.
        job.saved(step)
        ticker.exclude(time.perf_counter() - save_start)
      if stopped:
        logging.warning("Stopped at step %d with a checkpoint; run the same command to resume.", step)
        break
    else:
      monitor.flush()
  except BaseException:
    checkpoints.finish(manager, saving, held, raise_errors=False)  # The error that stopped the run is the one to show.
    job.close(failed=True)
    raise
  else:
    checkpoints.finish(manager, saving, held)
    job.close(failed=False)
  finally:
    if held.holds():  # A run that lost the workdir leaves its logs as they are (on GCS, closing copies them there).
      profile.close()
      train_writer.close()
      eval_writer.close()
    stop.close()
  step = state.host_step()
  rows = [("steps", progress.launch_row(ticker, first_step, step, time.perf_counter() - started_at))]
  rows += job.finish(state, step, stopped)
  if saving is not None:
    rows.append(("checkpoint", f"{checkpoints.checkpoint_dir(workdir)}/{saving}"))
  rows.append(("tensorboard", f"tensorboard --logdir {workdir}/tensorboard"))
  title = job.finished if step >= job.last_step else "Stopped"
  logging.info("%s", console.block(f"{title} at step {step}", rows))
  return state
