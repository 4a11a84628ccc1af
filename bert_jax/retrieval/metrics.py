"""Retrieval metrics as BEIR's `EvaluateRetrieval.evaluate` computes them (through pytrec_eval, trec_eval's code)
and its `mrr`: nDCG@k (`ndcg_cut`), MAP@k (`map_cut`), recall@k (`recall`), precision@k (`P`) and MRR@k.

trec_eval's conventions, each held against pytrec_eval by tests/test_retrieval_metrics.py:

* a query's results are ranked by score, descending, and equal scores by document id, descending (trec_eval
  sorts by score, then `strcmp` reversed);
* a document is relevant when its judgement is > 0; a document no judgement names is not relevant;
* nDCG's gain is the judgement itself (not 2^rel - 1), discounted by log2(rank + 1); the ideal ranking is the
  query's judgements, sorted; a query with no relevant document scores 0 on every measure;
* MAP@k sums the precision at each relevant document within the first k and divides by the query's relevant
  documents (all of them, not at most k); precision@k divides by k, however few results there are;
* MRR@k: 1 / the rank of the first relevant document within the first k, else 0 (BEIR's `mrr`, ties ranked as
  above where BEIR keeps the results' order).

Each metric is a mean over the judged queries (`qrels`): a judged query without results scores 0, as
trec_eval's `-c` counts it (BEIR's pytrec_eval means cover only the queries with results, equal whenever every
query has results, as exact search gives). Results for a query with no judgement are left out, as pytrec_eval
leaves them. Nothing is rounded (BEIR rounds to 5 places).
"""

import math
from collections.abc import Mapping, Sequence

MEASURES = ("ndcg", "mrr", "map", "recall", "precision")


def ranked(doc_scores: Mapping[str, float]) -> list[str]:
  """Document ids by score, descending; equal scores by id, descending (trec_eval's order)."""
  return [doc_id for doc_id, _ in sorted(doc_scores.items(), key=lambda item: (float(item[1]), item[0]), reverse=True)]


def query_metrics(judgements: Mapping[str, int], doc_scores: Mapping[str, float], k_values: Sequence[int]) -> dict:
  """One query's metrics ("ndcg@10", ...; `MEASURES` at each k) from its judgements (document id -> relevance)
  and its results (document id -> score)."""
  relevances = [judgements.get(doc_id, 0) for doc_id in ranked(doc_scores)]
  ideal = sorted((rel for rel in judgements.values() if rel > 0), reverse=True)
  num_relevant = len(ideal)
  metrics = {}
  for k in k_values:
    top = relevances[:k]
    found = [rank for rank, rel in enumerate(top) if rel > 0]
    dcg = sum(rel / math.log2(rank + 2) for rank, rel in enumerate(top) if rel > 0)
    idcg = sum(rel / math.log2(rank + 2) for rank, rel in enumerate(ideal[:k]))
    metrics[f"ndcg@{k}"] = dcg / idcg if idcg > 0 else 0.0
    metrics[f"mrr@{k}"] = 1.0 / (found[0] + 1) if found else 0.0
    average_precision = sum((count + 1) / (rank + 1) for count, rank in enumerate(found))
    metrics[f"map@{k}"] = average_precision / num_relevant if num_relevant else 0.0
    metrics[f"recall@{k}"] = len(found) / num_relevant if num_relevant else 0.0
    metrics[f"precision@{k}"] = len(found) / k
  return metrics


def _check(qrels: Mapping, results: Mapping, k_values: Sequence[int]) -> None:
  if not qrels:
    raise ValueError("qrels is empty: no judged query to evaluate.")
  if not k_values or any(not isinstance(k, int) or k < 1 for k in k_values):
    raise ValueError(f"k_values={tuple(k_values)!r}; expected one or more positive integers.")
  if results and not any(query_id in results for query_id in qrels):
    raise ValueError(
      f"the results name none of the {len(qrels)} judged queries (results' first: {next(iter(results))!r}, "
      f"qrels' first: {next(iter(qrels))!r}): every metric would be 0."
    )


def per_query(
  qrels: Mapping[str, Mapping[str, int]],
  results: Mapping[str, Mapping[str, float]],
  k_values: Sequence[int] = (10, 100),
) -> dict[str, dict[str, float]]:
  """Each judged query's metrics (`query_metrics`; zeros for a query without results)."""
  _check(qrels, results, k_values)
  return {
    query_id: query_metrics(judgements, results.get(query_id, {}), k_values) for query_id, judgements in qrels.items()
  }


def evaluate(
  qrels: Mapping[str, Mapping[str, int]],
  results: Mapping[str, Mapping[str, float]],
  k_values: Sequence[int] = (10, 100),
) -> dict[str, float]:
  """The means over `qrels`' queries of each metric ("ndcg@10", "mrr@10", "map@100", "recall@100", "precision@10",
  ...: `MEASURES` at each of `k_values`), `results` being query id -> document id -> score (module docstring)."""
  scores = per_query(qrels, results, k_values)
  names = [f"{measure}@{k}" for measure in MEASURES for k in k_values]
  return {name: sum(query[name] for query in scores.values()) / len(scores) for name in names}
