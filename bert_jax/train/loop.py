"""The pretraining loop: steps, logging, evaluation, checkpoints, preemption.

What the loop steps comes from `pretraining.make_run` (the run setup every tool shares), where it starts from
`train/start_order.py` (the start order), what it reads from `data/corpus.py`. Everything that can be checked without
compiling (config, mesh, batch divisibility, the starting checkpoint) is checked first, before anything is compiled
or written.
"""

import copy
import signal
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from bert_jax import console, flops, progress, sharding
from bert_jax.data.corpus import Corpus
from bert_jax.data.pretraining_batch import check_pretraining_batch, max_instances
from bert_jax.handoff import pretrained
from bert_jax.model.bert_config import BertConfig
from bert_jax.train import guard, pretraining, start_order
from bert_jax.train.optim import make_schedule, schedule_end_step
from bert_jax.workdir import checkpoints, lease


def _device_batch(source, config, model: BertConfig, mesh) -> dict:
  host_batch = next(source)
  check_pretraining_batch(
    host_batch,
    batch_size=config.batch_size // jax.process_count(),
    max_seq_length=config.data.max_seq_length,
    max_predictions_per_seq=config.data.max_predictions_per_seq,
    vocab_size=model.vocab_size,
    type_vocab_size=model.type_vocab_size,
    max_instances=max_instances(config.data),
  )
  return sharding.global_batch(host_batch, mesh)


def evaluate(eval_step, params, config, model: BertConfig, mesh, data: Corpus) -> dict:
  """The same `eval_steps` batches every time (a fixed stream), summed then averaged."""
  source = data.source(0, evaluation=True)
  totals = None
  for _ in range(config.eval_steps):
    metrics = eval_step(params, _device_batch(source, config, model, mesh))
    totals = metrics if totals is None else jax.tree.map(np.add, totals, metrics)
  return progress.summarize(jax.device_get(totals), config.eval_steps)


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


def train_and_evaluate(config, workdir: str):
  """Pretrains to `config.num_train_steps`, resuming from the workdir's newest checkpoint if there is one.

  On SIGTERM it saves a checkpoint at the current step and returns; the same command resumes.
  """
  started_at = time.perf_counter()
  model_cfg = pretraining.check_config(config)
  run = pretraining.make_run(config)
  config, init_source = start_order.check_start(config, workdir, model_cfg)
  init_params = None
  if init_source is not None and init_source.format != "workdir":  # Read, and so checked, before any write.
    init_params = pretrained.load(
      config.init_from, scan_layers=model_cfg.scan_layers, mesh=run.mesh, rules=run.rules
    ).params
  with lease.claim(workdir, config.lease_timeout_seconds, [checkpoints.checkpoint_dir(workdir)]) as held:
    return _train(config, workdir, run, model_cfg, init_source, init_params, held, started_at)


EVAL_SHOWN = ("mlm_loss", "mlm_accuracy", "nsp_accuracy", "nsp_loss")


def _header(config, workdir: str, run, model: BertConfig, data: Corpus, started: str) -> str:
  """The run's header (process 0's console): model, devices and mesh, data, batch and schedule, workdir, where it
  starts, and the mark the MLM metrics must clear."""
  packed = f", up to {config.data.max_instances_per_row} instances packed per row" if config.data.pack_instances else ""
  rows = [
    ("model", progress.model_row(model, run.num_params)),
    ("devices", progress.devices_row(run.mesh)),
    ("data", data.describe()),
    (
      "batch",
      f"{config.batch_size} sequences x {config.data.max_seq_length} tokens, {config.data.max_predictions_per_seq} "
      f"masked positions each{packed}; {config.num_train_steps} steps at learning rate {config.learning_rate:g} "
      f"({config.warmup_steps} warmup)",
    ),
    ("workdir", workdir),
    ("start", started),
  ]
  if data.unigram:
    rows.append(
      (
        "baseline",
        f"unigram MLM loss {data.unigram['mlm_loss']:.4f}, accuracy {data.unigram['mlm_accuracy']:.4f} (the "
        "training documents' token frequencies at the held-out masked positions: what the model must beat)",
      )
    )
  return console.block("Pretraining", rows)


def _summary(
  title: str, workdir: str, ticker, first_step: int, step: int, history: dict, baseline, saved, wall: float
) -> str:
  """The run's end (process 0's console): steps, time and tokens of this launch, the last train and eval metrics,
  where the checkpoint and TensorBoard logs are."""
  rows = [("steps", progress.launch_row(ticker, first_step, step, wall))]
  train_shown = ("loss", "mlm_loss", "mlm_accuracy", "nsp_accuracy")
  # This launch's metrics only: a history carried over from a previous phase (init_from) is another corpus's.
  history = {
    name: value for name, value in history.items() if isinstance(value, dict) and value.get("step", -1) > first_step
  }
  if "train" in history:
    rows.append(("train", f"step {history['train']['step']}" + progress.format_metrics(history["train"], train_shown)))
  if "eval" in history:
    eval_summary = history["eval"]
    metrics = progress.format_metrics(eval_summary, EVAL_SHOWN, baseline)
    rows.append(("eval", f"step {eval_summary['step']}{metrics}"))
  if saved is not None:
    rows.append(("checkpoint", f"{checkpoints.checkpoint_dir(workdir)}/{saved}"))
  rows.append(("tensorboard", f"tensorboard --logdir {workdir}/tensorboard"))
  return console.block(title, rows)


def _train(
  config, workdir: str, run, model_cfg: BertConfig, init_source, init_params, held: lease.Holder, started_at: float
):
  """The loop of `train_and_evaluate`, once the run holds the workdir's lease (`held`)."""
  data = Corpus(config, workdir, model_cfg)
  manager = checkpoints.make_manager(workdir, config.keep_checkpoints)
  stop = StopRequest()
  train_writer = progress.MetricWriter(workdir, "train")
  eval_writer = progress.MetricWriter(workdir, "eval")
  profile = progress.ProfileWindow(workdir, config.profile.start_step, config.profile.num_steps)
  saving = None  # The step of the newest save started.
  try:
    seq, preds = config.data.max_seq_length, config.data.max_predictions_per_seq
    state, data_position, resumed, started = start_order.start_state(
      config, run, model_cfg, manager, data.identity, init_source, init_params
    )
    logging.info("%s", _header(config, workdir, run, model_cfg, data, started))
    first_step = int(state.step)
    state_dir = checkpoints.data_state_dir(workdir, first_step) if resumed else None
    source = data.source(data_position["examples"], state_dir=state_dir)
    dropout_key = train_dropout_key(config.seed)
    schedule = make_schedule(config)
    tokens_per_step = config.batch_size * seq
    peak = flops.peak_flops_per_device(jax.devices()[0].device_kind, config.peak_tflops_per_device)
    flops_per_step = flops.train_flops_per_step(model_cfg, config.batch_size, seq, preds)
    last_step = config.num_train_steps
    if first_step >= last_step:
      logging.info("Step %d is already at num_train_steps=%d: nothing to train.", first_step, last_step)
    elif schedule_end_step(config) > last_step:
      logging.info("Stopping at step %d of a schedule that ends at %d.", last_step, schedule_end_step(config))
    history = start_order.history(manager if resumed else None, first_step, init_source)
    tokenizer_item = checkpoints.tokenizer_item(data.tokenizer) if data.tokenizer else None
    ticker, sums, steps_in_sums = None, None, 0
    monitor = guard.Monitor(config)
    for step in range(int(state.step) + 1, last_step + 1):
      profile.before(step)
      state, metrics = run.train_step(state, _device_batch(source, config, model_cfg, run.mesh), dropout_key)
      profiled = profile.after(step, metrics)
      if ticker:
        ticker.exclude(profiled)
      monitor.observe(step, metrics)
      checkpoints.check_saves(manager, saving)
      sums = metrics if sums is None else jax.tree.map(jnp.add, sums, metrics)
      steps_in_sums += 1
      history["examples_seen"] += config.batch_size
      history["token_positions_seen"] += tokens_per_step
      if ticker is None:  # Time from the end of the first (compiling) step.
        jax.block_until_ready(metrics)
        ticker = progress.Progress(
          last_step,
          tokens_per_step,
          step,
          flops_per_step,
          peak * jax.device_count() if peak else None,
          packed=config.data.pack_instances,
          baseline=data.unigram,
        )
      stopping = stop.at(step)
      if step % config.log_every_steps == 0 or step == last_step or stopping:
        summary = progress.summarize(jax.device_get(sums), steps_in_sums)
        history["train"] = dict(summary, step=step)
        summary.update(ticker.report(step, summary), learning_rate=float(schedule(step - 1)))
        train_writer.write(step, summary)
        sums, steps_in_sums = None, 0
      if config.eval_steps and (step % config.eval_every_steps == 0 or step == last_step):
        eval_start = time.perf_counter()
        eval_summary = evaluate(run.eval_step, state.params, config, model_cfg, run.mesh, data)
        ticker.exclude(time.perf_counter() - eval_start)
        metrics = progress.format_metrics(eval_summary, EVAL_SHOWN, data.unigram)
        logging.info("eval at step %d%s", step, metrics)
        eval_writer.write(step, eval_summary)
        history["eval"] = dict(eval_summary, step=step)
      if step % config.checkpoint_every_steps == 0 or step == last_step or stopping:
        save_start = time.perf_counter()
        monitor.flush()  # A step the guard stops at is never saved.
        held.check()  # Nor one of a run whose workdir another run has taken over.
        checkpoints.check_saves(manager, saving, wait=True)
        checkpoints.save_data_state(source, checkpoints.data_state_dir(workdir, step), step)
        position = dict(
          examples=source.position,
          tokenizer=data.identity,
          step=step,
          readers=config.data.num_readers,
          hosts=jax.process_count(),
        )
        checkpoints.save(manager, step, state, position, config, tokenizer_item, copy.deepcopy(history))  # Async.
        saving = step
        checkpoints.remove_stale_data_states(workdir, step)
        ticker.exclude(time.perf_counter() - save_start)
      if stopping:
        logging.warning("Stopped at step %d with a checkpoint; run the same command to resume.", step)
        break
    else:
      monitor.flush()
  except BaseException:
    checkpoints.finish(manager, saving, raise_errors=False)  # The error that stopped the run is the one to show.
    raise
  else:
    checkpoints.finish(manager, saving)
    step = int(state.step)
    title = "Training finished" if step >= last_step else "Stopped"
    wall = time.perf_counter() - started_at
    summary = _summary(
      f"{title} at step {step}", workdir, ticker, first_step, step, history, data.unigram, saving, wall
    )
    logging.info("%s", summary)
  finally:
    profile.close()
    train_writer.close()
    eval_writer.close()
    stop.close()
  return state
