"""Pretraining: the objective (masked-LM cross-entropy plus next-sentence cross-entropy, as a step's `Loss`) and
the job that runs it on the loop (`pretrain`).

Reads the pretraining batch (`data/pretraining_batch.py`); the step machinery (`train/step.py`) takes it like any
task's loss. This loss is the "bert" objective (`OBJECTIVE`; `train/objectives.py` names the others). `make_run` is
the run of the configured objective (its model, loss and frozen inputs, the configured optimizer) that the loop,
the dry run and the benchmarks compile. `PretrainingJob` supplies what the loop (`train/loop.py`) needs:
the corpus's batches, evaluation on the held-out stream, the pipeline's state beside every checkpoint.
"""

import copy
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging

from bert_jax import config_checks, flops, progress, sharding
from bert_jax.data import instances, masking
from bert_jax.data.corpus import Corpus
from bert_jax.data.pretraining_batch import check_pretraining_batch, max_instances
from bert_jax.handoff import pretrained
from bert_jax.model.bert_config import BertConfig
from bert_jax.model.encoder import BertForPretraining
from bert_jax.train import loop, objectives, run, start_order
from bert_jax.train.optim import Steps, make_optimizer, make_schedule
from bert_jax.train.step import Loss
from bert_jax.workdir import checkpoints


def next_sentence_weights(batch: dict) -> jax.Array:
  """1 for every instance's next-sentence label: one per row ([batch]), or per packed instance ([batch, instances],
  0 where a row has fewer instances)."""
  if "next_sentence_weights" in batch:
    return batch["next_sentence_weights"]
  return jnp.ones(batch["next_sentence_labels"].shape, jnp.float32)


def loss_normalizers(batch: dict) -> tuple[jax.Array, jax.Array]:
  """What the MLM and NSP loss sums are divided by: real predictions (+1e-5, guarding a batch with none, as in
  the original BERT) and instances (sequences). From the whole batch, so microbatches add up to the full-batch
  loss."""
  mlm = jnp.sum(batch["masked_lm_weights"]) + 1e-5
  return mlm, jnp.maximum(jnp.sum(next_sentence_weights(batch)), 1.0)


def model_inputs(batch: dict) -> dict:
  """The model's keyword inputs from a pretraining batch, packed (`position_ids`, `cls_positions`) or not."""
  names = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "position_ids", "cls_positions")
  return {name: batch[name] for name in names if name in batch}


def masked_lm_sums(mlm_logits: jax.Array, batch: dict) -> dict:
  """The masked LM's cross-entropy (`mlm_loss`) and correct predictions (`mlm_accuracy`) summed over the real
  predictions (`masked_lm_weights`), and their count (`mlm_count`); `mlm_logits` [batch, max_predictions, vocab]."""
  weights = batch["masked_lm_weights"]  # [batch, max_predictions]
  xent = optax.softmax_cross_entropy_with_integer_labels(mlm_logits, batch["masked_lm_ids"])
  return dict(
    mlm_loss=jnp.sum(xent * weights),
    mlm_accuracy=jnp.sum((jnp.argmax(mlm_logits, -1) == batch["masked_lm_ids"]) * weights),
    mlm_count=jnp.sum(weights),
  )


def row_sums(batch: dict) -> dict:
  """Per row: the fraction of real (non-padding) tokens and the instances it holds (more than one when packed)."""
  return dict(
    row_fill=jnp.sum(batch["input_mask"] > 0) / batch["input_mask"].shape[1],
    row_instances=jnp.sum(next_sentence_weights(batch)),
    row_count=jnp.asarray(batch["input_mask"].shape[0], jnp.float32),
  )


def pretraining_loss(
  params,
  batch: dict,
  model: BertForPretraining,
  dropout_key=None,
  normalizers: tuple | None = None,
  *,
  sentence_task: str | None = "nsp",
):
  """Masked-LM cross-entropy (weighted by `masked_lm_weights`) + the sentence task's cross-entropy on the `nsp` head
  (`sentence_task`: "nsp", "sop", or None for none).

  The MLM term is the mean over real predictions, the sentence term the mean over instances; `normalizers` (from
  `loss_normalizers` of the whole batch) replace this batch's own counts when it is one microbatch of many.
  Returns (loss, metrics); metrics are sums with their counts, the sentence task's named for it (`sop_accuracy`)
  and only with one.
  """
  deterministic = dropout_key is None
  rngs = {} if deterministic else {"dropout": dropout_key}
  outputs = model.apply({"params": params}, **model_inputs(batch), deterministic=deterministic, rngs=rngs)
  mlm_logits, nsp_logits = outputs["mlm_logits"], outputs["nsp_logits"]  # float32

  mlm_normalizer, sentence_normalizer = loss_normalizers(batch) if normalizers is None else normalizers
  metrics = dict(masked_lm_sums(mlm_logits, batch), **row_sums(batch))
  loss = metrics["mlm_loss"] / mlm_normalizer
  instances = next_sentence_weights(batch)
  if sentence_task:
    labels = batch["next_sentence_labels"]  # [batch], or [batch, instances] for packed rows
    xent = optax.softmax_cross_entropy_with_integer_labels(nsp_logits, labels) * instances
    loss += jnp.sum(xent) / sentence_normalizer
    metrics[f"{sentence_task}_loss"] = jnp.sum(xent)
    metrics[f"{sentence_task}_accuracy"] = jnp.sum((jnp.argmax(nsp_logits, -1) == labels) * instances)
    metrics[f"{sentence_task}_count"] = jnp.sum(instances)
  return loss, metrics


def make_loss(sentence_task: str | None = "nsp") -> Loss:
  """The pretraining `Loss`: masked LM, plus `sentence_task` ("nsp", "sop"; None: masked LM alone)."""
  value = functools.partial(pretraining_loss, sentence_task=sentence_task)
  return Loss(value=value, normalizers=loss_normalizers)


def make_run(config, devices=None, model_cfg: BertConfig | None = None) -> run.Run:
  """The pretraining run of `config` (checked by `config_checks.check_pretraining`) for its objective; `model_cfg`
  replaces the config's model (e.g. another layer layout). Frozen inputs (a teacher) are described, not read:
  `Run.read_frozen` reads them."""
  objective = objectives.of(config.objective)
  model_cfg = model_cfg or config_checks.model_config(config)
  frozen = objective.frozen(config, model_cfg)
  loss = objective.loss(config, frozen)
  return run.make_run(
    config, objective.model(config, model_cfg), loss, make_optimizer(config), devices=devices, frozen=frozen
  )


def shown_metrics(sentence_task: str | None, evaluation: bool = False) -> tuple[str, ...]:
  """The metrics a progress or eval line shows: masked LM's, and the sentence task's when there is one."""
  shown = ("mlm_loss", "mlm_accuracy")
  if sentence_task:
    shown += (f"{sentence_task}_accuracy", f"{sentence_task}_loss") if evaluation else (f"{sentence_task}_accuracy",)
  return shown


def _flops(config, model_cfg: BertConfig, frozen, training: bool = True) -> float:
  """BERT's model FLOPs per train step (forward and backward), or per eval step (forward) when not `training`."""
  seq, preds = config.data.max_seq_length, config.data.max_predictions_per_seq
  return flops.train_flops_per_step(model_cfg, config.batch_size, seq, preds) / (1 if training else 3)


OBJECTIVE = objectives.Objective(
  name="bert",
  model=lambda config, model_cfg: BertForPretraining(model_cfg),
  loss=lambda config, frozen: make_loss(instances.sentence_task(config.data)),
  flops=_flops,
  shown=lambda config, evaluation: shown_metrics(instances.sentence_task(config.data), evaluation),
)


class PretrainingJob(loop.Job):
  """Pretraining as the loop's job: batches from the prepared corpus (or the synthetic source), evaluation on the
  held-out stream every `eval_every_steps`, checkpoints every `checkpoint_every_steps` with the pipeline's reader
  states and the run's history (examples and token positions seen over every phase, the latest metrics)."""

  title = "Pretraining"
  finished = "Training finished"

  def __init__(
    self,
    config,
    workdir: str,
    the_run: run.Run,
    model_cfg: BertConfig,
    init_source,
    init_params,
    tokenizer=None,
    init_origin: str = "",
  ):
    self.config, self.workdir, self.run, self.model_cfg = config, workdir, the_run, model_cfg
    self.objective = objectives.of(config.objective)
    self.init_source, self.init_params, self.init_origin = init_source, init_params, init_origin
    self.last_step = config.num_train_steps
    self.tokens_per_step = config.batch_size * config.data.max_seq_length
    self.data = Corpus(config, workdir, model_cfg, tokenizer)
    self.tokenizer_item = checkpoints.tokenizer_item(self.data.tokenizer) if self.data.tokenizer else None
    self.schedule = make_schedule(config)

  def header_rows(self) -> list[tuple[str, str]]:
    config = self.config
    packed = ""
    if config.data.pack_instances:
      packed = f", up to {config.data.max_instances_per_row} instances packed per row"
    rows = [
      ("model", progress.model_row(self.model_cfg, self.run.num_params)),
      ("devices", progress.devices_row(self.run.mesh)),
      ("data", self.data.describe()),
      (
        "batch",
        f"{config.batch_size} sequences x {config.data.max_seq_length} tokens, {config.data.max_predictions_per_seq} "
        f"masked positions each{packed}; {config.num_train_steps} steps at learning rate {config.learning_rate:g} "
        f"({config.warmup_steps} warmup)",
      ),
    ]
    if config.data.source == "pretraining":  # The synthetic source masks 15% of tokens whatever the keys say.
      line, warning = masking.describe(masking.Masking.of(config.data), config.data.max_seq_length)
      if warning:
        logging.warning("%s", warning)
      rows.append(("masking", line))
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

  def start(self, manager) -> start_order.Start:
    begun = start_order.pretraining_start(
      self.config,
      self.run,
      self.model_cfg,
      manager,
      self.data.identity,
      self.init_source,
      self.init_params,
      self.init_origin,
    )
    self.first_step = int(begun.state.step)
    self.history = start_order.history(manager if begun.resumed else None, self.first_step, self.init_source)
    if self.run.frozen is not None:  # What taught this model: a resume must read the same (start_order.check_start).
      self.history[self.run.frozen.name] = self.run.frozen.identity
    self.examples_before = self.history["examples_seen"]
    self.positions_before = self.history["token_positions_seen"]
    end_step = Steps.of(self.config).end_step
    if end_step > self.last_step > self.first_step:
      logging.info("Stopping at step %d of a schedule that ends at %d.", self.last_step, end_step)
    return begun

  def open_data(self, begun: start_order.Start) -> None:
    state_dir = checkpoints.data_state_dir(self.workdir, self.first_step) if begun.resumed else None
    self.source = self.data.source(begun.data_position["examples"], state_dir=state_dir)

  def _device_batch(self, source) -> dict:
    config = self.config
    host_batch = next(source)
    check_pretraining_batch(
      host_batch,
      batch_size=config.batch_size // jax.process_count(),
      max_seq_length=config.data.max_seq_length,
      max_predictions_per_seq=config.data.max_predictions_per_seq,
      vocab_size=self.model_cfg.vocab_size,
      type_vocab_size=self.model_cfg.type_vocab_size,
      max_instances=max_instances(config.data),
    )
    return sharding.global_batch(host_batch, self.run.mesh)

  def batch(self, step: int) -> dict:
    return self._device_batch(self.source)

  def dropout_key(self) -> jax.Array:
    return loop.train_dropout_key(self.config.seed)

  def ticker(self, first_step: int) -> progress.Progress:
    config = self.config
    peak = flops.peak_flops_per_device(jax.devices()[0].device_kind, config.peak_tflops_per_device)
    return progress.Progress(
      self.last_step,
      self.tokens_per_step,
      first_step,
      self.objective.flops(config, self.model_cfg, self.run.frozen),
      peak * jax.device_count() if peak else None,
      shown=self.objective.shown(config, False),
      packed=config.data.pack_instances,
      baseline=self.data.unigram,
    )

  def summarize(self, step: int, sums: dict, steps: int) -> dict:
    summary = progress.summarize(sums, steps)
    self.history["train"] = dict(summary, step=step)
    return dict(summary, learning_rate=float(self.schedule(step - 1)))

  def evaluates_at(self, step: int) -> bool:
    config = self.config
    return bool(config.eval_steps) and (step % config.eval_every_steps == 0 or step == self.last_step)

  def evaluate(self, state, step: int, writer: progress.MetricWriter) -> None:
    """The same `eval_steps` batches every time (a fixed stream), summed then averaged."""
    source = self.data.source(0, evaluation=True)
    totals = None
    for _ in range(self.config.eval_steps):
      metrics = self.run.eval_step(state.params, self._device_batch(source), *self.run.frozen_args)
      totals = metrics if totals is None else jax.tree.map(np.add, totals, metrics)
    summary = progress.summarize(jax.device_get(totals), self.config.eval_steps)
    shown = self.objective.shown(self.config, True)
    logging.info("eval at step %d%s", step, progress.format_metrics(summary, shown, self.data.unigram))
    writer.write(step, summary)
    self.history["eval"] = dict(summary, step=step)

  def saves_at(self, step: int) -> bool:
    return step % self.config.checkpoint_every_steps == 0

  def checkpoint(self, step: int) -> tuple[dict, dict]:
    config = self.config
    checkpoints.save_data_state(self.source, checkpoints.data_state_dir(self.workdir, step), step)
    position = dict(
      examples=self.source.position,
      tokenizer=self.data.identity,
      step=step,
      readers=config.data.num_readers,
      hosts=jax.process_count(),
    )
    done = step - self.first_step
    self.history["examples_seen"] = self.examples_before + done * config.batch_size
    self.history["token_positions_seen"] = self.positions_before + done * self.tokens_per_step
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
      metrics = progress.format_metrics(evaluation, self.objective.shown(self.config, True), self.data.unigram)
      rows.append(("eval", f"step {evaluation['step']}{metrics}"))
    return rows


def pretrain(config, workdir: str, checked: config_checks.Checked | None = None):
  """Pretrains to `config.num_train_steps`, resuming from the workdir's newest checkpoint if there is one; returns
  the final state. On SIGTERM it saves a checkpoint at the current step and returns; the same command resumes.
  Everything that can be checked without compiling (config, mesh, batch divisibility, the starting checkpoint) is
  checked before anything is compiled or written; `checked` is `config_checks.check`'s result when main ran it."""
  started_at = time.perf_counter()
  model_cfg = (checked or config_checks.check(config, "pretrain")).model
  the_run = make_run(config, model_cfg=model_cfg)
  config, init_source, tokenizer = start_order.check_start(config, workdir, model_cfg, the_run.frozen)
  the_run = the_run.read_frozen()  # A teacher: read, and so checked, before any write.
  init_params, init_origin = None, ""
  if init_source is not None and init_source.format != "workdir":  # Read, and so checked, before any write.
    _, init_params = pretrained.read_weights(
      init_source, scan_layers=model_cfg.scan_layers, mesh=the_run.mesh, rules=the_run.rules
    )
  elif init_source is None and not checkpoints.has_checkpoint(workdir):  # A new run: the objective may say from what.
    init_params, init_origin = objectives.of(config.objective).initial_params(config, the_run) or (None, "")
  job = PretrainingJob(config, workdir, the_run, model_cfg, init_source, init_params, tokenizer, init_origin)
  return loop.train(job, workdir, started_at)
