"""What a fine-tuning run computes before it trains, and the job described once from it: the plan (`make_plan`: the
encoder from `init_from`'s metadata, the step counts from epochs and rows, the sweep's members), the sweep's run, and
`job_spec` (the run, batches, FLOPs and header lines), which the job (`finetune/job.py`) and the dry run both use."""

import dataclasses
import math

import ml_collections

from bert_jax import flops
from bert_jax.finetune import losses
from bert_jax.finetune.contract import Task
from bert_jax.finetune.members import Member
from bert_jax.finetune.rows import make_predict
from bert_jax.handoff import formats, pretrained
from bert_jax.model import bert_config
from bert_jax.model.bert_config import PREDICTION_HEAD_FIELDS, BertConfig, check_fine_tunable
from bert_jax.train import run
from bert_jax.train.job_spec import JobSpec
from bert_jax.train.objectives import distillation
from bert_jax.train.optim import Steps, make_sweep_optimizer


def model_config(config, source: pretrained.Pretrained | formats.Source | None) -> BertConfig:
  """The encoder's architecture (the source's, else config.model) with this run's dtype, remat and layout, and its
  dropout and its head's `classifier_*` (ModernBERT's pooling, prediction head and dropout): those the run sets, else
  the source's, as transformers' from_pretrained takes them (else transformers' defaults). Raises ValueError for what
  the family's fine-tuning heads cannot honour (`bert_config.check_fine_tunable`)."""
  ours = bert_config.model_config(config, None if source is None else source.config)
  if source is None:
    return ours
  keep = ("dtype", "remat", "scan_layers", "attention", "hidden_dropout_prob", "attention_dropout_prob")
  model = dataclasses.replace(source.config, **{name: getattr(ours, name) for name in keep + PREDICTION_HEAD_FIELDS})
  check_fine_tunable(model, f"init_from={config.init_from}: ")
  return model


@dataclasses.dataclass(frozen=True)
class Plan:
  """What this run computes from its config and what it reads, kept beside the config rather than written into
  it (`make_plan`): the encoder (init_from's architecture, this run's dtype and layout), the sweep's members, and
  the step counts: the last step, warmup from its fraction, and each epoch's last step (where the job evaluates and
  saves)."""

  model: BertConfig
  members: tuple[Member, ...]
  num_train_steps: int
  steps: Steps
  epoch_ends: tuple[int, ...]

  def with_rows(self, config, num_rows: int) -> "Plan":
    """This plan for `num_rows` training rows: `finetune.num_epochs` of them in batches of `batch_size`."""
    total = math.ceil(config.finetune.num_epochs * num_rows / config.batch_size)
    epochs = range(1, 1 + math.ceil(config.finetune.num_epochs))
    ends = {min(total, math.ceil(epoch * num_rows / config.batch_size)) for epoch in epochs} | {total}
    warmup = int(round(config.finetune.warmup_fraction * total))
    return dataclasses.replace(self, num_train_steps=total, steps=Steps(warmup, total), epoch_ends=tuple(sorted(ends)))

  def record(self, config) -> ml_collections.ConfigDict:
    """What a checkpoint records as its config: `config` with the plan's step counts and encoder, so that a
    reader of the checkpoint (export, `pretrained.load`, a resume) sees the architecture and schedule that ran."""
    recorded = with_model(config, self.model)
    recorded.update(num_train_steps=self.num_train_steps, warmup_steps=self.steps.warmup_steps, schedule_end_step=0)
    return recorded


def make_plan(config, members, source: pretrained.Pretrained | formats.Source | None, num_rows: int | None = None):
  """The plan of a fine-tuning run of `config` (checked) for `members` (the check's) on `source` (`init_from`'s
  metadata, or None for a baseline of `config.model`), the one way `finetune` and the dry run make it: the encoder
  (`model_config`, which refuses one the task heads cannot go on), and the steps of `num_rows` training rows; without
  rows (the dry run reads no files, and a run knows its encoder before it reads them), `num_train_steps` steps in one
  epoch."""
  model, total = model_config(config, source), config.num_train_steps
  warmup = int(round(config.finetune.warmup_fraction * total))
  plan = Plan(model, tuple(members), total, Steps(warmup, total), (total,))
  return plan if num_rows is None else plan.with_rows(config, num_rows)


def with_model(config, model: BertConfig) -> ml_collections.ConfigDict:
  """A copy of `config` whose `model` is `model` (`model_config`'s: the fields the run left unset resolved), as a
  checkpoint records it and a resume compares it."""
  resolved = ml_collections.ConfigDict(config.to_dict())
  resolved.model.update(dataclasses.asdict(model))
  return resolved


def make_run(
  config, plan: Plan, task: Task, devices=None, tokenizer_identity: dict | None = None, mesh=None
) -> run.Run:
  """The sweep's run: `task`'s model on the plan's encoder, one member per (learning rate, seed), the optimizer on
  the plan's step counts; with `distill.teacher`, the teacher described (checked against `tokenizer_identity` when
  given) as the run's frozen input and its soft labels in the loss."""
  model = task.model(plan.model)
  tx = make_sweep_optimizer(config, plan.steps)
  frozen, loss = None, task.loss()
  if config.distill.teacher:
    frozen = distillation.task_teacher(config, plan.model, task.task_head, tokenizer_identity)
    loss = losses.distilled(task.head, frozen.model, config.distill.temperature, config.distill.alpha_hard)
  return run.make_run(config, model, loss, tx, members=len(plan.members), devices=devices, frozen=frozen, mesh=mesh)


def job_spec(config, plan: Plan, task: Task, devices=None, tokenizer_identity: dict | None = None, mesh=None):
  """Fine-tuning `task` by `plan`, described once (`train/job_spec.py`): the sweep's run on `mesh` (default:
  one made from `config.mesh` over `devices`), every member's batch, the prediction step, the FLOPs."""
  sweep_run = make_run(config, plan, task, devices, tokenizer_identity, mesh)
  members, seq, choices = len(plan.members), config.finetune.max_seq_length, task.num_choices
  train_batch = task.train_batch_shapes(config.batch_size, seq)
  train_batch = {name: ((members, *shape), dtype) for name, (shape, dtype) in train_batch.items()}  # Per member.
  rows, eval_rows = config.batch_size * task.sequences_per_row, config.finetune.eval_batch_size * max(choices, 1)
  # Per member; the task heads are negligible beside the encoder (no MLM head here).
  train_flops = flops.train_flops_per_step(plan.model, rows, seq, 0)
  eval_flops = flops.forward_flops(flops.train_flops_per_step(plan.model, eval_rows, seq, 0))
  if sweep_run.frozen is not None:  # A teacher's forward pass too, for each member's rows.
    train_flops = flops.distillation_flops_per_step(plan.model, sweep_run.frozen.model.config, rows, seq, 0)
  return JobSpec(
    name=f"fine-tuning {task.name} ({task.head} head), {members} sweep member(s)",
    model_cfg=plan.model,
    run=sweep_run,
    train_batch=train_batch,
    eval_batch=losses.batch_shapes(task.head, config.finetune.eval_batch_size, seq, choices),
    eval_step=make_predict(sweep_run),
    eval_reads_frozen=False,
    tokens_per_step=members * rows * seq,
    train_flops=members * train_flops,
    eval_flops=members * eval_flops,
    batch_row=f"{config.batch_size} rows x {seq} tokens"
    + (f" ({choices} choices each)" if choices else "")
    + (f" ({task.sequences_per_row} texts each)" if task.sequences_per_row > 1 and not choices else ""),
  )
