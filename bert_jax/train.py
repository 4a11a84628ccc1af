"""The pretraining loop: checks, state creation or resumption, steps, logging, evaluation, checkpoints.

Start order: the newest complete checkpoint in the workdir; else `config.init_from`'s newest (a previous phase:
state only, the data stream starts afresh); else a fresh initialisation from `config.seed`.
Everything that can be checked without compiling (config, mesh, batch divisibility) is checked first, before
anything is compiled or written.
"""

import copy
import dataclasses
import functools
import signal
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from bert_jax import checkpoint, flops, param_layout, pretrained, progress, sharding, train_step
from bert_jax.data import prepare, sources
from bert_jax.model import BertForPretraining
from bert_jax.model_config import SIZE_FIELDS, BertConfig
from bert_jax.optim import make_optimizer, make_schedule, schedule_end_step
from bert_jax.pretraining_batch import check_pretraining_batch
from bert_jax.tokenizer import load_tokenizer


def model_config(config) -> BertConfig:
  return BertConfig(**config.model.to_dict())


def check_config(config) -> BertConfig:
  """Raises ValueError naming the bad value; returns the model config."""
  model = model_config(config)
  seq, preds = config.data.max_seq_length, config.data.max_predictions_per_seq
  if seq > model.max_position_embeddings:
    raise ValueError(
      f"data.max_seq_length={seq} exceeds model.max_position_embeddings="
      f"{model.max_position_embeddings}: positions beyond it have no embedding."
    )
  if seq < 5:
    raise ValueError(f"data.max_seq_length={seq} cannot fit a pair: [CLS] A [SEP] B [SEP] needs at least 5.")
  if not 0 < preds <= seq:
    raise ValueError(f"data.max_predictions_per_seq={preds} must be in [1, data.max_seq_length={seq}].")
  for name in (
    "batch_size",
    "num_train_steps",
    "log_every_steps",
    "checkpoint_every_steps",
    "keep_checkpoints",
    "eval_every_steps",
  ):
    if config[name] < 1:
      raise ValueError(f"{name}={config[name]} must be at least 1.")
  if config.num_microbatches < 1 or config.batch_size % config.num_microbatches:
    raise ValueError(
      f"num_microbatches={config.num_microbatches} must be at least 1 and divide batch_size={config.batch_size}."
    )
  if config.schedule_end_step and config.schedule_end_step < config.num_train_steps:
    raise ValueError(
      f"schedule_end_step={config.schedule_end_step} is before num_train_steps={config.num_train_steps}: the "
      "learning rate would reach zero before training ends (0: end the schedule at num_train_steps)."
    )
  flops.peak_flops_per_device("", config.peak_tflops_per_device)  # Raises on a negative peak.
  if config.eval_steps < 0:
    raise ValueError(f"eval_steps={config.eval_steps} must be non-negative (0 disables evaluation).")
  if config.data.source not in ("pretraining", "synthetic"):
    raise ValueError(f"data.source={config.data.source!r}; expected 'pretraining' or 'synthetic'.")
  return model


class Data:
  """What the loop reads: the tokenizer and prepared corpus (pretraining source), and sources made from them."""

  def __init__(self, config, workdir: str, model: BertConfig):
    self._config, self._model = config, model
    self.tokenizer, self.identity, self._train, self._eval = None, None, {}, {}
    if config.data.source == "synthetic":
      return
    tokenizer_path, prepared_dir = prepare.paths_for_run(config, workdir)
    if config.data.embedded_corpus:
      prepare.prepare_for_run(config, workdir)
    self.tokenizer = load_tokenizer(config.tokenizer.kind, tokenizer_path, config.tokenizer.lower_case)
    if self.tokenizer.vocab_size > model.vocab_size:
      raise ValueError(f"The tokenizer has {self.tokenizer.vocab_size} ids but model.vocab_size={model.vocab_size}.")
    self.identity = self.tokenizer.identity()
    self._train = dict(prepared_dir=prepared_dir, manifest=prepare.read_manifest(prepared_dir, self.tokenizer))
    eval_dir = config.data.eval_prepared_dir
    self._eval = (
      self._train
      if not eval_dir
      else dict(prepared_dir=eval_dir, manifest=prepare.read_manifest(eval_dir, self.tokenizer))
    )

  def source(
    self,
    start_example: int,
    evaluation: bool = False,
    state_dir: str | None = None,
    host: tuple[int, int] | None = None,
  ):
    """This host's batches from `start_example` on; `host` = (index, count) stands in for another host's."""
    process_index, process_count = host or (jax.process_index(), jax.process_count())
    return sources.make_source(
      self._config,
      seed=self._config.seed + int(evaluation),
      start_example=start_example,
      process_index=process_index,
      process_count=process_count,
      vocab_size=self._model.vocab_size,
      tokenizer=self.tokenizer,
      state_dir=state_dir,
      **(self._eval if evaluation else self._train),
    )


def _device_batch(source, config, model: BertConfig, mesh) -> dict:
  host_batch = next(source)
  check_pretraining_batch(
    host_batch,
    batch_size=config.batch_size // jax.process_count(),
    max_seq_length=config.data.max_seq_length,
    max_predictions_per_seq=config.data.max_predictions_per_seq,
    vocab_size=model.vocab_size,
    type_vocab_size=model.type_vocab_size,
  )
  return sharding.global_batch(host_batch, mesh)


def evaluate(eval_step, params, config, model: BertConfig, mesh, data: Data) -> dict:
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


def _check_compatible(saved: dict, config, where: str) -> None:
  """Raises if the checkpoint's config (a dict) has other parameter or optimizer-state shapes than `config`."""
  different = [
    f"model.{name}: {saved['model'][name]} vs {config.model[name]}"
    for name in SIZE_FIELDS
    if saved["model"][name] != config.model[name]
  ]
  if saved.get("optimizer", "adamw") != config.optimizer:
    different.append(f"optimizer: {saved.get('optimizer', 'adamw')!r} vs {config.optimizer!r}")
  if different:
    raise ValueError(f"The checkpoint in {where} does not fit this config (checkpoint vs config): {different}.")


def _check_start_checkpoint(config, workdir: str, model_cfg: BertConfig) -> pretrained.Source | None:
  """Before anything is written: the checkpoint this run will start from (the workdir's newest, else
  `init_from`'s) exists where the config names it and fits the config. A workdir with checkpoints never reads
  `init_from` again, so phase 2 resumes even once phase 1's checkpoints are gone. Returns `init_from`'s source
  when the run will start from it."""
  if checkpoint.has_checkpoint(workdir):
    _check_compatible(checkpoint.restore_config(workdir), config, "the workdir")
    return None
  if not config.init_from:
    return None
  where = f"init_from={config.init_from}"
  try:
    source = pretrained.describe(config.init_from)
  except (FileNotFoundError, ValueError) as error:
    raise type(error)(f"{where}: {error}") from None
  if source.format == "workdir":  # A previous phase: its optimizer state and step too.
    _check_compatible(source.info, config, where)
  else:  # Weights only: a fresh optimizer.
    pretrained.check_fits(source, model_cfg, where)
  if config.data.source != "synthetic":
    if not config.tokenizer.path:
      raise ValueError(
        f"{where} was trained with the tokenizer {source.tokenizer_file}; set tokenizer.path to it (the run would "
        "train a new one)."
      )
    tokenizer = load_tokenizer(config.tokenizer.kind, config.tokenizer.path, config.tokenizer.lower_case)
    pretrained.check_tokenizer(source, tokenizer.identity(), where)
  return source


def _restore(manager, step: int | None, config, model_cfg: BertConfig, tx, mesh, abstract, shardings):
  """(state, data position) from `manager`'s `step` in `shardings`, converted to this model's layer layout
  (scanned or unrolled) if it was saved in the other one; None if `step` is None (no checkpoint)."""
  if step is None:
    return None
  saved = checkpoint.read_config(manager, step)  # Checked by _check_start_checkpoint before anything ran.
  saved_scanned = saved["model"].get("scan_layers", False)
  if saved_scanned == model_cfg.scan_layers:
    return checkpoint.restore(manager, step, abstract, shardings)
  logging.info(
    "Converting step %d's %s layer layout to this model's.", step, "scanned" if saved_scanned else "unrolled"
  )
  saved_model = BertForPretraining(dataclasses.replace(model_cfg, scan_layers=saved_scanned))
  seq, preds = config.data.max_seq_length, config.data.max_predictions_per_seq
  saved_abstract, saved_shardings = train_step.state_shardings(
    saved_model, tx, mesh, config.logical_axis_rules, seq, preds
  )
  state, data_position = checkpoint.restore(manager, step, saved_abstract, saved_shardings)
  convert = functools.partial(param_layout.convert, scanned=model_cfg.scan_layers)
  return jax.jit(convert, out_shardings=shardings)(state), data_position


def _init_or_restore(
  config, model_cfg, tx, mesh, manager, identity, init_source: pretrained.Source | None, init_params: dict | None
):
  """(state, shardings, data position, resumed): the workdir's newest checkpoint; else `config.init_from`'s
  (a workdir: its state; any other source: its weights and a fresh optimizer; the data stream starts afresh);
  else a fresh initialisation from the seed."""
  model = BertForPretraining(model_cfg)
  seq, preds = config.data.max_seq_length, config.data.max_predictions_per_seq
  abstract, shardings = train_step.state_shardings(model, tx, mesh, config.logical_axis_rules, seq, preds)
  num_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(abstract.params))
  logging.info(
    "%s parameters on mesh %s; global batch %d x %d tokens; %d steps.",
    f"{num_params:,}",
    dict(mesh.shape),
    config.batch_size,
    seq,
    config.num_train_steps,
  )
  restore = functools.partial(
    _restore, config=config, model_cfg=model_cfg, tx=tx, mesh=mesh, abstract=abstract, shardings=shardings
  )
  restored, resumed = restore(manager, manager.latest_step()), True
  if restored is None and init_source is not None and init_source.format == "workdir":
    with checkpoint.reader(epath.Path(init_source.path).parent) as source_manager:
      restored, resumed = restore(source_manager, init_source.step), False
  elif restored is None and init_source is not None:
    state = train_step.create_train_state(model, tx, shardings, config.seed, seq, preds, init_params)
    fresh = train_step.overwrite_params(abstract.params, init_params)[1]
    logging.info(
      "Initialised from the %s weights in %s (heads initialised from seed %d: %s); a fresh optimizer at step 0.",
      init_source.format,
      config.init_from,
      config.seed,
      fresh or "none",
    )
    return state, shardings, {"examples": 0}, False
  if restored is None:
    logging.info("No checkpoint in the workdir: initialising from seed %d.", config.seed)
    state = train_step.create_train_state(model, tx, shardings, config.seed, seq, preds)
    return state, shardings, {"examples": 0}, False
  state, data_position = restored
  if not resumed:
    logging.info("Initialised from %s at step %d; the data stream starts afresh.", config.init_from, int(state.step))
    return state, shardings, {"examples": 0}, False
  if data_position.get("tokenizer") != identity:
    raise ValueError(
      f"The checkpoint was trained with tokenizer {data_position.get('tokenizer')}; the config's is {identity}. "
      "Use the same tokenizer, or a new workdir."
    )
  logging.info("Resumed from step %d (%d examples consumed).", int(state.step), data_position["examples"])
  return state, shardings, data_position, True


def _history(manager, step: int, init_source: pretrained.Source | None) -> dict:
  """What the model has been trained on before this run's first step (examples and sequence positions, padding
  included, over every phase), and its latest metrics: the resumed checkpoint's record, else a previous phase's."""
  history = {}
  if manager is not None:
    history = checkpoint.read_history(manager, step)
  elif init_source is not None and init_source.format == "workdir":
    with checkpoint.reader(epath.Path(init_source.path).parent) as source_manager:
      history = checkpoint.read_history(source_manager, init_source.step)
  elif init_source is not None and init_source.format == "bundle":
    history = init_source.info.get("history", {})
  return dict({"examples_seen": 0, "token_positions_seen": 0}, **history)


def train_and_evaluate(config, workdir: str) -> train_step.TrainState:
  """Pretrains to `config.num_train_steps`, resuming from the workdir's newest checkpoint if there is one.

  On SIGTERM it saves a checkpoint at the current step and returns; the same command resumes.
  """
  model_cfg = check_config(config)
  mesh = sharding.make_mesh(config.mesh.to_dict())
  sharding.check_batch_size(config.batch_size, mesh, config.num_microbatches)
  model = BertForPretraining(model_cfg)
  tx = make_optimizer(config)

  init_source = _check_start_checkpoint(config, workdir, model_cfg)
  init_params = None
  if init_source is not None and init_source.format != "workdir":  # Read, and so checked, before any write.
    rules = config.logical_axis_rules
    init_params = pretrained.load(config.init_from, scan_layers=model_cfg.scan_layers, mesh=mesh, rules=rules).params
  data = Data(config, workdir, model_cfg)
  manager = checkpoint.make_manager(workdir, config.keep_checkpoints)
  stop = StopRequest()
  train_writer = progress.MetricWriter(workdir, "train")
  eval_writer = progress.MetricWriter(workdir, "eval")
  try:
    state, shardings, data_position, resumed = _init_or_restore(
      config, model_cfg, tx, mesh, manager, data.identity, init_source, init_params
    )
    first_step = int(state.step)
    state_dir = checkpoint.data_state_dir(workdir, first_step, jax.process_index()) if resumed else None
    source = data.source(data_position["examples"], state_dir=state_dir)
    rules = config.logical_axis_rules
    step_fn = train_step.make_train_step(
      model, tx, mesh, shardings, rules, config.data.next_sentence_prediction, config.num_microbatches
    )
    eval_fn = train_step.make_eval_step(model, mesh, shardings.params, rules)
    dropout_key = train_dropout_key(config.seed)
    schedule = make_schedule(config)
    seq, preds = config.data.max_seq_length, config.data.max_predictions_per_seq
    tokens_per_step = config.batch_size * seq
    peak = flops.peak_flops_per_device(jax.devices()[0].device_kind, config.peak_tflops_per_device)
    flops_per_step = flops.train_flops_per_step(model_cfg, config.batch_size, seq, preds)
    last_step = config.num_train_steps
    if first_step >= last_step:
      logging.info("Step %d is already at num_train_steps=%d: nothing to train.", first_step, last_step)
    elif schedule_end_step(config) > last_step:
      logging.info("Stopping at step %d of a schedule that ends at %d.", last_step, schedule_end_step(config))

    history = _history(manager if resumed else None, first_step, init_source)
    tokenizer_item = checkpoint.tokenizer_item(data.tokenizer) if data.tokenizer else None
    ticker, sums, steps_in_sums = None, None, 0
    for step in range(int(state.step) + 1, last_step + 1):
      state, metrics = step_fn(state, _device_batch(source, config, model_cfg, mesh), dropout_key)
      sums = metrics if sums is None else jax.tree.map(jnp.add, sums, metrics)
      steps_in_sums += 1
      history["examples_seen"] += config.batch_size
      history["token_positions_seen"] += tokens_per_step
      if ticker is None:  # Time from the end of the first (compiling) step.
        jax.block_until_ready(metrics)
        ticker = progress.Progress(
          last_step, tokens_per_step, step, flops_per_step, peak * jax.device_count() if peak else None
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
        eval_summary = evaluate(eval_fn, state.params, config, model_cfg, mesh, data)
        ticker.exclude(time.perf_counter() - eval_start)
        logging.info("eval at step %d: %s", step, {k: round(v, 4) for k, v in eval_summary.items()})
        eval_writer.write(step, eval_summary)
        history["eval"] = dict(eval_summary, step=step)
      if step % config.checkpoint_every_steps == 0 or step == last_step or stopping:
        save_start = time.perf_counter()
        source.save_state(checkpoint.data_state_dir(workdir, step, jax.process_index()))
        position = {"examples": source.position, "tokenizer": data.identity}
        checkpoint.save(manager, step, state, position, config, tokenizer_item, copy.deepcopy(history))  # Async.
        checkpoint.remove_stale_data_states(workdir, jax.process_index(), step)
        ticker.exclude(time.perf_counter() - save_start)
      if stopping:
        logging.warning("Stopped at step %d with a checkpoint; run the same command to resume.", step)
        break
    else:
      logging.info("Training finished at step %d.", last_step)
  finally:
    manager.wait_until_finished()  # Never exit with a checkpoint half-written.
    manager.close()
    train_writer.close()
    eval_writer.close()
    stop.close()
  return state
