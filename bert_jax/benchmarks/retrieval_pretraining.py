"""Does pretraining help retrieval? (issue 62, benchmark 6): contrastive fine-tuning (the embeddings task) from
bert_jax's pretrained encoders and from random weights of the same models, on the SQuAD retrieval set, seeds paired.

    python -m bert_jax.benchmarks.retrieval_pretraining --data_dir=/tmp/squad_retrieval --workdir=/tmp/retrieval_b6 \
        --starts=bert=/tmp/mini/bert,modernbert=/tmp/mini/modernbert \
        --vocab=../shared/data/vocab/bert-base-uncased-vocab.txt --seeds=5

* The starts: `--starts` names pretrained sources (any `pretrained.load` source: a pretraining workdir such as
  `objectives` writes, a bundle, a Hugging Face directory); each is fine-tuned as it is (`pretrained`) and from random
  weights of its model (`random`: `random_start`, with `--vocab`'s WordPiece tokenizer, which must be the one the
  source was pretrained with).
* The data: `--data_dir` as `squad_retrieval` writes it. The runs read `<workdir>/data`, whose dev split is the set's
  test split (`squad_retrieval.held_out_as_dev`): the job's final evaluation of each member is the held-out articles'
  nDCG@10, which no training pair comes from.
* Each run: configs/embeddings.py (MultipleNegativesRankingLoss at scale 20, batches with no text twice, mean pooling,
  normalised) at `--batch_size`, `--learning_rate`, `--epochs`, `--max_seq_length`, one sweep of `--seeds` members
  (seed s draws the training order and the dropout, the same for every start: the seeds pair).

Prints, per start, nDCG@10 (mean +- std over the seeds, each seed) pretrained and random, and a paired t-test.
Writes `<workdir>/results.json`; a finished run is read back, so an interrupted benchmark resumes.
"""

import json
import time

from absl import app, flags, logging
from etils import epath

from bert_jax import jobs
from bert_jax.benchmarks import random_start, squad_retrieval
from configs import embeddings as embeddings_config

_DATA_DIR = flags.DEFINE_string("data_dir", None, "The SQuAD retrieval set (squad_retrieval's output).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Each run's workdir, and results.json, go here.")
_STARTS = flags.DEFINE_list("starts", [], "name=source pairs: the pretrained encoders.")
_VOCAB = flags.DEFINE_string("vocab", None, "The WordPiece vocabulary the sources were pretrained with.")
_LOWER_CASE = flags.DEFINE_bool("lower_case", True, "Whether --vocab is uncased.")
_INITS = flags.DEFINE_list("inits", ["pretrained", "random"], "Which starts of each source to fine-tune.")
_SEEDS = flags.DEFINE_integer("seeds", 5, "Members (seeds) per run.")
_SEED = flags.DEFINE_integer("seed", 0, "The first seed.")
_BATCH = flags.DEFINE_integer("batch_size", 32, "Pairs per batch.")
_LEARNING_RATE = flags.DEFINE_float("learning_rate", 1e-4, "Peak learning rate (10% warmup, linear decay).")
_EPOCHS = flags.DEFINE_float("epochs", 1.0, "Passes over the training pairs.")
_SEQ = flags.DEFINE_integer("max_seq_length", 128, "Tokens per text.")


def _starts() -> dict[str, str]:
  starts = {}
  for item in _STARTS.value:
    name, sep, source = item.partition("=")
    if not sep or not name or not source:
      raise app.UsageError(f"--starts item {item!r}; expected name=source.")
    starts[name] = source
  if not starts:
    raise app.UsageError("--starts is empty; expected name=source pairs, e.g. bert=/tmp/mini/bert.")
  return starts


def _config(data_dir: str, source: str, init: str):
  config = embeddings_config.get_config()
  config.finetune.update(data_dir=data_dir, max_seq_length=_SEQ.value, num_epochs=_EPOCHS.value)
  config.sweep.seeds = _SEEDS.value
  config.update(batch_size=_BATCH.value, learning_rate=_LEARNING_RATE.value, seed=_SEED.value, log_every_steps=10)
  if init == "pretrained":
    config.init_from = source
  else:
    random_start.random_start(config, source, _VOCAB.value, _LOWER_CASE.value)
  return config


def _run(name: str, init: str, source: str, data_dir: str) -> dict:
  """The run's metrics.json (trained now unless finished before), with its seconds."""
  workdir = epath.Path(_WORKDIR.value) / name / init
  done = workdir / "benchmark.json"
  if done.exists():
    return json.loads(done.read_text())
  begin = time.perf_counter()
  summary = jobs.run(_config(data_dir, source, init), str(workdir), "finetune")
  if summary is None:
    raise SystemExit(f"{name}/{init} stopped before its last step: the same command resumes it.")
  summary = dict(summary, seconds=time.perf_counter() - begin)
  done.write_text(json.dumps(summary))
  return summary


def _stats(values) -> str:
  import numpy as np

  return f"{np.mean(values):.4f} +- {np.std(values):.4f}"


def main(argv):
  del argv
  from scipy import stats

  starts = _starts()
  data_dir = squad_retrieval.held_out_as_dev(_DATA_DIR.value, str(epath.Path(_WORKDIR.value) / "data"))
  results = {}
  for name, source in starts.items():
    for init in _INITS.value:
      summary = _run(name, init, source, data_dir)
      results.setdefault(name, {})[init] = dict(
        ndcg=[member["ndcg@10"] for member in summary["final"]["dev"]],
        mrr=[member["mrr@10"] for member in summary["final"]["dev"]],
        recall_100=[member["recall@100"] for member in summary["final"]["dev"]],
        seconds=summary["seconds"],
      )
      logging.info("%s/%s: nDCG@10 %s (%.0f s)", name, init, results[name][init]["ndcg"], summary["seconds"])
  seeds = list(range(_SEED.value, _SEED.value + _SEEDS.value))
  print(f"\nHeld-out nDCG@10 of each seed's final model (seeds {seeds[0]}-{seeds[-1]}), mean +- std (population):")
  print("| start | init | nDCG@10 | seeds | MRR@10 | recall@100 | wall |")
  print("|---|---|---|---|---|---|---|")
  for name, by_init in results.items():
    for init, row in by_init.items():
      each = " ".join(f"{value:.4f}" for value in row["ndcg"])
      print(
        f"| {name} | {init} | {_stats(row['ndcg'])} | {each} | {_stats(row['mrr'])} | {_stats(row['recall_100'])} "
        f"| {row['seconds']:.0f} s |"
      )
  for name, by_init in results.items():
    if {"pretrained", "random"} <= by_init.keys() and len(seeds) > 1:
      test = stats.ttest_rel(by_init["pretrained"]["ndcg"], by_init["random"]["ndcg"])
      gain = sum(by_init["pretrained"]["ndcg"]) / len(seeds) - sum(by_init["random"]["ndcg"]) / len(seeds)
      by_init["paired"] = dict(gain=gain, t=float(test.statistic), p=float(test.pvalue))
      print(f"{name}: pretrained-random = {gain:+.4f} nDCG@10, paired t = {test.statistic:.2f}, p = {test.pvalue:.2g}")
  settings = dict(
    batch_size=_BATCH.value, learning_rate=_LEARNING_RATE.value, epochs=_EPOCHS.value, max_seq_length=_SEQ.value
  )
  (epath.Path(_WORKDIR.value) / "results.json").write_text(json.dumps(dict(results, settings=settings), indent=1))


if __name__ == "__main__":
  flags.mark_flags_as_required(["data_dir", "workdir", "vocab"])
  app.run(main)
