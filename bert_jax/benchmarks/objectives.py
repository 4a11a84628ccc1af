"""Pretraining objectives at equal compute: BERT (MLM + NSP), RoBERTa's recipe (MLM on FULL-SENTENCES rows), ALBERT
(factorised embeddings, every layer shared, sentence-order prediction) and ELECTRA (a generator's samples, a
discriminator that finds them), one encoder size, one prepared corpus, the same model FLOPs each; then each
pretrained encoder fine-tuned on GLUE with seeds.

    python -m bert_jax.benchmarks.objectives --prepared_dir=/tmp/english_prepared \
        --vocab=../shared/data/vocab/bert-base-uncased-vocab.txt --workdir=/tmp/objectives \
        --glue_dir=../shared/data/glue --seeds=5 --bert_steps=500 --tasks=rte,sst2 --num_epochs=sst2:0.1,default:2

(the run in docs/benchmarks.md, "Pretraining objectives at equal compute": about 4 hours on a 2-core CPU).

Every contestant starts from configs/tiny_english.py (BERT-Tiny, L2 H128, WordPiece; the corpus its docstring
prepares) and changes only what its recipe changes (`CONTESTANTS`). The budget is BERT's model FLOPs per step
(`flops.py`) times `--bert_steps`; a contestant runs as many steps as its own objective's FLOPs per step allow
(ELECTRA counts its generator and its discriminator's every-token head), evaluating its own held-out loss every
tenth of them. Fine-tuning is `finetune_glue` (bert_jax:transformers, the pretrained encoder; for ELECTRA its
discriminator) on each workdir. Everything is resumable: a finished pretraining or fine-tuning is read back.

Writes `<workdir>/objectives.json` (the table's figures), `objectives_curves.csv` (held-out loss against FLOPs)
and `objectives_curves.png`, and prints the table as markdown.
"""

import csv
import json
import math
import os
import subprocess
import sys
import time

from absl import app, flags, logging
from etils import epath

from bert_jax import config_checks
from bert_jax.train import pretraining
from bert_jax.train.objectives import registry
from configs import tiny_english

_PREPARED_DIR = flags.DEFINE_string("prepared_dir", None, "The prepared corpus (configs/tiny_english.py's).")
_VOCAB = flags.DEFINE_string("vocab", None, "The WordPiece vocabulary the corpus was prepared with.")
_WORKDIR = flags.DEFINE_string("workdir", None, "One pretraining workdir per contestant goes here.")
_GLUE_DIR = flags.DEFINE_string("glue_dir", "", "GLUE task directories; empty: pretraining only.")
_CONTESTANTS = flags.DEFINE_list("contestants", ["bert", "roberta", "albert", "electra"], "Who pretrains.")
_BERT_STEPS = flags.DEFINE_integer("bert_steps", 1_500, "The budget: BERT's model FLOPs per step times this.")
_TASKS = flags.DEFINE_list("tasks", ["mrpc", "rte", "cola", "sst2"], "GLUE tasks to fine-tune on.")
_SEEDS = flags.DEFINE_integer("seeds", 5, "Fine-tuning seeds per task.")
_EVALS = flags.DEFINE_integer("evals", 10, "Held-out evaluations per contestant (the curves' points).")
_EPOCHS = flags.DEFINE_string("num_epochs", "sst2:0.25,default:2", "finetune_glue's --num_epochs (task:epochs pairs).")

# What each recipe changes from BERT's (configs/tiny_english.py); the encoder (L2 H128 A2, FFN 512) is the same.
CONTESTANTS = {
  "bert": {},
  "roberta": {"data.instances": "full_sentences"},
  "albert": {
    "model.embedding_size": 64,
    "model.layer_sharing": "all",
    "model.hidden_act": "gelu_new",
    "data.instances": "sop",
  },
  "electra": {
    "objective": "electra",
    "model.model_type": "electra",
    "data.instances": "doc_sentences",
    # ELECTRA's masking: 85% [MASK], 15% kept, no random tokens (the generator makes the replacements).
    "data.mask_token_fraction": 0.85,
    "data.random_token_fraction": 0.0,
  },
}


def contestant_config(name: str, steps: int | None = None):
  """configs/tiny_english.py with the recipe's changes (and `steps` train steps, a tenth of them between evals)."""
  config = tiny_english.get_config()
  config.tokenizer.path = _VOCAB.value
  config.data.prepared_dir = _PREPARED_DIR.value
  for dotted, value in CONTESTANTS[name].items():
    *parents, leaf = dotted.split(".")
    node = config
    for parent in parents:
      node = node[parent]
    node[leaf] = value
  if steps is not None:
    config.num_train_steps = steps
    config.warmup_steps = steps // 10
    config.eval_every_steps = max(steps // _EVALS.value, 1)
    config.checkpoint_every_steps = config.eval_every_steps
  return config


def flops_per_step(config) -> float:
  """The objective's model FLOPs of one train step (what `config.objective` counts; a teacher-free objective)."""
  model_cfg = config_checks.check_pretraining(config)
  return registry.of(config.objective).flops(config, model_cfg, None)


def _read_events(directory: epath.Path) -> dict[str, dict[int, float]]:
  """{tag: {step: value}} from a TensorBoard directory's event files."""
  from bert_jax.tensorflow_cpu import tf

  values: dict[str, dict[int, float]] = {}
  for path in sorted(directory.glob("events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(str(path)):
      for value in event.summary.value:
        values.setdefault(value.tag, {})[event.step] = float(tf.make_ndarray(value.tensor))
  return values


def pretrain(name: str, budget: float) -> dict:
  """The contestant's run (resumed or read back), with its curve and wall time."""
  workdir = epath.Path(_WORKDIR.value) / name
  result_file = workdir / "objective_result.json"
  if result_file.exists():
    return json.loads(result_file.read_text())
  per_step = flops_per_step(contestant_config(name))
  steps = math.floor(budget / per_step)
  config = contestant_config(name, steps)
  logging.info("%s: %d steps of %.3g model FLOPs (budget %.3g).", name, steps, per_step, budget)
  start = time.perf_counter()
  pretraining.pretrain(config, str(workdir))
  seconds = time.perf_counter() - start
  evaluation = _read_events(workdir / "tensorboard" / "eval")
  curve = [
    dict(step=step, model_flops=step * per_step, **{tag: by_step[step] for tag, by_step in evaluation.items()})
    for step in sorted(evaluation["mlm_loss"])
  ]
  result = dict(
    name=name,
    steps=steps,
    flops_per_step=per_step,
    seconds=seconds,
    curve=curve,
    final={tag: by_step[max(by_step)] for tag, by_step in evaluation.items()},
  )
  result_file.write_text(json.dumps(result, indent=1))
  return result


def finetune(name: str) -> dict:
  """finetune_glue's results for the contestant's pretrained encoder (a subprocess: its flags are its own)."""
  glue_workdir = epath.Path(_WORKDIR.value) / name / "glue"
  command = [
    sys.executable,
    "-m",
    "bert_jax.benchmarks.finetune_glue",
    f"--glue_dir={_GLUE_DIR.value}",
    f"--init_from={epath.Path(_WORKDIR.value) / name}",
    f"--vocab={_VOCAB.value}",
    f"--workdir={glue_workdir}",
    f"--tasks={','.join(_TASKS.value)}",
    f"--seeds={_SEEDS.value}",
    f"--num_epochs={_EPOCHS.value}",
    "--contestants=bert_jax:transformers",
    "--inits=pretrained",
  ]
  subprocess.run(command, check=True)
  return json.loads((glue_workdir / "results.json").read_text())


def _plot(results: list[dict], path: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  from matplotlib import pyplot as plt

  figure, (loss_axes, accuracy_axes) = plt.subplots(1, 2, figsize=(11, 4.2))
  for result in results:
    flops = [point["model_flops"] / 1e15 for point in result["curve"]]
    loss_axes.plot(flops, [point["mlm_loss"] for point in result["curve"]], marker="o", label=result["name"])
    accuracy_axes.plot(flops, [point["mlm_accuracy"] for point in result["curve"]], marker="o", label=result["name"])
  for axes, what in ((loss_axes, "held-out MLM loss"), (accuracy_axes, "held-out MLM accuracy")):
    axes.set_xlabel("model FLOPs (PFLOP)")
    axes.set_ylabel(what)
    axes.grid(alpha=0.3)
    axes.legend()
  figure.suptitle("Pretraining objectives at equal compute (L2 H128; ELECTRA's MLM is its generator's)")
  figure.tight_layout()
  figure.savefig(path, dpi=120)


SENTENCE_METRICS = ("nsp_accuracy", "sop_accuracy", "rtd_accuracy")


def main(argv):
  del argv
  unknown = [name for name in _CONTESTANTS.value if name not in CONTESTANTS]
  if unknown:
    raise app.UsageError(f"--contestants: unknown {unknown}; expected some of {sorted(CONTESTANTS)}.")
  budget = flops_per_step(contestant_config("bert")) * _BERT_STEPS.value
  results = [pretrain(name, budget) for name in _CONTESTANTS.value]
  if _GLUE_DIR.value:
    for result in results:
      result["glue"] = finetune(result["name"])
  out = epath.Path(_WORKDIR.value)
  (out / "objectives.json").write_text(json.dumps(dict(budget_flops=budget, results=results), indent=1))
  tags = sorted({tag for result in results for point in result["curve"] for tag in point} - {"step", "model_flops"})
  with open(os.path.join(out, "objectives_curves.csv"), "w", newline="") as handle:
    writer = csv.writer(handle)
    writer.writerow(["objective", "step", "model_flops", *tags])
    for result in results:
      for point in result["curve"]:
        values = [f"{point[tag]:.5f}" if tag in point else "" for tag in tags]
        writer.writerow([result["name"], point["step"], f"{point['model_flops']:.6g}", *values])
  _plot(results, os.path.join(out, "objectives_curves.png"))

  tasks = _TASKS.value if _GLUE_DIR.value else []
  print(f"\nBudget {budget:.3g} model FLOPs ({_BERT_STEPS.value} BERT steps).")
  header = ["objective", "steps", "held-out MLM loss", "MLM accuracy", "its other task", *tasks]
  header += ["GLUE mean"] * bool(tasks) + ["pretraining time"]
  print("| " + " | ".join(header) + " |")
  print("|" + "---|" * len(header))
  for result in results:
    final = result["final"]
    other = ", ".join(f"{tag} {final[tag]:.3f}" for tag in SENTENCE_METRICS if tag in final) or "-"
    whose = " (generator)" if result["name"] == "electra" else ""  # ELECTRA's MLM is its small generator's.
    cells = [result["name"], str(result["steps"]), f"{final['mlm_loss']:.3f}{whose}", f"{final['mlm_accuracy']:.3f}"]
    cells.append(other)
    means = []
    for task in tasks:
      summary = next(iter(result["glue"][task].values()))
      rate = next(iter(summary["sweep"].values()))
      means.append(100 * rate["mean"])
      cells.append(f"{100 * rate['mean']:.1f} +- {100 * rate['std']:.1f}")
    cells += [f"{sum(means) / len(means):.1f}"] * bool(tasks) + [f"{result['seconds'] / 60:.0f} min"]
    print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
  flags.mark_flags_as_required(["prepared_dir", "vocab", "workdir"])
  app.run(main)
