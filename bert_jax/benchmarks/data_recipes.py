"""The data recipes of 2026 at equal compute (docs/benchmarks.md, "Data recipes"): two sources drawn by size (one
corpus in all but name), against a two-phase mixture, against a masking rate that decays within the run; then, for
each, the mean of its last checkpoints of the learning-rate decay (`--mode=merge`) against its final one.

    python -m bert_jax.benchmarks.data_recipes --workdir=/tmp/data_recipes \\
        --wiki='../shared/data/pretrain/wikitext-2/*' \\
        --books='../shared/data/pretrain/gutenberg/*.txt' \\
        --vocab=../shared/data/vocab/bert-base-uncased-vocab.txt

The sources: WikiText-2's test and validation articles and Gutenberg's books, a paragraph a document in both (BERT's
format: the books' 11 files would leave one document for evaluation), prepared once each with Google's uncased WordPiece
vocabulary. Every contestant is BERT-Mini (L4 H256 A4) trained on FULL-SENTENCES rows of 128 tokens, `--steps` steps of
`--batch_size`, the same seed, learning rate and warmup-stable-decay schedule (1-sqrt decay over the last
`--decay_fraction` of the steps, a checkpoint every `--checkpoint_every` steps), and changes only its data schedule
(`contestants`). Every model, each final checkpoint and each merged bundle alike, is scored on one held-out stream: both
sources' held-out splits drawn by size, masked at 15%, the same rows for all (`held_out`).

Writes `<workdir>/data_recipes.json` and prints the table as markdown. Resumable: a finished contestant is read back.
"""

import json

from absl import app, flags, logging
from etils import epath

from bert_jax import jobs
from bert_jax.model.bert_config import preset
from configs import tiny_english

_WORKDIR = flags.DEFINE_string("workdir", None, "Prepared sources and one workdir per contestant go here.")
_WIKI = flags.DEFINE_string("wiki", None, "Glob of WikiText-2's files (BERT's format).")
_BOOKS = flags.DEFINE_string("books", None, "Glob of the books (BERT's format).")
_VOCAB = flags.DEFINE_string("vocab", None, "A WordPiece vocabulary (uncased).")
_STEPS = flags.DEFINE_integer("steps", 600, "Steps of every contestant.")
_BATCH = flags.DEFINE_integer("batch_size", 32, "Rows per step.")
_DECAY = flags.DEFINE_float("decay_fraction", 0.2, "The learning-rate decay's share of the steps.")
_EVERY = flags.DEFINE_integer("checkpoint_every", 30, "Steps between checkpoints.")
_MERGED = flags.DEFINE_integer("merge_last", 4, "Checkpoints of the decay averaged (merge.last).")
_EVAL_STEPS = flags.DEFINE_integer("eval_steps", 20, "Held-out batches each model is scored on.")
_PROBE = flags.DEFINE_string(
  "retrieval_set", "", "A BEIR-layout set (squad_retrieval's) each model is also probed on (test split); empty: none."
)
_PROBE_QUERIES = flags.DEFINE_integer("probe_queries", 0, "The probe's first this many test queries (0: all).")


def contestants(steps: int) -> dict[str, dict]:
  """Each contestant's data keys: what its schedule changes."""
  half = steps // 2
  return {
    "by_size": dict(mixture_phases="0: tau=1"),
    "two_phase": dict(mixture_phases=f"0: tau=1; {half}: wiki=3,books=1"),
    "mask_decay": dict(mixture_phases="0: tau=1", masked_lm_prob=0.3, masking_phases="0: 0.3->0.15"),
  }


def prepared(name: str, pattern: str, input_format: str) -> str:
  """A source prepared under the workdir (kept when prepared already)."""
  config = base_config("")
  config.data.update(input_pattern=pattern, input_format=input_format, prepared_dir=f"{_WORKDIR.value}/{name}")
  config.data.update(mixture_sources="", eval_fraction=0.05)
  jobs.run(config, f"{_WORKDIR.value}/prepare_{name}", "prepare")
  return config.data.prepared_dir


def base_config(sources: str):
  config = tiny_english.get_config()
  config.model.update(preset("mini"))
  config.tokenizer.path = _VOCAB.value
  config.data.update(instances="full_sentences", mixture_sources=sources, num_readers=1, shuffle_buffer=2_000)
  config.data.update(eval_masked_lm_prob=0.15, max_predictions_per_seq=40)
  config.update(batch_size=_BATCH.value, num_train_steps=_STEPS.value, warmup_steps=_STEPS.value // 10)
  config.update(learning_rate=5e-4, lr_schedule="wsd", lr_decay="1-sqrt", lr_decay_fraction=_DECAY.value)
  config.update(checkpoint_every_steps=_EVERY.value, keep_checkpoints=_MERGED.value + 1, log_every_steps=50)
  config.update(eval_every_steps=_STEPS.value, eval_steps=_EVAL_STEPS.value)
  return config


def held_out(config, path: str) -> dict:
  """The model at `path` (a checkpoint or bundle) scored on the common held-out stream: `config`'s evaluation rows
  (both sources' held-out splits by size, masked at 15%), `eval_steps` batches; with `--retrieval_set`, also the
  pretraining retrieval probe's metrics (mean-pooled, normalised embeddings, untrained for retrieval)."""
  import jax
  import numpy as np

  from bert_jax import progress, sharding
  from bert_jax.data.corpus import Corpus
  from bert_jax.handoff import pretrained
  from bert_jax.train import pretraining
  from bert_jax.train.retrieval_probe import RetrievalProbe

  loaded = pretrained.load(path)
  run = pretraining.make_run(config, model_cfg=loaded.config)
  source = Corpus(config, _WORKDIR.value, loaded.config, loaded.tokenizer).source(0, evaluation=True)
  totals = None
  for _ in range(config.eval_steps):
    batch = next(source)
    batch.pop("source", None)
    metrics = jax.device_get(run.eval_step(loaded.params, sharding.global_batch(batch, run.mesh)))
    totals = metrics if totals is None else jax.tree.map(np.add, totals, metrics)
  summary = progress.summarize(totals, config.eval_steps)
  scores = {name: float(summary[name]) for name in ("mlm_loss", "mlm_accuracy")}
  if _PROBE.value:
    config.retrieval_probe.update(data_dir=_PROBE.value, split="test", max_queries=_PROBE_QUERIES.value)
    probe = RetrievalProbe.of(config, run, loaded.config, loaded.tokenizer)
    scores.update({name: float(value) for name, value in probe.measure(loaded.params).items()})
  return scores


def _merged(name: str) -> epath.Path:
  """Where contestant `name`'s merged bundle goes: beside its workdir (a bundle never goes inside its source)."""
  return epath.Path(_WORKDIR.value) / f"{name}_merged"


def run_contestant(name: str, keys: dict, sources: str) -> dict:
  workdir = epath.Path(_WORKDIR.value) / name
  result_file = workdir / "data_recipe.json"
  if result_file.exists():
    result = json.loads(result_file.read_text())
    if _PROBE.value and "retrieval_ndcg@10" not in result["final"]:  # Scored before the probe was asked for.
      scoring = base_config(sources)
      for which in ("final", "merged"):
        path = workdir / "checkpoints" / str(_STEPS.value) if which == "final" else _merged(name)
        result[which] = held_out(scoring, str(path))
      result_file.write_text(json.dumps(result, indent=1))
    return result
  config = base_config(sources)
  config.data.update(keys)
  jobs.run(config, str(workdir), "pretrain")
  final = workdir / "checkpoints" / str(_STEPS.value)
  merged = _merged(name)
  if not merged.exists():
    config.merge.update(last=_MERGED.value, output_dir=str(merged))
    jobs.run(config, str(workdir), "merge")
  scoring = base_config(sources)  # The common stream: the by-size contestant's evaluation, 15%.
  result = dict(keys=keys, final=held_out(scoring, str(final)), merged=held_out(scoring, str(merged)))
  result_file.write_text(json.dumps(result, indent=1))
  logging.info("%s: %s", name, result)
  return result


def main(argv):
  del argv
  sources = f"wiki={prepared('wiki', _WIKI.value, 'bert')},books={prepared('books', _BOOKS.value, 'bert')}"
  results = {name: run_contestant(name, keys, sources) for name, keys in contestants(_STEPS.value).items()}
  (epath.Path(_WORKDIR.value) / "data_recipes.json").write_text(json.dumps(results, indent=1))
  print(f"| contestant | schedule | held-out MLM loss (accuracy), final | of the last {_MERGED.value} merged |", end="")
  print(" probe nDCG@10, final | merged |" if _PROBE.value else "")
  print("|---|---|---|---|" + ("---|---|" if _PROBE.value else ""))
  for name, result in results.items():
    schedule = "; ".join(f"{key}={value}" for key, value in result["keys"].items())
    final, merged = result["final"], result["merged"]
    row = f"| {name} | `{schedule}` | {final['mlm_loss']:.4f} ({final['mlm_accuracy']:.4f}) | "
    row += f"{merged['mlm_loss']:.4f} ({merged['mlm_accuracy']:.4f}) |"
    if _PROBE.value:
      row += f" {final['retrieval_ndcg@10']:.4f} | {merged['retrieval_ndcg@10']:.4f} |"
    print(row)


if __name__ == "__main__":
  app.run(main)
