"""The fine-tuning job: a task head on a pretrained encoder, trained as one run or as a sweep of (learning rate,
seed) members in one jitted program, evaluated every epoch with the task's official metrics.

Start order: the workdir's newest checkpoint (a resume: the stream position is the step); else `init_from`'s
weights (any source `pretrained.load` accepts; its model sizes and tokenizer), with a fresh head per seed; else,
without `init_from`, a random initialisation of `config.model` with `config.tokenizer` (a baseline).

With `distill.teacher` (a model fine-tuned on the same task), every member also learns the teacher's soft labels
(`losses.distilled`): the teacher is the run's frozen input (`run.Frozen`), read onto the mesh once and shared by
every member; its identity is recorded in the checkpoints, and a resume with another one is refused.

Member i = (learning_rates[i // seeds], seed + i % seeds) is a restart of everything, as the paper's random
restarts are: its own head initialisation, dropout stream and training order (all from its seed), and its own
learning rate (held in its optimizer state). A member's step s reads rows [(s-1) B, s B) of the concatenation of
one random permutation of the training rows per epoch (a function of the member's seed and the epoch), so a
resume, or a run on another host count, reads the same rows; members of one seed read the same rows at every
learning rate. The members still train in one jitted program: each step feeds every member its own rows (a batch
[members, B, ...]). Member (learning_rate, config.seed) of a sweep is the run trained alone with that learning rate.

The workdir receives `checkpoints/` (the newest, with every member), `best/` (the best member at its best
evaluation by the task's main metric on the first eval split: one model, never rotated away by `checkpoints/`),
`metrics.json` (every member's evaluations, and per learning rate mean +- std and best), `predictions/` (the
best member's predictions of every eval and test split in the task's official format) and TensorBoard logs.
"""

import dataclasses
import functools
import json
import math
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from bert_jax import config_checks, paths, progress, sharding
from bert_jax.config_checks import Member
from bert_jax.data.tokenizer import load_tokenizer
from bert_jax.finetune import glue, losses, tasks
from bert_jax.finetune.contract import Encoded, Task
from bert_jax.handoff import pretrained
from bert_jax.model.bert_config import BertConfig
from bert_jax.model.heads import task_model
from bert_jax.train import distillation, loop, run, start_order
from bert_jax.train import step as step_lib
from bert_jax.train.optim import Steps, make_sweep_optimizer, set_learning_rates
from bert_jax.workdir import checkpoints

METRICS_FILE = "metrics.json"
# What makes a fine-tuning run the run it is: a workdir's checkpoint resumes only a config that agrees on these.
RUN_KEYS = (
  "seed",
  "batch_size",
  "learning_rate",
  "optimizer",
  "lr_schedule",
  "finetune.task",
  "finetune.data_dir",
  "finetune.tfds_name",
  "finetune.max_seq_length",
  "finetune.num_epochs",
  "finetune.warmup_fraction",
  "finetune.doc_stride",
  "finetune.max_query_length",
  "sweep.learning_rates",
  "sweep.seeds",
  "distill.teacher",
  "distill.temperature",
  "distill.alpha_hard",
)
# What a checkpoint written before a run key existed ran with (lr_schedule: Google's, the only one there was; no
# teacher).
RUN_KEYS_ABSENT = {"lr_schedule": "bert", "distill.teacher": "", "distill.temperature": 2.0, "distill.alpha_hard": 0.5}


@functools.lru_cache(maxsize=64)
def _permutation(seed: int, epoch: int, num_rows: int) -> np.ndarray:
  """The order of epoch `epoch` in the stream of `seed`, drawn once (every step of the epoch, every member reads it)."""
  permutation = np.random.default_rng([seed, epoch]).permutation(num_rows)
  permutation.flags.writeable = False
  return permutation


def training_rows(step: int, num_rows: int, batch_size: int, seed: int) -> np.ndarray:
  """[batch_size] row indices that step `step` (from 1) trains on in the stream of `seed` (a member's): one
  permutation of the rows per epoch, from (seed, epoch)."""
  positions = np.arange((step - 1) * batch_size, step * batch_size)
  epochs, offsets = np.divmod(positions, num_rows)
  rows = np.empty(batch_size, np.int64)
  for epoch in np.unique(epochs):
    permutation = _permutation(seed, int(epoch), num_rows)
    rows[epochs == epoch] = permutation[offsets[epochs == epoch]]
  return rows


def _host_batch(features: dict, rows: np.ndarray, weight: np.ndarray) -> dict:
  """This host's share of the global batch `rows` ([batch], or [members, batch] with `weight` of the same shape):
  hosts take consecutive blocks of the last axis, as global_batch expects."""
  per_host = rows.shape[-1] // jax.process_count()
  mine = slice(jax.process_index() * per_host, (jax.process_index() + 1) * per_host)
  batch = {name: value[rows[..., mine]] for name, value in features.items()}
  batch["weight"] = weight[..., mine].astype(np.float32)
  return batch


def model_config(config, source: pretrained.Pretrained | pretrained.Source | None) -> BertConfig:
  """The encoder's architecture (the source's, else config.model) with this run's dtype, remat, layout, dropout."""
  ours = BertConfig(**config.model.to_dict())
  if source is None:
    return ours
  keep = ("dtype", "remat", "scan_layers", "attention", "hidden_dropout_prob", "attention_dropout_prob")
  return dataclasses.replace(source.config, **{name: getattr(ours, name) for name in keep})


@dataclasses.dataclass(frozen=True)
class Plan:
  """What this run computes from its config and what it reads, kept beside the config rather than written into
  it: the step counts (from epochs, rows and batch size; warmup from its fraction), the encoder (init_from's
  architecture, this run's dtype and layout) and the sweep's members."""

  num_train_steps: int
  steps: Steps
  model: BertConfig
  members: tuple[Member, ...]

  @classmethod
  def of(cls, config, num_train_steps: int, model: BertConfig, members) -> "Plan":
    warmup = int(round(config.finetune.warmup_fraction * num_train_steps))
    return cls(num_train_steps, Steps(warmup, num_train_steps), model, tuple(members))

  def record(self, config) -> ml_collections.ConfigDict:
    """What a checkpoint records as its config: `config` with the plan's step counts and encoder, so that a
    reader of the checkpoint (export, `pretrained.load`, a resume) sees the architecture and schedule that ran."""
    recorded = ml_collections.ConfigDict(config.to_dict())
    recorded.update(num_train_steps=self.num_train_steps, warmup_steps=self.steps.warmup_steps, schedule_end_step=0)
    recorded.model.update(dataclasses.asdict(self.model))
    return recorded


def make_run(config, plan: Plan, task: Task, devices=None, tokenizer_identity: dict | None = None) -> run.Run:
  """The sweep's run: `task`'s model on the plan's encoder, one member per (learning rate, seed), the optimizer on
  the plan's step counts; with `distill.teacher`, the teacher described (checked against `tokenizer_identity` when
  given) as the run's frozen input and its soft labels in the loss."""
  model = task_model(plan.model, task.head, task.num_labels)
  tx = make_sweep_optimizer(config, plan.steps)
  frozen, loss = None, losses.make_loss(task.head)
  if config.distill.teacher:
    frozen = distillation.task_teacher(config, plan.model, task.task_head, tokenizer_identity)
    loss = losses.distilled(task.head, frozen.model, config.distill.temperature, config.distill.alpha_hard)
  return run.make_run(config, model, loss, tx, members=len(plan.members), devices=devices, frozen=frozen)


@dataclasses.dataclass(frozen=True)
class _Splits:
  train: Encoded
  evaluation: dict  # split name -> Encoded
  test: dict


def _read_splits(task: Task, tokenizer, max_seq_length: int) -> _Splits:
  def encode(split: str) -> Encoded:
    start = time.perf_counter()
    encoded = task.encode(task.read(split), tokenizer, max_seq_length)
    logging.info("%s %s: %d rows (%.1f s).", task.name, split, encoded.num_rows, time.perf_counter() - start)
    return encoded

  test = {}
  for split in task.test_splits:  # Optional: many copies of a dataset have no (unlabelled) test file.
    try:
      test[split] = encode(split)
    except FileNotFoundError as error:
      logging.warning("No %s predictions: %s", split, error)
  return _Splits(
    train=encode(task.train_split),
    evaluation={split: encode(split) for split in task.eval_splits},
    test=test,
  )


def make_predict(the_run: run.Run):
  """Jitted (params with a member axis, batch) -> logits [members, batch, ...], replicated on every device."""

  def predict(params, batch):
    return jax.vmap(lambda p: losses.logits(p, batch, the_run.model), in_axes=0)(params)

  return jax.jit(
    step_lib.with_activation_rules(predict, the_run.mesh, the_run.rules),
    in_shardings=(the_run.shardings.params, sharding.batch_sharding(the_run.mesh)),
    out_shardings=sharding.replicated(the_run.mesh),
  )


def row_batches(encoded: Encoded, batch_size: int, mesh, order: np.ndarray | None = None):
  """Every row of `encoded`, in `order` (a permutation of the rows; default: row order), as global batches of
  `batch_size` with `weight` (the last batch padded with weight-0 rows): yields (batch, how many rows are real)."""
  order = np.arange(encoded.num_rows) if order is None else np.asarray(order)
  for start in range(0, encoded.num_rows, batch_size):
    positions = np.arange(start, start + batch_size)
    weight = (positions < encoded.num_rows).astype(np.float32)
    rows = order[np.minimum(positions, encoded.num_rows - 1)]
    yield sharding.global_batch(_host_batch(encoded.features, rows, weight), mesh), int(weight.sum())


def predict(predict_fn, params, encoded: Encoded, batch_size: int, mesh) -> np.ndarray:
  """Logits of every row of `encoded`, [members, rows, ...]."""
  outputs = []
  for batch, real in row_batches(encoded, batch_size, mesh):
    logits = predict_fn(params, batch)
    outputs.append(np.asarray(logits.addressable_data(0))[:, :real])
  return np.concatenate(outputs, axis=1)


def _evaluate(task: Task, predict_fn, params, splits: dict, config, mesh, members) -> dict:
  """{split: [metrics of member i]} of every eval split."""
  results = {}
  for split, encoded in splits.items():
    logits = predict(predict_fn, params, encoded, config.finetune.eval_batch_size, mesh)
    results[split] = [task.metrics(encoded, logits[i]) for i in range(len(members))]
  return results


def sweep_table(members: list[Member], finals: list[float], main_metric: str) -> dict:
  """Per learning rate: mean, std (population) and best of the members' final main metric."""
  table = {}
  for rate in dict.fromkeys(member.learning_rate for member in members):
    values = np.array([value for member, value in zip(members, finals, strict=True) if member.learning_rate == rate])
    table[f"{rate:g}"] = dict(
      metric=main_metric, mean=float(values.mean()), std=float(values.std()), best=float(values.max()), n=len(values)
    )
  return table


def _log_table(table: dict) -> None:
  lines = [f"{'learning rate':>14s}  {'mean':>8s}  {'std':>8s}  {'best':>8s}  {'seeds':>5s}"]
  for rate, row in table.items():
    lines.append(f"{rate:>14s}  {row['mean']:8.4f}  {row['std']:8.4f}  {row['best']:8.4f}  {row['n']:5d}")
  logging.info("Sweep (%s, final evaluation):\n%s", next(iter(table.values()))["metric"], "\n".join(lines))


def _prediction_path(workdir: str, task: Task, split: str) -> str:
  if task.name in glue.TASKS and split in task.test_splits:
    return f"{workdir}/predictions/{glue.submission_file_name(task.name, split)}"
  suffix = {"span": "json", "token": "txt", "choice": "csv"}.get(task.head, "tsv")
  return f"{workdir}/predictions/{split}.{suffix}"


@jax.jit
def _member_state(state, index):
  """Sweep member `index`'s state (every leaf's leading axis), as one program for the whole tree rather than an
  indexing program per leaf shape."""
  return jax.tree.map(lambda x: x[index], state)


class FinetuningJob(loop.Job):
  """Fine-tuning as the loop's job: rows of the shared stream, the task's official metrics at every epoch's end
  (and the best member's checkpoint in `best/`), a checkpoint at every epoch's end; at the end, the sweep's
  table, the prediction files and `metrics.json`."""

  title = "Fine-tuning"
  finished = "Fine-tuning finished"

  def __init__(self, config, plan: Plan, workdir: str, task: Task, source, tokenizer, splits: _Splits):
    self.config, self.plan, self.workdir, self.task = config, plan, workdir, task
    self.members, self.source, self.tokenizer = plan.members, source, tokenizer
    self._recorded = plan.record(config)
    self.splits = splits
    self.num_rows = self.splits.train.num_rows
    self.last_step = plan.num_train_steps
    epochs = math.ceil(config.finetune.num_epochs)
    ends = {min(self.last_step, math.ceil(e * self.num_rows / config.batch_size)) for e in range(1, 1 + epochs)}
    self.epoch_ends = sorted(ends | {self.last_step})
    self.tokens_per_step = config.batch_size * config.finetune.max_seq_length
    self.model_cfg = plan.model
    self.run = make_run(config, plan, task, tokenizer_identity=tokenizer.identity()).read_frozen()
    self.predict_fn = make_predict(self.run)
    self.tokenizer_item = checkpoints.tokenizer_item(tokenizer)
    self.main_split = task.eval_splits[0]
    self.summary = None

  @property
  def recorded_config(self):
    return self._recorded

  def header_rows(self) -> list[tuple[str, str]]:
    config, task, members = self.config, self.task, self.members
    return [
      (
        "task",
        f"{task.name} ({task.head} head): {self.num_rows:,} training rows; evaluated on "
        f"{', '.join(self.splits.evaluation)} ({task.main_metric})",
      ),
      ("from", config.init_from or "a random initialisation"),
      ("model", progress.model_row(self.model_cfg, self.run.num_params)),
      ("devices", progress.devices_row(self.run.mesh)),
      (
        "batch",
        f"{config.batch_size} rows x {config.finetune.max_seq_length} tokens; {self.last_step} steps "
        f"({config.finetune.num_epochs:g} epochs); {len(members)} member(s) (learning rate, seed): "
        f"{', '.join(f'({m.learning_rate:g}, {m.seed})' for m in members)}",
      ),
      ("workdir", self.workdir),
    ]

  def start(self, manager) -> start_order.Start:
    self.best_manager = checkpoints.make_manager(self.workdir, 1, checkpoints.BEST)

    def restore(checkpoint_manager, step: int):
      return checkpoints.restore(checkpoint_manager, step, self.run.abstract, self.run.shardings)

    def fresh() -> start_order.Start:
      """The encoder only: every member's head starts from its own seed, even from a fine-tuned source."""
      encoder = None if self.source is None else {"bert": self.source.params["bert"]}
      state = self.run.init_state([m.seed for m in self.members], encoder)
      rates = jnp.array([m.learning_rate for m in self.members], jnp.float32)
      state = state.replace(opt_state=set_learning_rates(state.opt_state, rates))
      state = jax.device_put(state, self.run.shardings)  # The rates too: else step 2 compiles the step again.
      started = "step 0: the encoder as `from` says, each member's head from its own seed"
      return start_order.Start(state, {"examples": 0}, False, started)

    begun = start_order.start(self.config, manager, restore, fresh)
    step = int(jax.device_get(begun.state.step)[0])
    self.record = checkpoints.read_history(manager, step) if begun.resumed else {"evaluations": [], "best": None}
    if self.run.frozen is not None:  # What taught the members: a resume must read the same (check_frozen).
      self.record[self.run.frozen.name] = self.run.frozen.identity
    return begun

  def open_data(self, begun: start_order.Start) -> None:
    self.ones = np.ones((len(self.members), self.config.batch_size), np.float32)  # The streams: functions of step.

  def batch(self, step: int) -> dict:
    """[members, batch, ...]: each member's rows of step `step` in its own seed's stream."""
    rows = np.stack([training_rows(step, self.num_rows, self.config.batch_size, m.seed) for m in self.members])
    host = _host_batch(self.splits.train.features, rows, self.ones)
    return sharding.global_batch(host, self.run.mesh, members=True)

  def dropout_key(self) -> jax.Array:
    return jnp.stack([loop.train_dropout_key(m.seed) for m in self.members])

  def ticker(self, first_step: int) -> progress.Progress:
    return progress.Progress(self.last_step, self.tokens_per_step, first_step, shown=("task_loss", "task_accuracy"))

  def summarize(self, step: int, sums: dict, steps: int) -> dict:
    return progress.summarize(jax.tree.map(lambda x: x.mean(), sums), steps)

  def evaluates_at(self, step: int) -> bool:
    return step in self.epoch_ends

  def evaluate(self, state, step: int, writer: progress.MetricWriter) -> None:
    task, config, members = self.task, self.config, self.members
    results = _evaluate(task, self.predict_fn, state.params, self.splits.evaluation, config, self.run.mesh, members)
    self.record["evaluations"].append(dict(step=step, results=results))
    for split, per_member in results.items():
      for index, metrics_of_member in enumerate(per_member):
        writer.write(step, {f"{split}/{name}/member_{index}": v for name, v in metrics_of_member.items()})
    mains = [m[task.main_metric] for m in results[self.main_split]]
    logging.info(
      "eval at step %d (epoch %.2f): %s %s per member %s",
      step,
      step * config.batch_size / self.num_rows,
      self.main_split,
      task.main_metric,
      [round(v, 4) for v in mains],
    )
    best_index = int(np.argmax(mains))
    if self.record["best"] is None or mains[best_index] > self.record["best"]["value"]:
      self.record["best"] = dict(
        step=step, member=best_index, value=mains[best_index], **dataclasses.asdict(members[best_index])
      )
      checkpoints.save(
        self.best_manager,
        step,
        _member_state(state, best_index),
        self._position(step),
        self.recorded_config,
        self.tokenizer_item,
        dict(self.record["best"], **task.task_head.to_json()),
      )

  def _position(self, step: int) -> dict:
    return {"examples": step * self.config.batch_size, "tokenizer": self.tokenizer.identity(), "step": step}

  def saves_at(self, step: int) -> bool:
    return step in self.epoch_ends

  def checkpoint(self, step: int) -> tuple[dict, dict]:
    return self._position(step), json.loads(json.dumps(self.record))

  def close(self, failed: bool) -> None:
    checkpoints.finish(self.best_manager, None, raise_errors=not failed)

  def finish(self, state, step: int, stopped: bool) -> list[tuple[str, str]]:
    """The sweep's table, the best member's predictions of every eval and test split, `metrics.json`."""
    if stopped or step < self.last_step or not self.record["evaluations"]:
      return []
    task, config, workdir, record = self.task, self.config, self.workdir, self.record
    final = record["evaluations"][-1]["results"]
    finals = [m[task.main_metric] for m in final[self.main_split]]
    table = sweep_table(self.members, finals, task.main_metric)
    _log_table(table)
    chosen = int(np.argmax(finals))
    to_predict = {**self.splits.evaluation, **self.splits.test}
    batch_size, mesh = config.finetune.eval_batch_size, self.run.mesh
    logits = {
      split: predict(self.predict_fn, state.params, encoded, batch_size, mesh)[chosen]
      for split, encoded in to_predict.items()
    }
    calibration = task.calibrate(self.splits.evaluation[self.main_split], logits[self.main_split])
    if calibration:
      logging.info("Chosen on %s for the prediction files: %s.", self.main_split, calibration)
    if jax.process_index() == 0:
      (epath.Path(workdir) / "predictions").mkdir(parents=True, exist_ok=True)
      for split, encoded in to_predict.items():
        task.write_predictions(encoded, logits[split], _prediction_path(workdir, task, split))
    self.summary = dict(
      task=task.name,
      head=task.head,
      main_metric=task.main_metric,
      members=[dataclasses.asdict(m) for m in self.members],
      final=final,
      sweep=table,
      best=record["best"],
      evaluations=record["evaluations"],
      predictions_from_member=chosen,
      calibration=calibration,
    )
    if jax.process_index() == 0:
      paths.write_text(epath.Path(workdir) / METRICS_FILE, json.dumps(self.summary, indent=1))
    multihost_utils.sync_global_devices("finetune metrics written")
    best = record["best"]
    return [
      (
        "eval",
        f"{self.main_split} {task.main_metric} per member at step {record['evaluations'][-1]['step']}: "
        f"{[round(v, 4) for v in finals]}",
      ),
      ("best", f"{best['value']:.4f} (member {best['member']}, step {best['step']}): {epath.Path(workdir) / 'best'}"),
      ("predictions", f"{epath.Path(workdir) / 'predictions'} (member {chosen})"),
      ("metrics", str(epath.Path(workdir) / METRICS_FILE)),
    ]


def finetune(config, workdir: str, checked: config_checks.Checked | None = None) -> dict | None:
  """Fine-tunes (or resumes fine-tuning) `config.finetune.task`; returns what `metrics.json` holds (None when a
  preemption stopped the run: the same command resumes). `checked` is `config_checks.check`'s result when main
  ran it."""
  started_at = time.perf_counter()
  checked = checked or config_checks.check(config, "finetune")
  start_order.check_same_run(config, workdir, RUN_KEYS, RUN_KEYS_ABSENT)
  task = tasks.make_task(config.finetune)
  source = None
  if config.init_from:  # Read, and so checked, before anything is written.
    mesh = sharding.make_mesh(config.mesh.to_dict())
    rules = tuple(tuple(rule) for rule in config.logical_axis_rules)
    source = pretrained.load(config.init_from, scan_layers=config.model.scan_layers, mesh=mesh, rules=rules)
    tokenizer = source.tokenizer
  else:
    tokenizer = load_tokenizer(config.tokenizer.kind, config.tokenizer.path, config.tokenizer.lower_case)
  model_cfg = model_config(config, source)
  if config.finetune.max_seq_length > model_cfg.max_sequence_length:
    raise ValueError(
      f"finetune.max_seq_length={config.finetune.max_seq_length} exceeds the model's "
      f"{model_cfg.max_sequence_text} ({config.init_from})."
    )
  splits = _read_splits(task, tokenizer, config.finetune.max_seq_length)
  total_steps = math.ceil(config.finetune.num_epochs * splits.train.num_rows / config.batch_size)
  plan = Plan.of(config, total_steps, model_cfg, checked.members)
  job = FinetuningJob(config, plan, workdir, task, source, tokenizer, splits)
  newest = start_order.newest_saved(config, workdir)
  if newest is not None:
    start_order.check_frozen(workdir, newest[0], job.run.frozen)
  loop.train(job, workdir, started_at)
  return job.summary
