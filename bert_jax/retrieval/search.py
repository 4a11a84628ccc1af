"""Exact dense retrieval over the mesh: every query scored against every document by dot product (cosine similarity
for normalised embeddings), the corpus split over all the mesh's devices, each device's top k merged into the top k
(`top_k`); and a BEIR set's metrics from its embedded queries and corpus (`retrieval_metrics`).

Ties are broken deterministically: equal scores rank by corpus row, the lower first (`jax.lax.top_k`'s rule, kept
by the merge, since the shards hold consecutive rows in order). `retrieval_metrics` puts the corpus in descending
document id order before searching, so that the documents kept at the k-th place are the ones trec_eval's ranking
(score, then document id, descending; `metrics.py`) would keep.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bert_jax import sharding
from bert_jax.retrieval import metrics
from bert_jax.retrieval.beir import BeirSet

# Queries scored at a time: [QUERY_BATCH, corpus rows a device] float32 scores live on each device at once ...
QUERY_BATCH = 256
# ... fewer where the corpus is large: at most this many scores a device (512 MiB of float32).
SCORES_PER_DEVICE = 1 << 27


def _check_embeddings(name: str, array: np.ndarray, dim: int | None = None) -> None:
  if array.ndim != 2 or array.shape[0] == 0:
    raise ValueError(f"{name} has shape {array.shape}; expected [rows, dim] with at least one row.")
  if dim is not None and array.shape[1] != dim:
    raise ValueError(f"{name} has dimension {array.shape[1]}; the queries have {dim}.")
  finite = np.isfinite(array).all(axis=1)
  if not finite.all():
    raise ValueError(f"{name} row {int(np.argmin(finite))} is not finite (NaN or inf); expected finite embeddings.")


@functools.lru_cache(maxsize=8)
def _search_fn(mesh: Mesh, k: int, shard_k: int, rows_per_shard: int, corpus_rows: int):
  """The jitted search of one query batch against a corpus sharded over every axis of `mesh`."""
  axes = tuple(mesh.axis_names)

  def per_shard(queries, corpus):  # [batch, dim] replicated, [rows_per_shard, dim] this device's rows
    first_row = jax.lax.axis_index(axes) * rows_per_shard
    scores = jnp.dot(queries, corpus.T, precision=jax.lax.Precision.HIGHEST)  # [batch, rows_per_shard]
    rows = first_row + jnp.arange(rows_per_shard)
    scores = jnp.where(rows[None, :] < corpus_rows, scores, -jnp.inf)  # the padding rows never rank
    best, local = jax.lax.top_k(scores, shard_k)
    return best, (first_row + local).astype(jnp.int32)

  search_shards = jax.shard_map(
    per_shard,
    mesh=mesh,
    in_specs=(PartitionSpec(), PartitionSpec(axes, None)),
    out_specs=(PartitionSpec(None, axes), PartitionSpec(None, axes)),
    check_vma=False,
  )

  def search(queries, corpus):
    candidates, rows = search_shards(queries, corpus)  # [batch, devices * shard_k], shards in row order
    best, position = jax.lax.top_k(candidates, k)
    return best, jnp.take_along_axis(rows, position, axis=1)

  return jax.jit(search, out_shardings=NamedSharding(mesh, PartitionSpec()))


def top_k(
  queries: np.ndarray, corpus: np.ndarray, k: int, mesh: Mesh | None = None, query_batch: int = QUERY_BATCH
) -> tuple[np.ndarray, np.ndarray]:
  """The `k` best corpus rows for each query by dot product: (scores [q, k] float32, corpus rows [q, k] int64),
  best first, equal scores by row, the lower first. `queries` [q, dim], `corpus` [n, dim]; the corpus is split
  over every device of `mesh` (default: all devices), padded to a multiple of their count; the queries are scored
  `query_batch` at a time (fewer for a large corpus: `SCORES_PER_DEVICE`)."""
  queries, corpus = np.asarray(queries, np.float32), np.asarray(corpus, np.float32)
  _check_embeddings("the queries", queries)
  _check_embeddings("the corpus", corpus, queries.shape[1])
  if not 1 <= k <= len(corpus):
    raise ValueError(f"k={k}; expected 1 <= k <= the corpus's {len(corpus)} rows.")
  mesh = mesh or sharding.make_mesh({"data": -1})
  devices = mesh.devices.size
  rows_per_shard = -(-len(corpus) // devices)
  padded = np.zeros((rows_per_shard * devices, corpus.shape[1]), np.float32)
  padded[: len(corpus)] = corpus
  corpus_on_mesh = jax.device_put(padded, NamedSharding(mesh, PartitionSpec(tuple(mesh.axis_names), None)))
  search = _search_fn(mesh, k, min(k, rows_per_shard), rows_per_shard, len(corpus))
  batch = max(1, min(query_batch, SCORES_PER_DEVICE // rows_per_shard, len(queries)))
  replicated = sharding.replicated(mesh)
  scores, rows = [], []
  for start in range(0, len(queries), batch):
    chunk = np.zeros((batch, queries.shape[1]), np.float32)  # one shape for every batch: one compilation
    part = queries[start : start + batch]
    chunk[: len(part)] = part
    best, best_rows = jax.device_get(search(jax.device_put(chunk, replicated), corpus_on_mesh))
    scores.append(best[: len(part)])
    rows.append(best_rows[: len(part)])
  return np.concatenate(scores).astype(np.float32), np.concatenate(rows).astype(np.int64)


def search_results(
  query_embeddings: np.ndarray, corpus_embeddings: np.ndarray, beir_set: BeirSet, k: int = 100, mesh: Mesh | None = None
) -> dict[str, dict[str, float]]:
  """BEIR's results (query id -> document id -> score) of exact search: each of `beir_set`'s queries (rows of
  `query_embeddings`, in `beir_set.queries`' order) with its `k` best documents (rows of `corpus_embeddings`, in
  `beir_set.corpus`' order), a document whose id is the query's left out (BEIR's convention)."""
  doc_ids = list(beir_set.corpus)
  query_ids = list(beir_set.queries)
  for name, embeddings, expected in (
    ("query_embeddings", query_embeddings, len(query_ids)),
    ("corpus_embeddings", corpus_embeddings, len(doc_ids)),
  ):
    if len(embeddings) != expected:
      raise ValueError(f"{name} has {len(embeddings)} rows; {beir_set.directory} has {expected}.")
  # Rows in descending id order: top_k's tie rule (the lower row first) is then trec_eval's (the greater id first).
  order = np.array(sorted(range(len(doc_ids)), key=doc_ids.__getitem__, reverse=True), np.int64)
  depth = min(k + 1, len(doc_ids))  # one more, for the query's own id
  scores, rows = top_k(query_embeddings, np.asarray(corpus_embeddings)[order], depth, mesh)
  results = {}
  for query_id, query_scores, query_rows in zip(query_ids, scores, order[rows], strict=True):
    hits = [(doc_ids[row], float(score)) for row, score in zip(query_rows, query_scores, strict=True)]
    results[query_id] = dict([hit for hit in hits if hit[0] != query_id][:k])
  return results


def retrieval_metrics(
  query_embeddings: np.ndarray,
  corpus_embeddings: np.ndarray,
  beir_set: BeirSet,
  k: int = 100,
  mesh: Mesh | None = None,
  k_values: tuple[int, ...] = (10, 100),
) -> dict[str, float]:
  """`beir_set`'s metrics (`metrics.evaluate` at `k_values`: "ndcg@10", "mrr@10", "recall@100", "map@100", ...)
  for the top `k` documents of exact search (`search_results`)."""
  if k < max(k_values):
    raise ValueError(f"k={k} is less than the metrics' deepest cut-off {max(k_values)}; search at least that deep.")
  results = search_results(query_embeddings, corpus_embeddings, beir_set, k, mesh)
  return metrics.evaluate(beir_set.qrels, results, k_values)
