"""bert_jax/retrieval/metrics.py: every metric equal to pytrec_eval's (trec_eval's code, what BEIR computes with) on a
generated set with graded relevance, tied scores, queries that find nothing relevant, no results or no relevant
document, and more results than k."""

import numpy as np
import pytest
import pytrec_eval

from bert_jax.retrieval import metrics

K_VALUES = (1, 3, 10, 100)


def generated_set(seed: int = 0):
  """qrels and results over 300 documents for 40 queries: relevance 0, 1, 2; scores from a few values (many ties);
  between 0 and 150 results a query."""
  rng = np.random.default_rng(seed)
  docs = [f"doc{i}" for i in range(300)]
  qrels, results = {}, {}
  for q in range(40):
    judged = rng.choice(300, size=rng.integers(1, 12), replace=False)
    qrels[f"q{q}"] = {docs[i]: int(rng.choice([0, 1, 2], p=[0.3, 0.4, 0.3])) for i in judged}
    num_results = [0, 5, 10, 150][q % 4] if q % 7 else 150
    retrieved = rng.choice(300, size=num_results, replace=False)
    values = rng.integers(0, 6, size=num_results) / 4.0  # 6 distinct scores: ties everywhere.
    results[f"q{q}"] = {docs[i]: float(v) for i, v in zip(retrieved, values, strict=True)}
  qrels["q_none_relevant"] = {"doc1": 0, "doc2": 0}
  results["q_none_relevant"] = {"doc1": 1.0, "doc2": 0.5}
  results["q_not_judged"] = {"doc3": 1.0}
  return qrels, results


def pytrec(qrels, results) -> dict:
  measures = {f"{name}.{','.join(map(str, K_VALUES))}" for name in ("ndcg_cut", "map_cut", "recall", "P")}
  return pytrec_eval.RelevanceEvaluator(qrels, measures | {"recip_rank"}).evaluate(results)


def reference_metrics(scores: dict, k: int) -> dict:
  """One query's pytrec_eval scores under this module's names (MRR@k from the reciprocal rank: 1/rank if rank <= k)."""
  recip = scores["recip_rank"]
  return {
    f"ndcg@{k}": scores[f"ndcg_cut_{k}"],
    f"map@{k}": scores[f"map_cut_{k}"],
    f"recall@{k}": scores[f"recall_{k}"],
    f"precision@{k}": scores[f"P_{k}"],
    f"mrr@{k}": recip if recip >= 1.0 / k - 1e-12 else 0.0,
  }


@pytest.mark.parametrize("seed", [0, 1])
def test_each_query_equals_pytrec_eval(seed):
  qrels, results = generated_set(seed)
  reference = pytrec(qrels, results)
  mine = metrics.per_query(qrels, results, K_VALUES)
  assert set(mine) == set(qrels)
  assert any(0 < reference[q]["recip_rank"] < 1 for q in reference)  # some queries find their first hit late
  for query_id in qrels:
    expected = {}
    for k in K_VALUES:
      expected |= reference_metrics(reference[query_id], k) if query_id in reference else {}
    if query_id not in reference:  # no results: pytrec_eval leaves the query out; here it scores 0.
      assert not results.get(query_id)
      assert all(value == 0.0 for value in mine[query_id].values())
      continue
    assert mine[query_id] == pytest.approx(expected, abs=1e-9), query_id


def test_means_cover_every_judged_query():
  qrels, results = generated_set()
  reference = pytrec(qrels, results)
  means = metrics.evaluate(qrels, results, K_VALUES)
  for k in K_VALUES:
    for name, value in means.items():
      if name.endswith(f"@{k}"):
        total = sum(reference_metrics(scores, k)[name] for scores in reference.values())
        assert value == pytest.approx(total / len(qrels), abs=1e-12)
  assert {"ndcg@10", "mrr@10", "recall@10", "recall@100", "map@100"} <= set(metrics.evaluate(qrels, results))


def test_ties_rank_by_document_id_descending_as_trec_eval():
  assert metrics.ranked({"a": 1.0, "c": 1.0, "b": 1.0, "z": 0.5, "y": 2.0}) == ["y", "c", "b", "a", "z"]
  qrels = {"q": {"a": 1}}
  for order in ({"a": 1.0, "b": 1.0}, {"b": 1.0, "a": 1.0}):
    assert metrics.evaluate(qrels, {"q": order}, (1,))["mrr@1"] == 0.0  # "b" ranks first whatever the dict order.
    assert pytrec(qrels, {"q": order})["q"]["recip_rank"] == 0.5


def test_graded_gain_is_the_relevance():
  # Ideal [2, 1]; found [1, 2]: DCG = 1 + 2/log2(3), IDCG = 2 + 1/log2(3).
  scores = metrics.query_metrics({"a": 2, "b": 1}, {"b": 2.0, "a": 1.0}, (10,))
  assert scores["ndcg@10"] == pytest.approx((1 + 2 / np.log2(3)) / (2 + 1 / np.log2(3)))


def test_refuses_what_would_be_a_silent_zero():
  with pytest.raises(ValueError, match="qrels is empty"):
    metrics.evaluate({}, {"q": {"d": 1.0}})
  with pytest.raises(ValueError, match=r"results name none of the 1 judged queries \(results' first: 'Q1'"):
    metrics.evaluate({"q1": {"d": 1}}, {"Q1": {"d": 1.0}})
  with pytest.raises(ValueError, match=r"k_values=\(0,\); expected one or more positive integers"):
    metrics.evaluate({"q1": {"d": 1}}, {"q1": {"d": 1.0}}, (0,))
