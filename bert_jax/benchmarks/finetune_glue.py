"""Does pretraining help? The fine-tuning job on GLUE tasks, from a bert_jax pretraining run and from a random
initialisation of the same model, each a sweep of seeds in one program; dev metric mean +- std over the seeds.

    python -m bert_jax.benchmarks.finetune_glue --glue_dir=../shared/data/glue \
        --init_from=/tmp/tiny_english --vocab=../shared/data/vocab/bert-base-uncased-vocab.txt \
        --workdir=/tmp/glue_eval --tasks=mrpc,rte,cola,sst2 --seeds=5

`--init_from` is any source `pretrained.load` reads (configs/tiny_english.py writes the one in
docs/benchmarks.md); the random initialisation takes its model sizes and `--vocab`. Every run is
`bert_jax.finetune.job.finetune` with configs/glue.py and the overrides below, in `<workdir>/<task>/<init>`; a
finished run is read back from its metrics.json rather than trained again, so an interrupted evaluation resumes.
Prints a markdown table and writes `<workdir>/results.json`.
"""

import json
import os
import time

import numpy as np
from absl import app, flags, logging
from etils import epath

from bert_jax.data.tokenizer import load_tokenizer
from bert_jax.finetune import glue, job
from bert_jax.handoff import pretrained
from bert_jax.model.bert_config import SIZE_FIELDS
from configs import glue as glue_config

_GLUE_DIR = flags.DEFINE_string("glue_dir", None, "Directory holding the GLUE task directories (SST-2, MRPC, ...).")
_INIT_FROM = flags.DEFINE_string("init_from", "", "The pretrained source; empty: random initialisation only.")
_VOCAB = flags.DEFINE_string("vocab", None, "The WordPiece vocabulary (random initialisation's tokenizer).")
_LOWER_CASE = flags.DEFINE_bool("lower_case", True, "Whether --vocab is uncased.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Where each run's workdir goes.")
_TASKS = flags.DEFINE_list("tasks", ["mrpc", "rte", "cola", "sst2"], "GLUE tasks.")
_INITS = flags.DEFINE_list("inits", ["pretrained", "random"], "Which initialisations to fine-tune.")
_SEEDS = flags.DEFINE_integer("seeds", 5, "Seeds per learning rate (sweep.seeds).")
_LEARNING_RATES = flags.DEFINE_string("learning_rates", "3e-4", "sweep.learning_rates.")
_EPOCHS = flags.DEFINE_string(
  "num_epochs", "sst2:0.25,default:2", "Epochs per task, task:epochs pairs with a default (SST-2 has 67k rows)."
)
_SEQ = flags.DEFINE_string(
  "max_seq_length", "sst2:64,cola:32,mrpc:64,default:128", "Tokens per row per task, as above."
)
_BATCH = flags.DEFINE_integer("batch_size", 32, "Batch size.")

_GLUE_DIRS = {"sst2": "SST-2", "mrpc": "MRPC", "rte": "RTE", "cola": "CoLA", "stsb": "STS-B", "qnli": "QNLI"}


def _per_task(text: str, task: str) -> float:
  pairs = dict(item.split(":") for item in text.split(","))
  return float(pairs.get(task, pairs["default"]))


def _config(task: str, init: str):
  config = glue_config.get_config()
  config.finetune.update(
    task=task,
    data_dir=os.path.join(_GLUE_DIR.value, _GLUE_DIRS.get(task, task.upper())),
    num_epochs=_per_task(_EPOCHS.value, task),
    max_seq_length=int(_per_task(_SEQ.value, task)),
  )
  config.sweep.update(learning_rates=_LEARNING_RATES.value, seeds=_SEEDS.value)
  config.update(batch_size=_BATCH.value, log_every_steps=100)
  if init == "pretrained":
    config.init_from = _INIT_FROM.value
  else:  # The pretrained model's sizes, from its metadata; random weights.
    source = pretrained.describe(_INIT_FROM.value)
    config.model.update({name: getattr(source.config, name) for name in SIZE_FIELDS})
    config.tokenizer.update(kind="wordpiece", path=_VOCAB.value, lower_case=_LOWER_CASE.value)
  return config


def _run(task: str, init: str) -> dict:
  workdir = epath.Path(_WORKDIR.value) / task / init
  metrics_file = workdir / job.METRICS_FILE
  if metrics_file.exists():
    logging.info("%s/%s: finished before, reading %s.", task, init, metrics_file)
    return json.loads(metrics_file.read_text())
  start = time.perf_counter()
  summary = job.finetune(_config(task, init), str(workdir))
  summary["seconds"] = time.perf_counter() - start
  metrics_file.write_text(json.dumps(summary, indent=1))
  return summary


def _majority(task_name: str) -> float:
  """The dev main metric of always predicting the training set's most frequent label."""
  task = glue.make_task(task_name, os.path.join(_GLUE_DIR.value, _GLUE_DIRS.get(task_name, task_name.upper())))
  tokenizer = load_tokenizer("wordpiece", _VOCAB.value, _LOWER_CASE.value)
  train = task.encode(task.read("train"), tokenizer, 8).features["label"]
  dev = task.encode(task.read("dev"), tokenizer, 8)
  logits = np.zeros((dev.num_rows, task.num_labels), np.float32)
  logits[:, np.bincount(train).argmax()] = 1.0
  return task.metrics(dev, logits)[task.main_metric]


def _cell(row: dict) -> str:
  return f"{100 * row['mean']:.1f} +- {100 * row['std']:.1f} (best {100 * row['best']:.1f})"


def main(argv):
  del argv
  if not _INIT_FROM.value:
    raise app.UsageError("--init_from is needed (the pretrained model, and the random model's sizes).")
  unknown = [task for task in _TASKS.value if task not in glue.TASKS]
  if unknown:
    raise app.UsageError(f"Unknown tasks {unknown}; expected GLUE tasks {sorted(glue.TASKS)}.")
  results = {task: {init: _run(task, init) for init in _INITS.value} for task in _TASKS.value}
  (epath.Path(_WORKDIR.value) / "results.json").write_text(json.dumps(results, indent=1))

  header = "| task (dev metric) | epochs, seq | majority class | " + " | ".join(_INITS.value) + " |"
  lines = [header, "|" + "---|" * (3 + len(_INITS.value))]
  for task, by_init in results.items():
    any_summary = next(iter(by_init.values()))
    for rate in any_summary["sweep"]:
      cells = [_cell(summary["sweep"][rate]) for summary in by_init.values()]
      setting = f"{_per_task(_EPOCHS.value, task):g}, {int(_per_task(_SEQ.value, task))}"
      majority = f"{100 * _majority(task):.1f}"
      row = f"| {task} ({any_summary['main_metric']}), lr {rate} | {setting} | {majority} | " + " | ".join(cells)
      lines.append(row + " |")
  seeds = len(any_summary["members"]) // len(any_summary["sweep"])
  print(f"\nDev metric x 100, mean +- std (population) over {seeds} seeds, final evaluation; batch {_BATCH.value}.")
  print("\n".join(lines))
  for task, by_init in results.items():
    for init, summary in by_init.items():
      if "seconds" in summary:
        print(f"{task}/{init}: {summary['seconds']:.0f} s")


if __name__ == "__main__":
  flags.mark_flags_as_required(["glue_dir", "vocab", "workdir"])
  app.run(main)
