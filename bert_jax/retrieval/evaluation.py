"""Retrieval evaluation (`--mode=retrieve`): a source's metrics on a BEIR-layout set, as BEIR computes them.

The set is read and checked first (`beir.read`: any malformed file refused, naming file:line, before the model is
read); the source is read onto the mesh (`handoff/source_jobs.py`: retrieval.output_dir must be empty or absent);
the judged queries and the corpus (each document's title and text, BEIR's way) are embedded by `Embedder` as
`config.embedding` and the source's recorded settings say (the query and document prompts included); every query
is searched exactly against the whole corpus over the mesh (`search.py`) for its `retrieval.top_k` best
documents; the metrics (`metrics.py`: nDCG@k, MRR@k, MAP@k, recall@k, precision@k at 10 and 100) are logged and
written, with what was evaluated, to `<retrieval.output_dir>/metrics.json`, whole (`paths.write_text`).
"""

import dataclasses
import json
import time

from absl import logging

from bert_jax import paths, progress
from bert_jax.handoff import source_jobs
from bert_jax.model import sentence_embedding
from bert_jax.retrieval import beir, search
from bert_jax.retrieval.embedder import Embedder

SHOWN = ("ndcg@10", "mrr@10", "recall@10", "recall@100", "map@100")
METRICS_FILE = "metrics.json"


def max_seq_length(configured: int, settings: sentence_embedding.Settings, model_longest: int, key: str) -> int:
  """The tokens a text: `configured` (config key `key`, checked against the model), else the source's recorded
  length, else the model's longest."""
  if configured > model_longest:
    raise ValueError(f"{key}={configured} exceeds the model's {model_longest} positions.")
  return configured or min(settings.max_seq_length or model_longest, model_longest)


def source_embedder(config, section: str, job: source_jobs.SourceJob) -> Embedder:
  """The embedder of `job`'s source on its mesh: `config.embedding` over the source's recorded settings,
  `config[section]`'s max_seq_length (0: the source's, else the model's longest) and batch_size."""
  model_cfg = dataclasses.replace(job.loaded.config, dtype=config.model.dtype)
  embedding = sentence_embedding.settings(config.embedding, getattr(job.loaded, "embedding", None))
  configured = config[section].max_seq_length
  seq = max_seq_length(configured, embedding, model_cfg.max_sequence_length, f"{section}.max_seq_length")
  return Embedder(
    model_cfg,
    job.loaded.params["bert"],
    job.loaded.tokenizer,
    embedding,
    seq,
    config[section].batch_size,
    job.mesh,
    config.logical_axis_rules,
  )


def evaluate(config, workdir: str) -> dict:
  """Evaluates `config.retrieval.source` (empty: the workdir's newest checkpoint) on `config.retrieval.data_dir`'s
  split; returns what metrics.json holds (module docstring)."""
  settings = config.retrieval
  data = beir.read(settings.data_dir, settings.split)
  logging.info(
    "Retrieval set %s (%s): %d documents, %d judged queries, %d judgements.",
    settings.data_dir,
    settings.split,
    len(data.corpus),
    len(data.queries),
    sum(len(judged) for judged in data.qrels.values()),
  )
  job = source_jobs.start(config, "retrieval", workdir, lines=False)
  embedder = source_embedder(config, "retrieval", job)
  start = time.perf_counter()
  query_embeddings = embedder.embed(list(data.queries.values()), kind="query", progress_label="queries")
  corpus_embeddings = embedder.embed(
    [data.document_text(doc_id) for doc_id in data.corpus], kind="document", progress_label="corpus"
  )
  embedded = time.perf_counter()
  results = search.retrieval_metrics(query_embeddings, corpus_embeddings, data, settings.top_k, job.mesh, (10, 100))
  searched = time.perf_counter()
  logging.info("%s", "retrieve | " + " ".join(f"{name} {results[name]:.4f}" for name in SHOWN))
  report = dict(
    source=job.loaded.source.path,
    source_format=job.loaded.source.format,
    data_dir=str(settings.data_dir),
    split=settings.split,
    documents=len(data.corpus),
    queries=len(data.queries),
    top_k=settings.top_k,
    max_seq_length=embedder.max_seq_length,
    embedding=dataclasses.asdict(embedder.settings),
    embedding_seconds=round(embedded - start, 3),
    search_seconds=round(searched - embedded, 3),
    metrics=results,
  )
  job.output.mkdir(parents=True, exist_ok=True)
  paths.write_text(job.output / METRICS_FILE, json.dumps(report, indent=2))
  logging.info(
    "Wrote %s (embedding %s, search %s).",
    job.output / METRICS_FILE,
    progress.duration(embedded - start),
    progress.duration(searched - embedded),
  )
  return report
