"""The pretraining job: the configured objective (`train/objectives/`) on the loop (`train/loop.py`).

`job_spec(config)` is the job described once (its run, batch, FLOPs and header lines), which `pretrain`, the loop's
`PretrainingJob` and the dry run all use; `train/pretraining_start.py` is where a launch starts. `PretrainingJob`
supplies what the loop needs: the corpus's batches (of each step's size, `data/batch_warmup.py`), evaluation on the
held-out stream, the pipeline's state beside every checkpoint.
"""

import copy
import dataclasses
import time

import jax
import numpy as np
from absl import logging

from bert_jax import progress, sharding
from bert_jax.data import masking, masking_schedule
from bert_jax.data.batch_warmup import BatchSchedule
from bert_jax.data.corpus import Corpus, evaluation_data
from bert_jax.data.pretraining_batch import check_pretraining_batch, max_instances, pretraining_shapes
from bert_jax.model.bert_config import BertConfig, model_config
from bert_jax.train import loop, pretraining_start, run, start_order
from bert_jax.train.job_spec import JobSpec
from bert_jax.train.objectives import registry
from bert_jax.train.optim import Steps, make_optimizer, make_schedule
from bert_jax.train.retrieval_probe import RetrievalProbe
from bert_jax.train.source_tokens import HISTORY_KEY as SOURCE_TOKENS
from bert_jax.train.source_tokens import SourceTokens
from bert_jax.workdir import checkpoints


def make_run(config, devices=None, model_cfg: BertConfig | None = None) -> run.Run:
  """The pretraining run of `config` (checked by the front door, `jobs.py`) for its objective; `model_cfg` replaces
  the config's model (e.g. another layer layout). Frozen inputs (a teacher) are described, not read:
  `Run.read_frozen` reads them."""
  objective = registry.of(config.objective)
  model_cfg = model_cfg or model_config(config)
  frozen = objective.frozen(config, model_cfg)
  loss = objective.loss(config, frozen)
  made = run.make_run(
    config,
    objective.model(config, model_cfg),
    loss,
    make_optimizer(config),
    devices=devices,
    frozen=frozen,
    eval_microbatches=config.num_microbatches,  # Held-out batches are batch_size rows: the train step's slices.
  )
  _check_warmup_sizes(config, made.mesh)
  return made


def _check_warmup_sizes(config, mesh) -> None:
  """Every size of a batch-size warmup (multiples of its first) splits over the mesh's data-parallel devices x
  microbatches and over the hosts, as `run.make_run` checks batch_size does (nothing is compiled yet)."""
  if not config.batch_warmup_tokens:
    return
  start, parallel, microbatches = config.batch_warmup_start, sharding.data_parallel_size(mesh), config.num_microbatches
  if start % (parallel * microbatches) or start % jax.process_count():
    raise ValueError(
      f"batch_warmup_start={start} is not divisible by the data-parallel size {parallel} (mesh data x fsdp) x "
      f"{microbatches} microbatch(es), and by the {jax.process_count()} host(s): every size of the batch-size warmup "
      "(multiples of it) must split as batch_size does."
    )


def job_spec(config, devices=None, model_cfg: BertConfig | None = None) -> JobSpec:
  """Pretraining of `config` (checked), described once: its objective's run on `devices` (default: all), the
  global batch, its FLOPs. `model_cfg` replaces the config's model (the dry run's probes)."""
  model_cfg = model_cfg or model_config(config)
  objective = registry.of(config.objective)
  objective_run = make_run(config, devices, model_cfg)
  data = config.data
  seq, preds = data.max_seq_length, data.max_predictions_per_seq
  batch = pretraining_shapes(config.batch_size, seq, preds, max_instances(data))
  packed = f", up to {data.max_instances_per_row} instances packed per row" if data.pack_instances else ""
  return JobSpec(
    name="pretraining",
    model_cfg=model_cfg,
    run=objective_run,
    train_batch=batch,
    eval_batch=batch,
    eval_step=objective_run.eval_step,
    eval_reads_frozen=True,
    tokens_per_step=config.batch_size * seq,
    train_flops=objective.flops(config, model_cfg, objective_run.frozen),
    eval_flops=objective.flops(config, model_cfg, objective_run.frozen, training=False),
    batch_row=f"{config.batch_size} sequences x {seq} tokens, {preds} masked positions each{packed}",
  )


class PretrainingJob(loop.Job):
  """Pretraining as the loop's job: batches from the prepared corpus (or the synthetic source), evaluation on the
  held-out stream every `eval_every_steps`, checkpoints every `checkpoint_every_steps` with the pipeline's reader
  states and the run's history (examples and token positions seen over every phase, the latest metrics)."""

  title = "Pretraining"
  finished = "Training finished"

  def __init__(self, config, workdir: str, spec: JobSpec, origin: pretraining_start.Origin):
    """`spec` (`job_spec`) with its frozen inputs read; `origin` (`pretraining_start.find_origin`)."""
    self.config, self.workdir, self.spec, self.origin = config, workdir, spec, origin
    self.run, self.model_cfg = spec.run, spec.model_cfg
    self.objective = registry.of(config.objective)
    self.last_step = config.num_train_steps
    self.data = Corpus(config, workdir, self.model_cfg, origin.tokenizer, num_readers=origin.num_readers)
    # Its set read and checked here, before the loop writes anything.
    self.probe = RetrievalProbe.of(config, self.run, self.model_cfg, self.data.tokenizer)
    self.tokenizer_item = checkpoints.tokenizer_item(self.data.tokenizer) if self.data.tokenizer else None
    self.schedule = make_schedule(config)
    self.batches = BatchSchedule.of(config)
    self._recorded = origin.record(config, self.model_cfg)
    self.read = SourceTokens(())  # A mixture's tokens read of each source, from `start` on.

  @property
  def recorded_config(self):
    return self._recorded

  def header_rows(self) -> list[tuple[str, str]]:
    config = self.config
    rows = [
      *self.spec.header_rows(),
      ("data", self.data.describe()),
      *(("mixture", line) for line in self.data.mixture_lines()),
      (
        "batch",
        f"{self.spec.batch_row}; {config.num_train_steps} steps at learning rate {config.learning_rate:g} "
        f"({config.warmup_steps} warmup)",
      ),
    ]
    if self.batches.warms_up:
      rows.append(("batch warmup", self.batches.describe()))
    if config.ema_decay:
      rows.append(
        (
          "moving average",
          f"of the parameters, decay {config.ema_decay:g}, kept in every checkpoint (--mode=merge with "
          "merge.ema writes it out)",
        )
      )
    if config.data.source == "pretraining":  # The synthetic source masks 15% of tokens whatever the keys say.
      line, warning = masking.describe(masking.Masking.of(config.data), config.data.max_seq_length)
      if warning:
        logging.warning("%s", warning)
      rows.append(("masking", line))
      if config.data.masking_phases:
        rows.append(("masking rate", masking_schedule.describe(config)))
      if config.data.eval_masked_lm_prob:
        held_out = masking.Masking.of(evaluation_data(config.data))
        line, warning = masking.describe(held_out, config.data.max_seq_length, "data.eval_masked_lm_prob")
        if warning:
          logging.warning("%s", warning)
        rows.append(("eval masking", line))
    if self.probe:
      rows.append(("retrieval probe", self.probe.describe()))
    rows.append(("workdir", self.workdir))
    if self.data.unigram:
      unigram = self.data.unigram
      rows.append(
        (
          "baseline",
          f"unigram MLM loss {unigram['mlm_loss']:.4f}, accuracy {unigram['mlm_accuracy']:.4f} (the training "
          "documents' token frequencies at the held-out masked positions: what the model must beat)",
        )
      )
    return rows

  def start(self, manager) -> loop.Start:
    begun = pretraining_start.start(self.config, self.run, self.model_cfg, manager, self.data.identity, self.origin)
    self.first_step = int(begun.state.step)
    self.history = pretraining_start.history(manager if begun.resumed else None, self.first_step, self.origin.source)
    if self.run.frozen is not None:  # What taught this model, where it was read from.
      self.history[self.run.frozen.name] = self.run.frozen.identity
    # What this run read, by content (a resume must read the same: start_order.check_inputs); a new run records its
    # own inputs only, not a previous phase's.
    recorded = self.history.get(start_order.INPUTS, {}) if begun.resumed else None
    self.history[start_order.INPUTS] = start_order.record_inputs(self.origin.inputs, recorded)
    # What a mixture run has read of each source: a resume's carries on; a new run (or phase) counts its own.
    self.read = SourceTokens(tuple(self.data.mixture_tokens), self.history.get(SOURCE_TOKENS) if begun.resumed else {})
    self.history.pop(SOURCE_TOKENS, None)
    self.examples_before = self.history["examples_seen"]
    self.positions_before = self.history["token_positions_seen"]
    self.compiled_sizes = set()  # Of the train step in this launch.
    end_step = Steps.of(self.config).end_step
    if end_step > self.last_step > self.first_step:
      logging.info("Stopping at step %d of a schedule that ends at %d.", self.last_step, end_step)
    return begun

  def open_data(self, begun: loop.Start) -> None:
    state_dir = checkpoints.data_state_dir(self.workdir, self.first_step) if begun.resumed else None
    self.source = self.data.source(begun.data_position["examples"], state_dir=state_dir)

  def _device_batch(self, source, rows: int) -> dict:
    """The next `rows` examples of `source` as global arrays, checked; a mixture's rows counted by source (training's
    only: evaluation's are another stream)."""
    config = self.config
    host_batch = source.take(rows)
    if source is self.source:
      self.read.count(host_batch)  # Takes `source` out of the batch.
    else:
      host_batch.pop("source", None)
    check_pretraining_batch(
      host_batch,
      batch_size=rows // jax.process_count(),
      max_seq_length=config.data.max_seq_length,
      max_predictions_per_seq=config.data.max_predictions_per_seq,
      vocab_size=self.model_cfg.vocab_size,
      type_vocab_size=self.model_cfg.type_vocab_size,
      max_instances=max_instances(config.data),
    )
    return sharding.global_batch(host_batch, self.run.mesh)

  def batch(self, step: int) -> dict:
    return self._device_batch(self.source, self.batches.size(step))

  def compiles_at(self, step: int) -> bool:
    """A batch-size warmup's step of a size this launch has not run yet."""
    size = self.batches.size(step)
    new = size not in self.compiled_sizes
    self.compiled_sizes.add(size)
    return new

  def dropout_key(self) -> jax.Array:
    return loop.train_dropout_key(self.config.seed)

  def ticker(self, first_step: int) -> progress.Progress:
    config = self.config
    return self.spec.ticker(
      config,
      self.last_step,
      first_step,
      shown=self.objective.shown(config, False),
      packed=config.data.pack_instances,
      baseline=self.data.unigram,
      tokens_through=self.batches.tokens_through,
    )

  def summarize(self, step: int, sums: dict, steps: int) -> dict:
    summary = progress.summarize(sums, steps)
    self.history["train"] = dict(summary, step=step)
    shown = dict(summary, learning_rate=float(self.schedule(step - 1)))
    if self.read.names:
      self.history[SOURCE_TOKENS] = self.read.sync()
      shown.update(self.read.shares())
    if self.batches.warms_up:  # The batch the step read, and the examples so far (progress lines, TensorBoard).
      shown.update(batch_size=self.batches.size(step), examples_seen=self._seen(step)[0])
    return shown

  def evaluates_at(self, step: int) -> bool:
    config = self.config
    return bool(config.eval_steps) and (step % config.eval_every_steps == 0 or step == self.last_step)

  def evaluate(self, state, step: int, writer: progress.MetricWriter) -> None:
    """The same `eval_steps` batches every time (a fixed stream), summed then averaged; and the retrieval probe's
    metrics when the run has one."""
    source = self.data.source(0, evaluation=True)
    totals = None
    for _ in range(self.config.eval_steps):
      metrics = self.run.eval_step(
        state.params, self._device_batch(source, self.config.batch_size), *self.run.frozen_args
      )
      totals = metrics if totals is None else jax.tree.map(np.add, totals, metrics)
    summary = progress.summarize(jax.device_get(totals), self.config.eval_steps)
    if self.probe:
      summary.update(self.probe.measure(state.params))
    logging.info("eval at step %d%s", step, self._eval_metrics(summary))
    writer.write(step, summary)
    self.history["eval"] = dict(summary, step=step)

  def _eval_metrics(self, summary: dict) -> str:
    """An evaluation's metrics on the console: the objective's, then the retrieval probe's nDCG@10."""
    shown = self.objective.shown(self.config, True)
    return progress.format_metrics(summary, shown, self.data.unigram) + RetrievalProbe.shown(summary)

  def saves_at(self, step: int) -> bool:
    return step % self.config.checkpoint_every_steps == 0

  def _seen(self, step: int) -> tuple[int, int]:
    """Examples and token positions trained on by the end of `step`, over every phase."""
    rows = self.batches.rows_through(step) - self.batches.rows_through(self.first_step)
    return self.examples_before + rows, self.positions_before + rows * self.config.data.max_seq_length

  def checkpoint(self, step: int) -> tuple[dict, dict]:
    checkpoints.save_data_state(self.source, checkpoints.data_state_dir(self.workdir, step), step)
    position = dict(
      examples=self.source.position,
      tokenizer=self.data.identity,
      step=step,
      readers=self.origin.num_readers,
      hosts=jax.process_count(),
    )
    self.history["examples_seen"], self.history["token_positions_seen"] = self._seen(step)
    if self.read.names:
      self.history[SOURCE_TOKENS] = self.read.sync()
    return position, copy.deepcopy(self.history)

  def saved(self, step: int) -> None:
    checkpoints.remove_stale_data_states(self.workdir, step)

  def finish(self, state, step: int, stopped: bool) -> list[tuple[str, str]]:
    """The last train and eval metrics of this launch (a history carried over from a previous phase, init_from's,
    is another corpus's)."""
    rows = []
    history = self.history
    train, evaluation = history.get("train", {}), history.get("eval", {})
    if train.get("step", -1) > self.first_step:
      shown = ("loss", *self.objective.shown(self.config, False))
      rows.append(("train", f"step {train['step']}" + progress.format_metrics(train, shown)))
    if evaluation.get("step", -1) > self.first_step:
      rows.append(("eval", f"step {evaluation['step']}{self._eval_metrics(evaluation)}"))
    return rows


def pretrain(config, workdir: str, model_cfg: BertConfig):
  """Pretrains `model_cfg` (what the front door's check made of `config.model`) to `config.num_train_steps`,
  resuming from the workdir's newest checkpoint if there is one; returns the final state. On SIGTERM it saves a
  checkpoint at the current step and returns; the same command resumes. Everything that can be checked without
  compiling (mesh, batch divisibility, the starting checkpoint) is checked before anything is compiled or written;
  the config was checked by the front door (`jobs.run`, which calls this)."""
  started_at = time.perf_counter()
  spec = job_spec(config, model_cfg=model_cfg)
  origin, loaded = pretraining_start.find_origin(config, workdir, model_cfg, spec.run)  # Its teacher read.
  job = PretrainingJob(config, workdir, dataclasses.replace(spec, run=loaded), origin)
  return loop.train(job, workdir, started_at)
