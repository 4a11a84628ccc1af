"""Hard-negative mining (`--mode=mine`): a pairs file's (anchor, positive) pairs given hard negatives from a source's
embeddings, as sentence-transformers' `mine_hard_negatives` picks them (`retrieval/mining.py`), written as a pairs
file the embeddings task reads (`pairs.py`: anchor, positive, negative_1 ... negative_n).

The pairs (`pairs.read_pairs`) and the corpus (`mine.corpus_file`, a BEIR corpus.jsonl: each document's title and
text, BEIR's way) are read and checked, and the mining settings against the most positives an anchor has, before
the source is read (`handoff/source_jobs.py`: mine.output_dir must be empty or absent). The anchors are embedded as
queries and the corpus as documents (their prompts), exact search runs over the mesh, and
`<mine.output_dir>/negatives.jsonl` (one JSON object a pair that got its negatives) and `mining.json` (what was
mined from what, and how many pairs got no row) are written, each whole.
"""

import json
import time

from absl import logging
from etils import epath

from bert_jax import paths, progress
from bert_jax.finetune import pairs
from bert_jax.handoff import source_jobs
from bert_jax.retrieval import beir, evaluation, mining

NEGATIVES_FILE = "negatives.jsonl"
REPORT_FILE = "mining.json"


def settings_of(config) -> mining.MiningSettings:
  """`config.mine`'s mining settings."""
  settings = config.mine
  return mining.MiningSettings(
    num_negatives=settings.num_negatives,
    range_min=settings.range_min,
    range_max=settings.range_max,
    absolute_margin=settings.absolute_margin,
    relative_margin=settings.relative_margin,
    max_score=settings.max_score,
    min_score=settings.min_score,
  )


def mine(config, workdir: str) -> dict:
  """Mines `config.mine.pairs_file`'s negatives with `config.mine.source` (empty: the workdir's newest checkpoint);
  returns what mining.json holds (module docstring)."""
  settings = config.mine
  read = pairs.read_pairs(settings.pairs_file, 0)
  anchors, positives = [pair.anchor for pair in read], [pair.positive for pair in read]
  corpus = None
  if settings.corpus_file:
    corpus = [beir.document_text(document) for document in beir.read_corpus(epath.Path(settings.corpus_file)).values()]
  found = mining.texts(anchors, positives, corpus)
  chosen = settings_of(config)
  positives_of: dict[str, set[str]] = {}
  for anchor, positive in zip(anchors, positives, strict=True):
    positives_of.setdefault(anchor, set()).add(positive)
  max_positives = max(len(texts) for texts in positives_of.values())
  mining.check(chosen, max_positives)
  logging.info(
    "Mining %d negatives for %d pairs (%d anchors) from %d documents.",
    chosen.num_negatives,
    len(read),
    len(found.anchors),
    len(found.corpus),
  )
  job = source_jobs.start(config, "mine", workdir, lines=False)
  embedder = evaluation.source_embedder(config, "mine", job)
  start = time.perf_counter()
  anchor_embeddings = embedder.embed(found.anchors, kind="query", progress_label="anchors")
  corpus_embeddings = embedder.embed(found.corpus, kind="document", progress_label="corpus")
  rows = mining.mine(anchors, positives, found, anchor_embeddings, corpus_embeddings, chosen, job.mesh)
  job.output.mkdir(parents=True, exist_ok=True)
  paths.write_text(job.output / NEGATIVES_FILE, "".join(json.dumps(row) + "\n" for row in rows))
  report = dict(
    source=job.loaded.source.path,
    pairs_file=str(settings.pairs_file),
    corpus_file=str(settings.corpus_file),
    pairs=len(read),
    anchors=len(found.anchors),
    documents=len(found.corpus),
    rows=len(rows),
    settings=dict(
      num_negatives=chosen.num_negatives,
      range_min=chosen.range_min,
      range_max=mining.range_max(chosen, max_positives),
      absolute_margin=chosen.absolute_margin,
      relative_margin=chosen.relative_margin,
      max_score=chosen.max_score,
      min_score=chosen.min_score,
    ),
    seconds=round(time.perf_counter() - start, 3),
  )
  paths.write_text(job.output / REPORT_FILE, json.dumps(report, indent=2))
  logging.info(
    "Wrote %d rows (of %d pairs; a pair with fewer than %d negatives left gets none) to %s in %s.",
    len(rows),
    len(read),
    chosen.num_negatives,
    job.output / NEGATIVES_FILE,
    progress.duration(report["seconds"]),
  )
  return report
