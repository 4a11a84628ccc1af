"""GLUE with seeds: the fine-tuning job on GLUE tasks, each run a sweep of seeds in one program, the dev metric's
mean +- std over the seeds, for any of these contestants side by side:

* `bert_jax:<schedule>`: bert_jax's fine-tuning job with `lr_schedule=<schedule>` ("bert" or "transformers");
* `reference:<schedule>`: the PyTorch reference loop (`torch_reference`: transformers' task model, torch AdamW,
  the same schedule), one run per seed, from the same weights (init_from exported to a Hugging Face directory);

and two initialisations: `pretrained` (`--init_from`) and `random` (its model sizes and `--vocab`; bert_jax only).

    python -m bert_jax.benchmarks.finetune_glue --glue_dir=../shared/data/glue \
        --init_from=/tmp/tiny_english --vocab=../shared/data/vocab/bert-base-uncased-vocab.txt \
        --workdir=/tmp/glue_eval --tasks=mrpc,rte,cola,sst2 --seeds=5 \
        --contestants=bert_jax:transformers,reference:transformers,bert_jax:bert --inits=pretrained

Every member is a restart of everything on both sides: seed s draws the head's initialisation, the dropout and the
training order (`rows.training_rows` of seed s, which both sides read), with the same step counts (epochs of the
training rows at the batch size; a fraction of an epoch is that fraction of one random order), warmup, AdamW,
weight decay, clipping and dropout (configs/glue.py's). `--init_from` is any source `pretrained.load` reads
(configs/tiny_english.py writes the one in docs/benchmarks.md). A run's results go to
`<workdir>/<task>/<init>/<contestant>/metrics.json`; a finished run is read back rather than trained again, so an
interrupted evaluation resumes. Prints a markdown table and writes `<workdir>/results.json`.
"""

import dataclasses
import json
import os
import time

import numpy as np
from absl import app, flags, logging
from etils import epath

from bert_jax import jobs
from bert_jax.benchmarks import random_start
from bert_jax.data.tokenizer import load_tokenizer
from bert_jax.finetune import glue, job, plan, rows
from bert_jax.finetune.members import Member, sweep_members
from bert_jax.handoff import export, pretrained
from bert_jax.train.optim import LINEAR_SCHEDULES
from configs import glue as glue_config
from configs import glue_modernbert

RECIPES = ("bert", "modernbert")

_GLUE_DIR = flags.DEFINE_string("glue_dir", None, "Directory holding the GLUE task directories (SST-2, MRPC, ...).")
_INIT_FROM = flags.DEFINE_string("init_from", "", "The pretrained source (and the random model's sizes).")
_VOCAB = flags.DEFINE_string("vocab", None, "The WordPiece vocabulary (random initialisation's tokenizer).")
_LOWER_CASE = flags.DEFINE_bool("lower_case", True, "Whether --vocab is uncased.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Where each run's workdir goes.")
_TASKS = flags.DEFINE_list("tasks", ["mrpc", "rte", "cola", "sst2"], "GLUE tasks.")
_INITS = flags.DEFINE_list("inits", ["pretrained", "random"], "Which initialisations to fine-tune.")
_CONTESTANTS = flags.DEFINE_list(
  "contestants", ["bert_jax:bert"], "Who fine-tunes, with which schedule: bert_jax:<schedule>, reference:<schedule>."
)
_SEEDS = flags.DEFINE_integer("seeds", 5, "Seeds per learning rate (sweep.seeds).")
_SEED = flags.DEFINE_integer("seed", 0, "The first seed (config.seed): seeds seed .. seed + seeds - 1.")
_LEARNING_RATES = flags.DEFINE_string("learning_rates", "3e-4", "sweep.learning_rates.")
_EPOCHS = flags.DEFINE_string(
  "num_epochs", "sst2:0.25,default:2", "Epochs per task, task:epochs pairs with a default (SST-2 has 67k rows)."
)
_SEQ = flags.DEFINE_string(
  "max_seq_length", "sst2:64,cola:32,mrpc:64,default:128", "Tokens per row per task, as above."
)
_BATCH = flags.DEFINE_integer("batch_size", 32, "Batch size.")
_RECIPE = flags.DEFINE_enum(
  "recipe",
  "bert",
  list(RECIPES),
  "The fine-tuning config: bert (configs/glue.py, with this program's learning rate, epochs, rows and batch "
  "defaults) or modernbert (configs/glue_modernbert.py: its reference's per task; the flags above override it "
  "only where given).",
)


def _per_task(text: str, task: str) -> float:
  pairs = dict(item.split(":") for item in text.split(","))
  return float(pairs.get(task, pairs["default"]))


def _given(flag) -> bool:
  """Whether `flag` sets this run's value: always under --recipe=bert, where given under the reference's recipe."""
  return _RECIPE.value == "bert" or flag.present


def _recipe(task: str):
  """`task`'s fine-tuning config under --recipe, with the flags that set its epochs, rows, rates and batch."""
  config = glue_config.get_config() if _RECIPE.value == "bert" else glue_modernbert.get_config(task)
  config.finetune.update(task=task, data_dir=os.path.join(_GLUE_DIR.value, glue.TASKS[task].glue_dir))
  if _given(_EPOCHS):
    config.finetune.num_epochs = _per_task(_EPOCHS.value, task)
  if _given(_SEQ):
    config.finetune.max_seq_length = int(_per_task(_SEQ.value, task))
  if _given(_LEARNING_RATES):
    config.sweep.learning_rates = _LEARNING_RATES.value
  if _given(_BATCH):
    config.batch_size = _BATCH.value
  config.sweep.seeds = _SEEDS.value
  config.update(log_every_steps=100, seed=_SEED.value)
  return config


def _config(task: str, init: str, schedule: str):
  config = _recipe(task)
  config.lr_schedule = schedule
  if init == "pretrained":
    config.init_from = _INIT_FROM.value
  else:
    random_start.random_start(config, _INIT_FROM.value, _VOCAB.value, _LOWER_CASE.value)
  return config


def _hf_directory() -> str:
  """`--init_from` as a Hugging Face directory (exported once into the workdir), what the reference loads."""
  directory = epath.Path(_WORKDIR.value) / "init_from_huggingface"
  if not (directory / "config.json").exists():
    export.export(_INIT_FROM.value, str(directory), format="huggingface")
  return str(directory)


def _reference(config, task_name: str) -> dict:
  """The reference loop for every (learning rate, seed) member of `config.sweep`, one run after another, on the rows
  bert_jax's member of that seed reads; a summary shaped as the job's metrics.json (members, final, sweep)."""
  from bert_jax.benchmarks import torch_reference  # torch and transformers: only this contestant needs them.

  task = glue.make_task(task_name, config.finetune.data_dir)
  loaded = pretrained.load(config.init_from)
  seq = config.finetune.max_seq_length
  train = task.encode(task.read(task.train_split), loaded.tokenizer, seq)
  dev = task.encode(task.read(task.eval_splits[0]), loaded.tokenizer, seq)
  steps = plan.make_plan(config, (), loaded, train.num_rows).steps
  total = steps.end_step
  members = [dataclasses.asdict(m) for m in sweep_members(config)]
  finals = []
  for member in members:
    config.learning_rate = member["learning_rate"]
    rows = [rows.training_rows(s, train.num_rows, config.batch_size, member["seed"]) for s in range(1, total + 1)]
    torch_reference.torch.manual_seed(member["seed"])  # The head's initialisation.
    model = torch_reference.load_model(_hf_directory(), task.head, task.num_labels, pad_embedding_trains=False)
    hp = torch_reference.Hyperparameters.of(config, steps)
    torch_reference.train(model, task.head, train.features, rows, hp, dropout=True, seed=member["seed"])
    logits = torch_reference.logits(model, task.head, dev.features, config.finetune.eval_batch_size)
    finals.append(task.metrics(dev, logits[..., 0] if task.head == "regression" else logits))
    logging.info("%s reference member %s: %s", task_name, member, finals[-1])
  values = [final[task.main_metric] for final in finals]
  return dict(
    task=task_name,
    main_metric=task.main_metric,
    members=members,
    final={task.eval_splits[0]: finals},
    sweep=job.sweep_table([Member(**m) for m in members], values, task.main_metric),
  )


def _run(task: str, init: str, contestant: str) -> dict:
  who, schedule = contestant.split(":")
  workdir = epath.Path(_WORKDIR.value) / task / init / contestant.replace(":", "-")
  metrics_file = workdir / job.METRICS_FILE
  if metrics_file.exists():
    logging.info("%s/%s/%s: finished before, reading %s.", task, init, contestant, metrics_file)
    return json.loads(metrics_file.read_text())
  start = time.perf_counter()
  config = _config(task, init, schedule)
  if who == "bert_jax":
    summary = jobs.run(config, str(workdir), "finetune")
  else:
    summary = _reference(config, task)
  if summary is None:  # Preempted (SIGTERM): its checkpoint is saved, its metrics are not final.
    raise SystemExit(
      f"{task}/{init}/{contestant} stopped before its last step; nothing written: the same command resumes it."
    )
  summary["seconds"] = time.perf_counter() - start
  workdir.mkdir(parents=True, exist_ok=True)
  metrics_file.write_text(json.dumps(summary, indent=1))
  return summary


def _majority(task_name: str) -> float:
  """The dev main metric of always predicting the training set's most frequent label."""
  task = glue.make_task(task_name, os.path.join(_GLUE_DIR.value, glue.TASKS[task_name].glue_dir))
  tokenizer = load_tokenizer("wordpiece", _VOCAB.value, _LOWER_CASE.value)
  train = task.encode(task.read("train"), tokenizer, 8).features["label"]
  dev = task.encode(task.read("dev"), tokenizer, 8)
  logits = np.zeros((dev.num_rows, task.num_labels), np.float32)
  logits[:, np.bincount(train).argmax()] = 1.0
  return task.metrics(dev, logits)[task.main_metric]


def _cell(row: dict) -> str:
  return f"{100 * row['mean']:.1f} +- {100 * row['std']:.1f} (best {100 * row['best']:.1f})"


def _check_flags() -> list[tuple[str, str]]:
  """(init, contestant) pairs to run; bad flags are refused naming the value before anything runs."""
  if not _INIT_FROM.value:
    raise app.UsageError("--init_from is needed (the pretrained model, and the random model's sizes).")
  unknown = [task for task in _TASKS.value if task not in glue.TASKS]
  if unknown:
    raise app.UsageError(f"Unknown tasks {unknown}; expected GLUE tasks {sorted(glue.TASKS)}.")
  for contestant in _CONTESTANTS.value:
    who, _, schedule = contestant.partition(":")
    if who not in ("bert_jax", "reference") or schedule not in LINEAR_SCHEDULES:
      raise app.UsageError(
        f"--contestants: {contestant!r}; expected bert_jax:<schedule> or reference:<schedule>, schedule one of "
        f"{LINEAR_SCHEDULES}."
      )
  if "random" in _INITS.value and any(c.startswith("reference:") for c in _CONTESTANTS.value):
    logging.warning("The reference starts from --init_from's weights only: no random-initialisation reference runs.")
  return [
    (init, contestant)
    for init in _INITS.value
    for contestant in _CONTESTANTS.value
    if init == "pretrained" or contestant.startswith("bert_jax:")
  ]


def main(argv):
  del argv
  columns = _check_flags()
  results = {task: {f"{init} {c}": _run(task, init, c) for init, c in columns} for task in _TASKS.value}
  (epath.Path(_WORKDIR.value) / "results.json").write_text(json.dumps(results, indent=1))

  names = [f"{init} {c}" for init, c in columns]
  header = "| task (dev metric) | epochs, seq, batch | majority class | " + " | ".join(names) + " |"
  lines = [header, "|" + "---|" * (3 + len(names))]
  for task, by_column in results.items():
    any_summary = next(iter(by_column.values()))
    for rate in any_summary["sweep"]:
      cells = [_cell(summary["sweep"][rate]) for summary in by_column.values()]
      recipe = _recipe(task)
      setting = f"{recipe.finetune.num_epochs:g}, {recipe.finetune.max_seq_length}, {recipe.batch_size}"
      majority = f"{100 * _majority(task):.1f}"
      row = f"| {task} ({any_summary['main_metric']}), lr {rate} | {setting} | {majority} | " + " | ".join(cells)
      lines.append(row + " |")
  seeds = len(any_summary["members"]) // len(any_summary["sweep"])
  print(f"\nDev metric x 100, mean +- std (population) over {seeds} seeds, final evaluation; {_RECIPE.value}'s recipe.")
  print("\n".join(lines))
  for task, by_column in results.items():
    for name, summary in by_column.items():
      if "seconds" in summary:
        print(f"{task}/{name}: {summary['seconds']:.0f} s")


if __name__ == "__main__":
  flags.mark_flags_as_required(["glue_dir", "vocab", "workdir"])
  app.run(main)
