"""The fine-tuning job: a task head on a pretrained encoder, trained as one run or as a sweep of (learning rate,
seed) members in one jitted program, evaluated every epoch with the task's official metrics.

Start order: the workdir's newest checkpoint (a resume: the stream position is the step); else `init_from`'s
weights (any source `pretrained.load` accepts; its model sizes and tokenizer), with a fresh head per seed but for
ModernBERT's prediction head, which starts where transformers' from_pretrained starts it (`initial_params`); else,
without `init_from`, a random initialisation of `config.model` with `config.tokenizer` (a baseline). A resume must
have the checkpoint's run keys (`RUN_KEYS`) and its inputs by content, at any path (`run_inputs`: the task's files,
the teacher, `init_from`; see `train/start_order.py`), and its tokenizer (by SHA-256).

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
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from etils import epath
from flax import traverse_util
from jax.experimental import multihost_utils

from bert_jax import paths, progress, sharding
from bert_jax.data.tokenizer import load_tokenizer
from bert_jax.finetune import contrastive, embeddings, tasks
from bert_jax.finetune.contract import Encoded, Task
from bert_jax.finetune.members import Member
from bert_jax.finetune.plan import Plan, job_spec, make_plan, with_model
from bert_jax.finetune.rows import host_batch, predict, training_rows
from bert_jax.handoff import hf_names, pretrained
from bert_jax.model.bert_config import BertConfig
from bert_jax.train import init_from, loop, start_order
from bert_jax.train.job_spec import JobSpec
from bert_jax.train.optim import set_learning_rates
from bert_jax.workdir import checkpoints, reading

METRICS_FILE = "metrics.json"
# What makes a fine-tuning run the run it is: a workdir's checkpoint resumes only a config that agrees on these.
RUN_KEYS = (
  "seed",
  "batch_size",
  "learning_rate",
  "optimizer",
  "lr_schedule",
  "lr_decay",
  "lr_decay_fraction",
  "lr_decay_floor",
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
  # What the head computes (ModernBERT's; BERT's heads refuse other values than the defaults), as the run resolves
  # them: the config's, else init_from's (`plan.model_config`).
  "model.classifier_pooling",
  "model.classifier_activation",
  "model.classifier_bias",
  # The embeddings task: its loss and how it embeds (as the config says; unset embedding.* keys: the source's, which
  # `init_from`'s content fixes).
  "contrastive.scale",
  "contrastive.symmetric",
  "contrastive.matryoshka_dims",
  "contrastive.hard_negatives",
  "embedding.pooling",
  "embedding.normalize",
  "embedding.query_prompt",
  "embedding.document_prompt",
)
# What a checkpoint written before a run key existed ran with (lr_schedule: Google's, the only one there was; wsd's
# keys: their defaults, which no schedule then read; no teacher; BERT's heads, which read no classifier_* key).
RUN_KEYS_ABSENT = {
  "lr_schedule": "bert",
  "lr_decay": "1-sqrt",
  "lr_decay_fraction": 0.2,
  "lr_decay_floor": 0.0,
  "distill.teacher": "",
  "distill.temperature": 2.0,
  "distill.alpha_hard": 0.5,
  "model.classifier_pooling": "cls",
  "model.classifier_activation": "gelu",
  "model.classifier_bias": False,
  "contrastive.scale": 20.0,
  "contrastive.symmetric": False,
  "contrastive.matryoshka_dims": "",
  "contrastive.hard_negatives": 0,
  "embedding.pooling": None,
  "embedding.normalize": None,
  "embedding.query_prompt": None,
  "embedding.document_prompt": None,
}


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


def initial_params(source: pretrained.Pretrained | None, model: BertConfig) -> tuple[dict | None, str]:
  """What every member of a new run takes of `source` (the rest of its parameters start from its own seed), and what
  that is, in words. The encoder (`bert`) always. ModernBERT's task heads (`task_head` "prediction") also take their
  prediction head `head` (dense, norm) where transformers' from_pretrained, which loads `head.*` by name, takes it: a
  fine-tuned source's own, or a masked LM's transform and norm (`hf_names.prediction_head_of_masked_lm`). The output
  layer (`classifier`; BERT's `classifier` or `qa_outputs`) starts from the seed, even from a fine-tuned source.

  A run whose `classifier_activation` or `classifier_bias` differs from the source's (set in its config) starts the
  prediction head from the seed too, with a warning naming the field: that head computes another function than the
  source's, and loading what fits (transformers' way: the dense weight without a bias it gains, or under another
  activation) would start it as neither the source's nor a new head. Refusing instead would leave no way to ask for
  another head on a ModernBERT source."""
  encoder_only = "the encoder as `from` says, each member's head from its own seed"
  if source is None:
    return None, encoder_only
  params = {"bert": source.params["bert"]}
  if model.architecture.task_head != "prediction":
    return params, encoder_only
  theirs = source.config
  different = [
    f"model.{name}={getattr(model, name)!r}, the source's {getattr(theirs, name)!r}"
    for name in ("classifier_activation", "classifier_bias")
    if getattr(model, name) != getattr(theirs, name)
  ]
  if "head" in source.params:  # A fine-tuned ModernBERT: its own prediction head.
    head, what = {"head": source.params["head"]}, "its prediction head"
  else:
    carried, flat = hf_names.prediction_head_of_masked_lm(theirs), traverse_util.flatten_dict(source.params)
    if not carried or any(path not in flat for path in carried):
      logging.info("%s has no masked-LM head: the prediction head starts from each member's seed.", source.source.path)
      return params, encoder_only
    head = traverse_util.unflatten_dict({ours: flat[path] for path, ours in carried.items()})
    what = "its masked LM's transform and norm"
    if theirs.embedding_width != model.hidden_size:
      different.append(
        f"the transform is {theirs.embedding_width} wide (model.embedding_size), the head {model.hidden_size}"
      )
  if different:
    logging.warning(
      "The prediction head starts from each member's seed, not from %s of %s: %s.",
      what,
      source.source.path,
      "; ".join(different),
    )
    return params, encoder_only
  started = f"the encoder and the prediction head as `from` says ({what}), each member's `classifier` from its seed"
  return dict(params, **head), started


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

  def __init__(
    self,
    config,
    plan: Plan,
    workdir: str,
    task: Task,
    source,
    tokenizer,
    splits: _Splits,
    spec: JobSpec,
    inputs: tuple[start_order.Input, ...] = (),
  ):
    """`spec`: `plan.job_spec`'s, for `plan` and `task`; its frozen inputs (a teacher) are read here.
    `inputs` (`run_inputs`): what every checkpoint records of them (`start_order.record_inputs`)."""
    self.config, self.plan, self.workdir, self.task, self.spec = config, plan, workdir, task, spec
    self.inputs = inputs
    self.members, self.source, self.tokenizer = plan.members, source, tokenizer
    self._recorded = plan.record(config)
    self.splits = splits
    self.num_rows = self.splits.train.num_rows
    self.last_step, self.epoch_ends = plan.num_train_steps, plan.epoch_ends
    self.model_cfg = plan.model
    self.run = spec.run.read_frozen()
    self.predict_fn = spec.eval_step
    self.tokenizer_item = checkpoints.tokenizer_item(tokenizer)
    self.main_split = task.eval_splits[0]
    self.summary = None

  @property
  def recorded_config(self):
    return self._recorded

  def header_rows(self) -> list[tuple[str, str]]:
    config, task, members = self.config, self.task, self.members
    model, devices = self.spec.header_rows()
    return [
      (
        "task",
        f"{task.name} ({task.head} head): {self.num_rows:,} training rows; evaluated on "
        f"{', '.join(self.splits.evaluation)} ({task.main_metric})",
      ),
      ("from", config.init_from or "a random initialisation"),
      model,
      devices,
      (
        "batch",
        f"{self.spec.batch_row}; {self.last_step} steps ({config.finetune.num_epochs:g} epochs); "
        f"{len(members)} member(s) (learning rate, seed): "
        f"{', '.join(f'({m.learning_rate:g}, {m.seed})' for m in members)}",
      ),
      ("workdir", self.workdir),
    ]

  def start(self, manager) -> start_order.Start:
    self.best_manager = checkpoints.make_manager(self.workdir, 1, checkpoints.BEST, held=self.held)

    def restore(checkpoint_manager, step: int):
      return start_order.restore_state(checkpoint_manager, step, self.run.abstract, self.run.shardings)

    def fresh() -> start_order.Start:
      """What `initial_params` takes of the source; the rest of every member's head from its own seed."""
      params, started = initial_params(self.source, self.model_cfg)
      state = self.run.init_state([m.seed for m in self.members], params)
      rates = jnp.array([m.learning_rate for m in self.members], jnp.float32)
      state = state.replace(opt_state=set_learning_rates(state.opt_state, rates))
      state = jax.device_put(state, self.run.shardings)  # The rates too: else step 2 compiles the step again.
      return start_order.Start(state, {"examples": 0}, False, f"step 0: {started}")

    begun = start_order.start(self.config, manager, restore, fresh)
    step = int(jax.device_get(begun.state.step)[0])
    self.record = reading.read_history(manager, step) if begun.resumed else {"evaluations": [], "best": None}
    if self.run.frozen is not None:  # What taught the members, where it was read from.
      self.record[self.run.frozen.name] = self.run.frozen.identity
    # What the run read, by content (checked on a resume: start_order.check_inputs).
    recorded = self.record.get(start_order.INPUTS, {}) if begun.resumed else None
    self.record[start_order.INPUTS] = start_order.record_inputs(self.inputs, recorded)
    return begun

  def open_data(self, begun: start_order.Start) -> None:
    self.ones = np.ones((len(self.members), self.config.batch_size), np.float32)  # The streams: functions of step.
    self.stream = self.task.batches(self.splits.train, self.config.batch_size)  # None: `training_rows`'.

  def batch(self, step: int) -> dict:
    """[members, batch, ...]: each member's rows of step `step` in its own seed's stream."""
    if self.stream is None:
      rows = np.stack([training_rows(step, self.num_rows, self.config.batch_size, m.seed) for m in self.members])
      weight = self.ones
    else:  # The task's own stream (the embeddings task's batches without a text twice), padded with weight 0.
      rows, weight = (np.stack(x) for x in zip(*(self.stream.step(step, m.seed) for m in self.members), strict=True))
    host = host_batch(self.splits.train.features, rows, weight)
    return sharding.global_batch(host, self.run.mesh, members=True)

  def dropout_key(self) -> jax.Array:
    return jnp.stack([loop.train_dropout_key(m.seed) for m in self.members])

  def ticker(self, first_step: int) -> progress.Progress:
    return self.spec.ticker(self.config, self.last_step, first_step, shown=("task_loss", "task_accuracy"))

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
      self.held.check()
      checkpoints.save(
        self.best_manager,
        step,
        _member_state(state, best_index),
        self._position(step),
        self.recorded_config,
        self.tokenizer_item,
        dict(self.record["best"], **task.record()),
      )

  def _position(self, step: int) -> dict:
    return {"examples": step * self.config.batch_size, "tokenizer": self.tokenizer.identity(), "step": step}

  def saves_at(self, step: int) -> bool:
    return step in self.epoch_ends

  def checkpoint(self, step: int) -> tuple[dict, dict]:
    return self._position(step), json.loads(json.dumps(self.record))

  def close(self, failed: bool) -> None:
    checkpoints.finish(self.best_manager, None, self.held, raise_errors=not failed)

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
    predicting = time.perf_counter()
    logging.info(
      "Predicting %s (%s rows) for the prediction files, with member %d ...",
      ", ".join(to_predict),
      " + ".join(f"{encoded.num_rows:,}" for encoded in to_predict.values()),
      chosen,
    )
    logits = {
      split: predict(self.predict_fn, state.params, encoded, batch_size, mesh)[chosen]
      for split, encoded in to_predict.items()
    }
    calibration = task.calibrate(self.splits.evaluation[self.main_split], logits[self.main_split])
    if calibration:
      logging.info("Chosen on %s for the prediction files: %s.", self.main_split, calibration)
    self.held.check()
    if jax.process_index() == 0:
      (epath.Path(workdir) / "predictions").mkdir(parents=True, exist_ok=True)
      for split, encoded in to_predict.items():
        task.write_predictions(encoded, logits[split], f"{workdir}/predictions/{task.prediction_file(split)}")
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
    logging.info("Predictions written in %.1f s.", time.perf_counter() - predicting)
    self.summary.update({key: value for key, value in task.record().items() if key not in self.summary})
    self.held.check()
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


def finetune(config, workdir: str, members: tuple[Member, ...]) -> dict | None:
  """Fine-tunes (or resumes fine-tuning) `config.finetune.task` with the sweep's `members` (what the front door's
  check found: `jobs.run` calls this); returns what `metrics.json` holds (None when a preemption stopped the run: the
  same command resumes)."""
  started_at = time.perf_counter()
  task = tasks.make_task(config.finetune, config.contrastive, config.embedding)
  inputs = run_inputs(config, task)
  # The encoder from init_from's metadata, so that one the task heads cannot go on is refused before its weights
  # are read; the steps once the rows are read.
  plan = make_plan(config, members, init_from.read_source(config.init_from, "init_from") if config.init_from else None)
  model_cfg = plan.model
  if task.head == "embedding":  # Before anything is read: dimensions the encoder's embedding has.
    contrastive.check_matryoshka_dims(task.contrastive.matryoshka_dims, model_cfg.hidden_size)
  # The run keys as they run: the model's `classifier_*`, which the config may leave to the source, resolved.
  start_order.check_same_run(with_model(config, model_cfg), workdir, RUN_KEYS, RUN_KEYS_ABSENT, inputs)
  source = None
  mesh = sharding.make_mesh(config.mesh.to_dict())  # The one mesh: the source is read onto it, the run made on it.
  if config.init_from:  # Read, and so checked, before anything is written.
    rules = tuple(tuple(rule) for rule in config.logical_axis_rules)
    source = pretrained.load(config.init_from, scan_layers=config.model.scan_layers, mesh=mesh, rules=rules)
    tokenizer = source.tokenizer
  else:
    tokenizer = load_tokenizer(config.tokenizer.kind, config.tokenizer.path, config.tokenizer.lower_case)
    if tokenizer.vocab_size > model_cfg.vocab_size:  # Ids past the table would be clamped, silently, by the lookup.
      raise ValueError(
        f"tokenizer.path={config.tokenizer.path} has {tokenizer.vocab_size} ids but model.vocab_size="
        f"{model_cfg.vocab_size}: set model.vocab_size to at least {tokenizer.vocab_size}."
      )
  if task.head == "embedding":  # How it embeds: config.embedding's keys, else the source's recorded settings.
    task = task.with_settings(
      embeddings.run_settings(config.finetune, config.embedding, None if source is None else source.embedding)
    )
  newest = start_order.newest_saved(config, workdir)
  if newest is not None and "tokenizer" in newest[2]:  # A resume tokenizes as its checkpoint did.
    start_order.check_tokenizer(newest[2], tokenizer.identity())
  if config.finetune.max_seq_length > model_cfg.max_sequence_length:
    raise ValueError(
      f"finetune.max_seq_length={config.finetune.max_seq_length} exceeds the model's "
      f"{model_cfg.max_sequence_text} ({config.init_from})."
    )
  splits = _read_splits(task, tokenizer, config.finetune.max_seq_length)
  plan = plan.with_rows(config, splits.train.num_rows)
  spec = job_spec(config, plan, task, tokenizer_identity=tokenizer.identity(), mesh=mesh)
  job = FinetuningJob(config, plan, workdir, task, source, tokenizer, splits, spec, inputs)
  if newest is not None:
    start_order.check_frozen(workdir, newest[0], job.run.frozen)  # A checkpoint older than its inputs' record.
  loop.train(job, workdir, started_at)
  return job.summary


def run_inputs(config, task: Task) -> tuple[start_order.Input, ...]:
  """The inputs a fine-tuning run is identified by, by content: the files `task` reads (or its TFDS dataset), the
  teacher, `init_from`."""
  dataset = task.tfds_dataset()
  where = f"(TFDS {dataset[0]})" if dataset else config.finetune.data_dir
  inputs = [start_order.Input("finetune.data_dir", where, task.content)]
  if config.distill.teacher:
    inputs.append(init_from.source_input("distill.teacher", config.distill.teacher))
  if config.init_from:
    inputs.append(init_from.source_input("init_from", config.init_from, optional=True))
  return tuple(inputs)
