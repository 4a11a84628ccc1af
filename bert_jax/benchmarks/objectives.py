"""Pretraining objectives and recipes at equal compute: BERT (MLM + NSP), RoBERTa's recipe (MLM on FULL-SENTENCES
rows), ALBERT (factorised embeddings, every layer shared, sentence-order prediction), ELECTRA (a generator's samples,
a discriminator that finds them), SpanBERT (span masking and the span-boundary objective) and span masking alone,
BERT at 30% masking, and ModernBERT's architecture with BERT's recipe and with its own (30% masking,
warmup-stable-decay, StableAdamW); one encoder size, one prepared corpus, the same model FLOPs each; then each
pretrained encoder fine-tuned on GLUE with seeds.

    python -m bert_jax.benchmarks.objectives --prepared_dir=/tmp/english_prepared \
        --vocab=../shared/data/vocab/bert-base-uncased-vocab.txt --workdir=/tmp/objectives \
        --glue_dir=../shared/data/glue --seeds=5 --bert_steps=500 --tasks=rte,sst2 --num_epochs=sst2:0.1,default:2

(the run in docs/benchmarks.md, "Pretraining objectives at equal compute": about 4 hours on a 2-core CPU), and the
modern encoders' comparison, "ModernBERT's recipe at equal compute":

    python -m bert_jax.benchmarks.objectives --prepared_dir=/tmp/english_prepared \
        --vocab=../shared/data/vocab/bert-base-uncased-vocab.txt --workdir=/tmp/modern \
        --contestants=bert,bert_mlm30,modernbert_bert_recipe,modernbert --glue_dir=../shared/data/glue --seeds=5 \
        --bert_steps=500 --tasks=sst2,cola,rte --num_epochs=sst2:0.1,default:2

and the same at BERT-Mini's size, where the masked-LM decoder is a smaller part of a step and the random-weight
marks are fine-tuned too:

    python -m bert_jax.benchmarks.objectives --prepared_dir=/tmp/english_prepared \
        --vocab=../shared/data/vocab/bert-base-uncased-vocab.txt --workdir=/tmp/modern_mini --size=mini \
        --learning_rate=5e-4 --random_init --contestants=bert,bert_mlm30,modernbert_bert_recipe,modernbert \
        --glue_dir=../shared/data/glue --seeds=5 --bert_steps=1000 --tasks=sst2,cola,rte

SpanBERT against BERT and against its span masking alone: the first command with its own `--workdir` and
`--contestants=bert,bert_spans,spanbert`.

Every contestant starts from configs/tiny_english.py (WordPiece; the corpus its docstring prepares) at `--size`
(BERT-Tiny, L2 H128 A2, or BERT-Mini, L4 H256 A4) and `--learning_rate`, and changes only what its recipe changes
(`CONTESTANTS`). With `--random_init` the first contestant of each architecture is also fine-tuned from random
weights of its sizes: the mark its pretraining must beat. The budget is BERT's model FLOPs per step
(`flops.py`) times `--bert_steps`; a contestant runs as many steps as its own objective's FLOPs per step allow
(ELECTRA counts its generator and its discriminator's every-token head), evaluating its own held-out loss every
tenth of them. Each contestant is also evaluated on one held-out stream that is the same for all (`common_evaluation`:
the ModernBERT contestants' rows, one document's text per instance packed into rows, masked at 15% with the same
seed), at every checkpoint: a loss that does not depend on the contestant's own masking rate or row format.
Fine-tuning is `finetune_glue` (bert_jax:transformers, the pretrained encoder; for ELECTRA its
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

from absl import app, flags, logging
from etils import epath

from bert_jax import jobs
from bert_jax.model.bert_config import preset
from bert_jax.train import pretraining
from bert_jax.train.objectives import registry
from configs import modernbert_base, spanbert_base, tiny_english

# The encoder sizes a comparison can take (Google's BERT miniatures): L2 H128 A2 and L4 H256 A4.
SIZES = ("tiny", "mini")

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
_SIZE = flags.DEFINE_enum("size", "tiny", list(SIZES), "The encoder's size, every contestant's (a BERT preset).")
_LEARNING_RATE = flags.DEFINE_float("learning_rate", 1e-3, "Every contestant's peak pretraining learning rate.")
_RANDOM_INIT = flags.DEFINE_bool(
  "random_init", False, "Also fine-tune each architecture from random weights (its first contestant's sizes)."
)

# ModernBERT's architecture at the encoder's size (configs/modernbert_base.py's choices): pre-norm LayerNorm without
# biases, no bias in any dense layer, a GeGLU feed-forward 1.5 times the width (`contestant_config`: 192 at H128, as
# base's 1,152 for 768), rotary positions (base 10,000, phase 1's), every third layer global (0, 3, ...) and the
# others local over 32 tokens (16 each side: ModernBERT's 128 of 1,024, scaled to the 128-token rows), no dropout;
# its rows: one document's text per instance, packed, attention within each instance.
MODERNBERT_ARCHITECTURE = {
  "model.model_type": "modernbert",
  "model.layer_norm_eps": 1e-5,
  "model.hidden_act": "gelu",
  "model.norm_bias": False,
  "model.linear_bias": False,
  "model.rope_theta": 10_000.0,
  "model.local_rope_theta": 10_000.0,
  "model.local_attention": 32,
  "model.global_attention_every": 3,
  "model.hidden_dropout_prob": 0.0,
  "model.attention_dropout_prob": 0.0,
  "data.instances": "doc_sentences",
  "data.pack_instances": True,
  "data.short_seq_prob": 0.0,
}
# 30% of tokens masked (80/10/10), evaluated at 15% on the same held-out rows; the masked positions' cap follows.
MASKING_30 = {
  "data.masked_lm_prob": modernbert_base.MASKED_LM_PROB,
  "data.eval_masked_lm_prob": modernbert_base.EVAL_MASKED_LM_PROB,
  "data.max_predictions_per_seq": modernbert_base.max_predictions(tiny_english.get_config().data.max_seq_length),
}
# ModernBERT's recipe beyond the masking (configs/modernbert_base.py): warmup-stable-decay with a 1-sqrt decay over
# the last fifth, StableAdamW with its betas and eps, no gradient clipping; the same peak learning rate and warmup
# as the others, and its fully decoupled weight decay (1e-5 per step at the peak: `contestant_config`).
MODERNBERT_RECIPE = {
  **MASKING_30,
  "lr_schedule": "wsd",
  "lr_decay": "1-sqrt",
  "lr_decay_fraction": 0.2,
  "optimizer": "stable_adamw",
  "adam_b1": 0.9,
  "adam_b2": 0.98,
  "adam_eps": 1e-6,
  "max_grad_norm": float("inf"),
}

# What each recipe changes from BERT's (configs/tiny_english.py); the encoder's size (L2 H128 A2) is the same.
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
  # SpanBERT (configs/spanbert_base.py): spans of whole words masked (geometric p=0.2, up to 10 words), the masked LM
  # beside the span-boundary objective, no sentence task; and the same rows and masking without the span-boundary
  # objective (the paper's "span masking" ablation): what the objective adds at equal compute.
  "spanbert": {"objective": "span_boundary", "data.masking": "spans", "data.instances": "doc_sentences"},
  "bert_spans": {"data.masking": "spans", "data.instances": "doc_sentences"},
  "bert_mlm30": MASKING_30,  # BERT's recipe with 30% masking alone.
  "modernbert_bert_recipe": MODERNBERT_ARCHITECTURE,  # 15% masking, BERT's linear schedule, AdamW; no sentence task.
  "modernbert": {**MODERNBERT_ARCHITECTURE, **MODERNBERT_RECIPE},
}
# The held-out stream every contestant is also evaluated on (`common_evaluation`): the ModernBERT contestants' rows.
COMMON_EVALUATION = "modernbert_bert_recipe"


def contestant_config(name: str, steps: int | None = None):
  """configs/tiny_english.py at `--size` and `--learning_rate`, with the recipe's changes (and `steps` train steps,
  a tenth of them between evals)."""
  config = tiny_english.get_config()
  config.model.update(preset(_SIZE.value))
  config.learning_rate = _LEARNING_RATE.value
  config.tokenizer.path = _VOCAB.value
  config.data.prepared_dir = _PREPARED_DIR.value
  for dotted, value in CONTESTANTS[name].items():
    *parents, leaf = dotted.split(".")
    node = config
    for parent in parents:
      node = node[parent]
    node[leaf] = value
  if config.model.model_type == "modernbert":  # GeGLU's width: 1.5 times the hidden size, as ModernBERT-base's.
    config.model.intermediate_size = 3 * config.model.hidden_size // 2
  if config.objective == "span_boundary":  # SpanBERT's position embedding (200 beside BERT-Base's 768), scaled.
    width = spanbert_base.POSITION_EMBEDDING_SIZE * config.model.hidden_size / preset("base")["hidden_size"]
    config.span_boundary.position_embedding_size = round(width)
  if config.optimizer == "stable_adamw":  # ModernBERT's fully decoupled decay, 1e-5 a step at the peak rate.
    config.weight_decay = modernbert_base.DECOUPLED_WEIGHT_DECAY / config.learning_rate
  if steps is not None:
    config.num_train_steps = steps
    config.warmup_steps = steps // 10
    config.eval_every_steps = max(steps // _EVALS.value, 1)
    config.checkpoint_every_steps = config.eval_every_steps
    config.keep_checkpoints = _EVALS.value + 1  # Every evaluated step, for the common evaluation.
  return config


def flops_per_step(config) -> float:
  """The objective's model FLOPs of one train step (what `config.objective` counts; a teacher-free objective)."""
  model_cfg = jobs.check(config, "pretrain").model
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


def _wall_seconds(directory: epath.Path) -> float:
  """The run's wall time: each of its processes' train events file spans the process's start (the file's creation)
  to its last train metrics; summed, a run killed and resumed counts both processes (and the steps it repeated)."""
  from bert_jax.tensorflow_cpu import tf

  seconds = 0.0
  for path in directory.glob("events.out.tfevents.*"):
    times = [event.wall_time for event in tf.compat.v1.train.summary_iterator(str(path))]
    seconds += max(times) - min(times)
  return seconds


def common_evaluation(name: str, flops_per_step: float) -> list[dict]:
  """The contestant's held-out MLM loss and accuracy at each of its checkpoints, on one stream that is the same for
  every contestant: COMMON_EVALUATION's held-out rows masked at 15% (its config's seed and `eval_steps` batches),
  read by the contestant's own masked-LM head (SpanBERT's: its BERT's, the span-boundary head left in the workdir).
  ELECTRA's checkpoint holds its discriminator, which has none: []."""
  import jax
  import numpy as np

  from bert_jax import progress, sharding
  from bert_jax.data.corpus import Corpus
  from bert_jax.handoff import pretrained
  from bert_jax.workdir import checkpoints

  if CONTESTANTS[name].get("objective", "bert") not in ("bert", "span_boundary"):
    return []
  workdir = epath.Path(_WORKDIR.value) / name
  config = contestant_config(COMMON_EVALUATION)
  curve = []
  for step in checkpoints.committed_steps(checkpoints.checkpoint_dir(str(workdir))):
    loaded = pretrained.load(str(workdir / "checkpoints" / str(step)))
    objective_run = pretraining.make_run(config, model_cfg=loaded.config)
    corpus = Corpus(config, str(workdir), loaded.config, loaded.tokenizer)
    source = corpus.source(0, evaluation=True)
    totals = None
    for _ in range(config.eval_steps):
      batch = sharding.global_batch(next(source), objective_run.mesh)
      metrics = jax.device_get(objective_run.eval_step(loaded.params, batch))
      totals = metrics if totals is None else jax.tree.map(np.add, totals, metrics)
    summary = progress.summarize(totals, config.eval_steps)
    curve.append(dict(step=step, model_flops=step * flops_per_step, **{k: float(v) for k, v in summary.items()}))
    logging.info("%s, step %d, common held-out stream: %s", name, step, curve[-1])
  return curve


def pretrain(name: str, budget: float) -> dict:
  """The contestant's run (resumed or read back), with its curve and wall time."""
  workdir = epath.Path(_WORKDIR.value) / name
  result_file = workdir / "objective_result.json"
  if result_file.exists():
    result = json.loads(result_file.read_text())
    if "common_curve" not in result:  # Pretrained before the common evaluation existed.
      result["common_curve"] = common_evaluation(name, result["flops_per_step"])
      result_file.write_text(json.dumps(result, indent=1))
    return result
  per_step = flops_per_step(contestant_config(name))
  steps = math.floor(budget / per_step)
  config = contestant_config(name, steps)
  logging.info("%s: %d steps of %.3g model FLOPs (budget %.3g).", name, steps, per_step, budget)
  reached = jobs.run(config, str(workdir), "pretrain").host_step()
  if reached < steps:  # Preempted (SIGTERM): a half-trained contestant's result would be read back as its last.
    raise SystemExit(f"{name} stopped at step {reached} of {steps}; nothing written: the same command resumes it.")
  evaluation = _read_events(workdir / "tensorboard" / "eval")
  curve = [
    dict(step=step, model_flops=step * per_step, **{tag: by_step[step] for tag, by_step in evaluation.items()})
    for step in sorted(evaluation["mlm_loss"])
  ]
  result = dict(
    name=name,
    steps=steps,
    flops_per_step=per_step,
    seconds=_wall_seconds(workdir / "tensorboard" / "train"),
    curve=curve,
    common_curve=common_evaluation(name, per_step),
    final={tag: by_step[max(by_step)] for tag, by_step in evaluation.items()},
  )
  result_file.write_text(json.dumps(result, indent=1))
  return result


def random_init_contestants(names: list[str]) -> list[str]:
  """With --random_init, the first contestant of each architecture (BERT's, ModernBERT's): its fine-tuning also runs
  from random weights of its sizes, the mark its pretraining must beat."""
  if not _RANDOM_INIT.value:
    return []
  firsts = {}
  for name in names:
    firsts.setdefault(contestant_config(name).model.model_type, name)
  return list(firsts.values())


def finetune(name: str, random_init: bool) -> dict:
  """finetune_glue's results for the contestant's pretrained encoder, and from random weights of its sizes when
  `random_init` (a subprocess: its flags are its own)."""
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
    f"--inits={'pretrained,random' if random_init else 'pretrained'}",
  ]
  if subprocess.run(command).returncode:  # Its own message says why (a stop: the same command resumes).
    raise SystemExit(f"{name}: fine-tuning ended early ({' '.join(command)}).")
  return json.loads((glue_workdir / "results.json").read_text())


def _plot(results: list[dict], path: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  from matplotlib import pyplot as plt

  figure, (loss_axes, accuracy_axes) = plt.subplots(1, 2, figsize=(11, 4.2))
  for result in results:  # The common stream's curve; ELECTRA's own (its generator's, on its own rows), dashed.
    curve, style, label = result["common_curve"], "-", result["name"]
    if not curve:
      curve, style, label = result["curve"], "--", f"{result['name']} (own rows)"
    flops = [point["model_flops"] / 1e15 for point in curve]
    loss_axes.plot(flops, [point["mlm_loss"] for point in curve], style, marker="o", label=label)
    accuracy_axes.plot(flops, [point["mlm_accuracy"] for point in curve], style, marker="o", label=label)
  for axes, what in ((loss_axes, "held-out MLM loss (15%)"), (accuracy_axes, "held-out MLM accuracy (15%)")):
    axes.set_xlabel("model FLOPs (PFLOP)")
    axes.set_ylabel(what)
    axes.grid(alpha=0.3)
    axes.legend()
  model = preset(_SIZE.value)
  size = f"L{model['num_layers']} H{model['hidden_size']}"
  figure.suptitle(f"Pretraining recipes at equal compute ({size}; one held-out stream for all, masked at 15%)")
  figure.tight_layout()
  figure.savefig(path, dpi=120)


SENTENCE_METRICS = ("nsp_accuracy", "sop_accuracy", "rtd_accuracy", "sbo_accuracy")


def main(argv):
  del argv
  unknown = [name for name in _CONTESTANTS.value if name not in CONTESTANTS]
  if unknown:
    raise app.UsageError(f"--contestants: unknown {unknown}; expected some of {sorted(CONTESTANTS)}.")
  budget = flops_per_step(contestant_config("bert")) * _BERT_STEPS.value
  results = [pretrain(name, budget) for name in _CONTESTANTS.value]
  if _GLUE_DIR.value:
    randoms = random_init_contestants(_CONTESTANTS.value)
    for result in results:
      result["glue"] = finetune(result["name"], result["name"] in randoms)
  out = epath.Path(_WORKDIR.value)
  (out / "objectives.json").write_text(json.dumps(dict(budget_flops=budget, results=results), indent=1))
  curves = ("curve", "common_curve")  # Each contestant's own held-out rows, and the stream common to all.
  points = [point for result in results for kind in curves for point in result[kind]]
  tags = sorted({tag for point in points for tag in point} - {"step", "model_flops"})
  with open(os.path.join(out, "objectives_curves.csv"), "w", newline="") as handle:
    writer = csv.writer(handle)
    writer.writerow(["objective", "evaluation", "step", "model_flops", *tags])
    for result in results:
      for kind in curves:
        for point in result[kind]:
          values = [f"{point[tag]:.5f}" if tag in point else "" for tag in tags]
          where = "own" if kind == "curve" else "common"
          writer.writerow([result["name"], where, point["step"], f"{point['model_flops']:.6g}", *values])
  _plot(results, os.path.join(out, "objectives_curves.png"))

  tasks = _TASKS.value if _GLUE_DIR.value else []
  print(f"\nBudget {budget:.3g} model FLOPs ({_BERT_STEPS.value} BERT steps).")
  header = ["objective", "steps", "own held-out MLM loss", "MLM accuracy", "common held-out MLM loss", "accuracy"]
  header += ["its other task", *tasks]
  header += ["GLUE mean"] * bool(tasks) + ["pretraining time"]
  print("| " + " | ".join(header) + " |")
  print("|" + "---|" * len(header))
  for result in results:
    final = result["final"]
    other = ", ".join(f"{tag} {final[tag]:.3f}" for tag in SENTENCE_METRICS if tag in final) or "-"
    whose = " (generator)" if result["name"] == "electra" else ""  # ELECTRA's MLM is its small generator's.
    cells = [result["name"], str(result["steps"]), f"{final['mlm_loss']:.3f}{whose}", f"{final['mlm_accuracy']:.3f}"]
    common = result["common_curve"][-1] if result["common_curve"] else None
    cells += [f"{common['mlm_loss']:.3f}", f"{common['mlm_accuracy']:.3f}"] if common else ["-", "-"]
    cells.append(other)
    cells += _glue_cells(result, tasks, "pretrained")
    cells.append(f"{result['seconds'] / 60:.0f} min")
    print("| " + " | ".join(cells) + " |")
  for result in results:  # The marks: each architecture fine-tuned from random weights.
    if _fine_tuned_from_random(result, tasks):
      cells = [f"{contestant_config(result['name']).model.model_type}, random weights", *["-"] * 6]
      print("| " + " | ".join(cells + _glue_cells(result, tasks, "random") + ["-"]) + " |")
  _print_paired(results, tasks)


def _fine_tuned_from_random(result: dict, tasks: list[str]) -> bool:
  """Whether the contestant was also fine-tuned from random weights (`random_init_contestants`)."""
  return bool(tasks) and any(name.startswith("random ") for name in result["glue"][tasks[0]])


def _per_seed(result: dict, task: str, init: str) -> list[float]:
  """The dev main metric x 100 of each fine-tuning seed of the contestant's `init` runs, in seed order."""
  summary = next(value for name, value in result["glue"][task].items() if name.startswith(f"{init} "))
  return [100 * member[summary["main_metric"]] for member in next(iter(summary["final"].values()))]


def _paired(ours: list[float], theirs: list[float]) -> str:
  """The mean difference and a paired t-test's two-sided p over the seeds."""
  from scipy import stats

  difference = sum(ours) / len(ours) - sum(theirs) / len(theirs)
  p = stats.ttest_rel(ours, theirs).pvalue if len(ours) > 1 and ours != theirs else float("nan")
  return f"{difference:+.1f} (p = {p:.2g})"


def _print_paired(results: list[dict], tasks: list[str]) -> None:
  """How sure: each contestant against the first (BERT) and against its architecture's random weights, paired by
  fine-tuning seed (the same rows in the same order for every contestant of a seed)."""
  if not tasks:
    return
  random = {}
  for result in results:
    if _fine_tuned_from_random(result, tasks):
      random[contestant_config(result["name"]).model.model_type] = result
  first = results[0]
  print(
    f"\nPaired by seed, dev metric x 100: the mean difference (paired t-test p) against {first['name']} and "
    "against random weights of the same architecture."
  )
  print("| contestant | " + " | ".join(f"{task}: vs {first['name']} | {task}: vs random" for task in tasks) + " |")
  print("|---|" + "---|---|" * len(tasks))
  for result in results:
    mark = random.get(contestant_config(result["name"]).model.model_type)
    cells = []
    for task in tasks:
      ours = _per_seed(result, task, "pretrained")
      cells.append("-" if result is first else _paired(ours, _per_seed(first, task, "pretrained")))
      cells.append("-" if mark is None else _paired(ours, _per_seed(mark, task, "random")))
    print(f"| {result['name']} | " + " | ".join(cells) + " |")


def _glue_cells(result: dict, tasks: list[str], init: str) -> list[str]:
  """Per task the dev metric's mean +- std over the seeds (x 100) of the contestant's `init` runs, then their mean."""
  cells, means = [], []
  for task in tasks:
    summary = next(value for name, value in result["glue"][task].items() if name.startswith(f"{init} "))
    rate = next(iter(summary["sweep"].values()))
    means.append(100 * rate["mean"])
    cells.append(f"{100 * rate['mean']:.1f} +- {100 * rate['std']:.1f}")
  return cells + ([f"{sum(means) / len(means):.1f}"] if means else [])


if __name__ == "__main__":
  flags.mark_flags_as_required(["prepared_dir", "vocab", "workdir"])
  app.run(main)
