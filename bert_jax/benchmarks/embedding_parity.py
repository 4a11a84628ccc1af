"""Parity of the embeddings task (`finetune.task="embeddings"`) with sentence-transformers' training (issue 62,
benchmark 2): the same start, pairs, batches, learning rate, schedule and steps on both sides.

    python -m bert_jax.benchmarks.embedding_parity --init_from=/tmp/bert_tiny_parity_step100_st \
        --data_dir=/tmp/squad_retrieval --workdir=/tmp/embedding_parity --seeds=5 --learning_rate=3e-4

(docs/benchmarks.md "Embeddings: parity with sentence-transformers": how that start was made, and the figures.)

* The start: `--init_from` (any `pretrained.load` source) exported once as a sentence-transformers directory
  (`<workdir>/start`), which bert_jax fine-tunes from (`init_from`) and `SentenceTransformer` loads.
* The data: `--data_dir` in the embeddings task's layout (`bert_jax/benchmarks/squad_retrieval.py` writes one:
  train.jsonl pairs, corpus.jsonl, queries.jsonl, qrels/dev.tsv and qrels/test.tsv). The runs read
  `<workdir>/data`, links to it whose qrels/dev.tsv is its test split, so that the job's end-of-epoch evaluation
  of every member is the test nDCG@10 (the held-out articles) of its final model.
* bert_jax: the job through `jobs.run` (configs/embeddings.py, `--batch_size`, `--learning_rate`, `--epochs`,
  `--max_seq_length`; per-step losses from its TensorBoard events, `log_every_steps=1`).
* sentence-transformers: `SentenceTransformer(<workdir>/start)` (float32, eager attention) and
  `MultipleNegativesRankingLoss(scale=20)` in a plain torch loop, on the rows bert_jax's member of the same seed
  trains on at each step (`pairs.NoDuplicateBatches.step(step, seed)`, weight-0 padding rows dropped), as bert_jax
  tokenized them (each batch cut to its longest row, as sentence-transformers' collator pads), with bert_jax's
  AdamW, weight-decay mask, clipping and schedule (`torch_reference.make_optimizer`), dropout from
  `torch.manual_seed(seed)`. Its final model embeds the test queries and corpus with its own `encode` (its own
  tokenizer), scored by bert_jax's metrics (`search.retrieval_metrics`), so only the training differs.

Two comparisons: dropout off (one member each side): the first `--compared_steps` losses, max |difference| (goal
< 1e-5); dropout on (`--dropout`, `--seeds` members each side): test nDCG@10 per seed, means, stds and a paired
t-test. Results go to `<workdir>/results.json`; finished runs are read back, so an interrupted benchmark resumes.
Imports torch and sentence-transformers: run by hand, never by tests.
"""

import json
import os
import time

os.environ.setdefault("USE_TF", "0")  # sentence-transformers beside TensorFlow: transformers without its TF part.

import numpy as np
from absl import app, flags, logging
from etils import epath

from bert_jax import jobs
from bert_jax.benchmarks import squad_retrieval
from bert_jax.finetune import plan
from bert_jax.finetune.contrastive import Contrastive
from bert_jax.finetune.embeddings import Embeddings, run_settings
from bert_jax.handoff import export, pretrained
from bert_jax.retrieval import beir, search
from configs import embeddings as embeddings_config

_INIT_FROM = flags.DEFINE_string("init_from", None, "The start: any source pretrained.load reads.")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "The pairs and the BEIR-layout set (qrels/test.tsv: held out).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Where the export, the runs and results.json go.")
_SEEDS = flags.DEFINE_integer("seeds", 5, "Seeds (members) per side with dropout: seed .. seed + seeds - 1.")
_SEED = flags.DEFINE_integer("seed", 0, "The first seed.")
_BATCH = flags.DEFINE_integer("batch_size", 32, "Pairs per batch.")
_LEARNING_RATE = flags.DEFINE_float("learning_rate", 1e-4, "Peak learning rate (10% warmup, linear decay).")
_EPOCHS = flags.DEFINE_float("epochs", 1.0, "Passes over the pairs.")
_SEQ = flags.DEFINE_integer("max_seq_length", 128, "Tokens per text.")
_DROPOUT = flags.DEFINE_float("dropout", 0.1, "Hidden and attention dropout of the runs with dropout.")
_COMPARED = flags.DEFINE_integer("compared_steps", 20, "Steps whose losses are compared with dropout off.")
_PAD_FULL = flags.DEFINE_bool(
  "pad_full",
  False,
  "sentence-transformers' batches padded to --max_seq_length instead of cut to their longest row: the same "
  "computation in exact arithmetic, so its losses against the cut run's measure float32's own drift "
  "(its runs go to <workdir>/*_padded).",
)
_GOAL = 1e-5  # The bound on |loss difference| with dropout off.


def _config(data_dir: str, start: str, dropout: float, seeds: int):
  config = embeddings_config.get_config()
  config.init_from = start
  config.finetune.update(data_dir=data_dir, max_seq_length=_SEQ.value, num_epochs=_EPOCHS.value)
  config.model.update(hidden_dropout_prob=dropout, attention_dropout_prob=dropout)
  config.sweep.seeds = seeds
  config.update(batch_size=_BATCH.value, learning_rate=_LEARNING_RATE.value, seed=_SEED.value, log_every_steps=1)
  return config


def _start() -> str:
  directory = epath.Path(_WORKDIR.value) / "start"
  if not (directory / "modules.json").exists():
    export.export(_INIT_FROM.value, str(directory), format="sentence-transformers")
  return str(directory)


def _train_losses(workdir: str) -> dict[int, float]:
  """{step: the training loss the job wrote to TensorBoard}."""
  from bert_jax.tensorflow_cpu import tf

  losses = {}
  for path in sorted(epath.Path(workdir, "tensorboard", "train").glob("events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(str(path)):
      for value in event.summary.value:
        if value.tag == "loss":
          losses[event.step] = float(tf.make_ndarray(value.tensor))
  return losses


def _bert_jax(name: str, config) -> dict:
  """The job's metrics.json of run `name` (trained now unless finished before), with its losses and seconds."""
  workdir = epath.Path(_WORKDIR.value) / name
  done = workdir / "parity.json"
  if done.exists():
    return json.loads(done.read_text())
  start = time.perf_counter()
  summary = jobs.run(config, str(workdir), "finetune")
  if summary is None:
    raise SystemExit(f"{name} stopped before its last step: the same command resumes it.")
  losses = {str(step): loss for step, loss in _train_losses(str(workdir)).items()}  # As JSON reads them back.
  summary = dict(summary, seconds=time.perf_counter() - start, losses=losses)
  done.write_text(json.dumps(summary))
  return summary


def _sentence_transformers(name: str, config, seed: int, dropout: float, steps: int | None) -> dict:
  """sentence-transformers' training of member `seed` (see the module docstring): its per-step losses, and, when
  it runs every step (`steps` None), its test metrics."""
  import torch
  from sentence_transformers import SentenceTransformer
  from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

  from bert_jax.benchmarks import torch_reference

  name += "_padded" if _PAD_FULL.value else ""
  done = epath.Path(_WORKDIR.value) / name / f"seed_{seed}.json"
  if done.exists():
    return json.loads(done.read_text())
  begin = time.perf_counter()
  loaded = pretrained.load(config.init_from)
  settings = run_settings(config.finetune, config.embedding, getattr(loaded, "embedding", None))
  task = Embeddings(config.finetune.data_dir, Contrastive.from_config(config.contrastive), settings)
  train = task.encode(task.read(task.train_split), loaded.tokenizer, config.finetune.max_seq_length)
  run_plan = plan.make_plan(config, (), loaded, train.num_rows)
  hp = torch_reference.Hyperparameters.of(config, run_plan.steps)
  batches = task.batches(train, config.batch_size)
  rates = dict(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
  model = SentenceTransformer(
    config.init_from, device="cpu", config_kwargs=rates, model_kwargs=dict(attn_implementation="eager")
  )
  model.max_seq_length = config.finetune.max_seq_length
  loss_fn = MultipleNegativesRankingLoss(model, scale=config.contrastive.scale)
  torch.manual_seed(seed)
  optimizer, scheduler = torch_reference.make_optimizer(model, hp)
  model.train(dropout > 0)
  features = train.features

  def inputs(column: str, rows: np.ndarray) -> dict:
    mask = features[f"{column}_input_mask"][rows]
    width = mask.shape[1] if _PAD_FULL.value else int(mask.sum(axis=1).max())
    return dict(
      input_ids=torch.from_numpy(features[f"{column}_input_ids"][rows, :width]).long(),
      attention_mask=torch.from_numpy(mask[:, :width]).long(),
      token_type_ids=torch.from_numpy(features[f"{column}_segment_ids"][rows, :width]).long(),
    )

  losses = []
  for step in range(1, (steps or run_plan.steps.end_step) + 1):
    rows, weight = batches.step(step, seed)
    rows = rows[weight > 0]
    loss = loss_fn([inputs("query", rows), inputs("document", rows)], None)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), hp.max_grad_norm)
    optimizer.step()
    scheduler.step()
    losses.append(loss.item())
  result = dict(losses=losses, train_seconds=time.perf_counter() - begin)
  if steps is None:
    result["test"] = _st_metrics(model, config.finetune.data_dir, settings)
  result["seconds"] = time.perf_counter() - begin
  done.parent.mkdir(parents=True, exist_ok=True)
  done.write_text(json.dumps(result))
  return result


def _st_metrics(model, data_dir: str, settings) -> dict:
  """bert_jax's retrieval metrics of `model`'s own `encode` of the set's judged queries and its corpus."""
  model.eval()
  data = beir.read(data_dir, "dev")  # <workdir>/data's dev split: --data_dir's test split.
  documents = [settings.document_prompt + data.document_text(doc) for doc in data.corpus]
  queries = [settings.query_prompt + data.queries[query] for query in data.queries]
  corpus = model.encode(documents, batch_size=64, convert_to_numpy=True, normalize_embeddings=False)
  queries = model.encode(queries, batch_size=64, convert_to_numpy=True, normalize_embeddings=False)
  return search.retrieval_metrics(np.asarray(queries, np.float32), np.asarray(corpus, np.float32), data, k=100)


def _stats(values) -> str:
  return f"{np.mean(values):.4f} +- {np.std(values):.4f}"


def main(argv):
  del argv
  for flag in (_INIT_FROM, _DATA_DIR, _WORKDIR):
    if not flag.value:
      raise app.UsageError(f"--{flag.name} is needed.")
  if _SEEDS.value < 2:
    raise app.UsageError(f"--seeds={_SEEDS.value}: a paired t-test needs at least 2 seeds.")
  from scipy import stats

  data_dir, start = squad_retrieval.held_out_as_dev(_DATA_DIR.value, str(epath.Path(_WORKDIR.value) / "data")), _start()
  seeds = list(range(_SEED.value, _SEED.value + _SEEDS.value))

  # Dropout off: one member each side, the first --compared_steps losses.
  off = _config(data_dir, start, 0.0, 1)
  jax_off = _bert_jax("bert_jax_no_dropout", off)
  st_off = _sentence_transformers("st_no_dropout", off, _SEED.value, 0.0, _COMPARED.value)
  jax_losses = np.array([jax_off["losses"][str(s)] for s in range(1, _COMPARED.value + 1)], np.float64)
  st_losses = np.array(st_off["losses"], np.float64)
  diff = np.abs(jax_losses - st_losses)

  # Dropout on: --seeds members each side, test nDCG@10 of each final model.
  on = _config(data_dir, start, _DROPOUT.value, _SEEDS.value)
  jax_on = _bert_jax("bert_jax_dropout", on)
  jax_ndcg = [member["ndcg@10"] for member in jax_on["final"]["dev"]]
  st_on = [_sentence_transformers("st_dropout", on, seed, _DROPOUT.value, None) for seed in seeds]
  st_ndcg = [run["test"]["ndcg@10"] for run in st_on]
  test = stats.ttest_rel(jax_ndcg, st_ndcg)

  results = dict(
    no_dropout=dict(
      bert_jax=jax_losses.tolist(),
      sentence_transformers=st_losses.tolist(),
      max_abs_diff=float(diff.max()),
      goal=_GOAL,
      met=bool(diff.max() < _GOAL),
    ),
    dropout=dict(
      seeds=seeds,
      bert_jax=jax_ndcg,
      sentence_transformers=st_ndcg,
      t=float(test.statistic),
      p=float(test.pvalue),
      bert_jax_seconds=jax_on["seconds"],
      sentence_transformers_seconds=[run["seconds"] for run in st_on],
    ),
    steps=len(jax_on["losses"]),
  )
  (epath.Path(_WORKDIR.value) / "results.json").write_text(json.dumps(results, indent=1))
  print(f"\nDropout off, steps 1..{_COMPARED.value}: step | bert_jax | sentence-transformers | |diff|")
  for step, (a, b) in enumerate(zip(jax_losses, st_losses, strict=True), start=1):
    print(f"{step:4d} | {a:.7f} | {b:.7f} | {abs(a - b):.2e}")
  print(f"max |diff| {diff.max():.2e} (goal < {_GOAL:g}: {'met' if diff.max() < _GOAL else 'NOT met'})")
  print(f"\nDropout {_DROPOUT.value}, test nDCG@10 of each seed's final model ({results['steps']} steps):")
  print("| seed | bert_jax | sentence-transformers |\n|---|---|---|")
  for seed, a, b in zip(seeds, jax_ndcg, st_ndcg, strict=True):
    print(f"| {seed} | {a:.4f} | {b:.4f} |")
  print(f"| mean +- std | {_stats(jax_ndcg)} | {_stats(st_ndcg)} |")
  print(f"paired t-test: t = {test.statistic:.3f}, p = {test.pvalue:.3f}")
  print(
    f"seconds: bert_jax {jax_off['seconds']:.0f} (no dropout, 1 member) + {jax_on['seconds']:.0f} ({len(seeds)} "
    f"members in one program); sentence-transformers {st_off['seconds']:.0f} ({_COMPARED.value} steps) + "
    f"{sum(results['dropout']['sentence_transformers_seconds']):.0f} ({len(seeds)} runs)"
  )
  logging.info("Results in %s.", epath.Path(_WORKDIR.value) / "results.json")


if __name__ == "__main__":
  app.run(main)
