"""bert_jax/retrieval/search.py: exact search with the corpus split over 8 devices equals numpy's exact ranking (ties
by row), whatever the corpus size; a BEIR set's results follow BEIR's conventions and trec_eval's tie order."""

import jax
import numpy as np
import pytest
import pytrec_eval

from bert_jax import sharding
from bert_jax.retrieval import metrics, search
from bert_jax.retrieval.beir import BeirSet


def numpy_top_k(queries, corpus, k):
  """The reference: every score, ranked by score descending, then row ascending (a stable sort)."""
  scores = queries.astype(np.float64) @ corpus.T.astype(np.float64)
  rows = np.argsort(-scores, axis=1, kind="stable")[:, :k]
  return np.take_along_axis(scores, rows, axis=1), rows


def integer_embeddings(rng, rows, dim=8):
  """Small integers: every dot product exact in float32, and many equal scores."""
  return rng.integers(-2, 3, size=(rows, dim)).astype(np.float32)


@pytest.mark.parametrize(("corpus_rows", "k"), [(64, 10), (61, 7), (13, 13), (5, 3), (203, 40)])
def test_top_k_over_eight_devices_equals_numpy(corpus_rows, k):
  assert len(jax.devices()) == 8
  rng = np.random.default_rng(corpus_rows)
  queries, corpus = integer_embeddings(rng, 37), integer_embeddings(rng, corpus_rows)
  corpus[corpus_rows // 2] = corpus[0]  # duplicate documents: tied everywhere
  scores, rows = search.top_k(queries, corpus, k, query_batch=16)  # three query batches, the last one part full
  expected_scores, expected_rows = numpy_top_k(queries, corpus, k)
  assert rows.shape == (37, k) and scores.dtype == np.float32
  np.testing.assert_array_equal(scores, expected_scores)
  np.testing.assert_array_equal(rows, expected_rows)


def test_top_k_on_a_mesh_of_several_axes_and_float_embeddings():
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  rng = np.random.default_rng(0)
  queries, corpus = rng.normal(size=(9, 16)).astype(np.float32), rng.normal(size=(50, 16)).astype(np.float32)
  scores, rows = search.top_k(queries, corpus, 50, mesh)
  expected_scores, expected_rows = numpy_top_k(queries, corpus, 50)
  np.testing.assert_allclose(scores, expected_scores, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(rows, expected_rows)


def test_top_k_refuses_bad_embeddings():
  good = np.ones((4, 3), np.float32)
  with pytest.raises(ValueError, match=r"k=5; expected 1 <= k <= the corpus's 4 rows"):
    search.top_k(good, good, 5)
  with pytest.raises(ValueError, match=r"the corpus has dimension 2; the queries have 3"):
    search.top_k(good, good[:, :2], 1)
  bad = good.copy()
  bad[2, 1] = np.nan
  with pytest.raises(ValueError, match=r"the corpus row 2 is not finite"):
    search.top_k(good, bad, 1)


def beir_set(doc_ids, query_ids, qrels):
  corpus = {doc_id: {"title": "", "text": doc_id} for doc_id in doc_ids}
  return BeirSet("generated", "test", corpus, {query_id: query_id for query_id in query_ids}, qrels)


def test_search_results_keep_trec_evals_documents_at_the_cut_and_skip_the_querys_own_id():
  doc_ids = ["b", "q1", "a", "d", "c"]
  corpus = np.array([[1, 0], [5, 0], [1, 0], [1, 0], [0, 1]], np.float32)  # b, a, d tie; q1 scores highest
  data = beir_set(doc_ids, ["q1"], {"q1": {"a": 1}})
  results = search.search_results(np.array([[1, 0]], np.float32), corpus, data, k=2)
  # q1 itself left out; of the tied b, a, d trec_eval ranks d then b first (ids descending).
  assert results == {"q1": {"d": 1.0, "b": 1.0}}
  assert metrics.ranked(results["q1"]) == ["d", "b"]


def test_retrieval_metrics_equal_pytrec_eval_on_every_result():
  rng = np.random.default_rng(3)
  doc_ids = [f"doc{i}" for i in rng.permutation(150)]
  query_ids = [f"q{i}" for i in range(20)]
  qrels = {q: {doc_ids[i]: int(rng.integers(0, 3)) for i in rng.choice(150, 4, replace=False)} for q in query_ids}
  queries, corpus = integer_embeddings(rng, 20), integer_embeddings(rng, 150)
  data = beir_set(doc_ids, query_ids, qrels)
  got = search.retrieval_metrics(queries, corpus, data, k=150, k_values=(10, 100))
  # The reference: every document scored (none left out at a cut), ranked and measured by pytrec_eval.
  scores = queries @ corpus.T
  run = {q: {doc_ids[j]: float(scores[i, j]) for j in range(150)} for i, q in enumerate(query_ids)}
  evaluator = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10,100", "recall.10,100", "map_cut.10,100"})
  reference = evaluator.evaluate(run)
  for name, measure in (("ndcg@10", "ndcg_cut_10"), ("recall@100", "recall_100"), ("map@100", "map_cut_100")):
    assert got[name] == pytest.approx(np.mean([reference[q][measure] for q in query_ids]), abs=1e-9), name
  assert got["ndcg@10"] > 0
  with pytest.raises(ValueError, match=r"k=50 is less than the metrics' deepest cut-off 100"):
    search.retrieval_metrics(queries, corpus, data, k=50)
  with pytest.raises(ValueError, match=r"corpus_embeddings has 149 rows; generated has 150"):
    search.retrieval_metrics(queries, corpus[:149], data)


def test_a_large_corpus_scores_fewer_queries_at_a_time(monkeypatch):
  monkeypatch.setattr(search, "SCORES_PER_DEVICE", 24)  # 8 rows a device: 3 queries a batch
  rng = np.random.default_rng(5)
  queries, corpus = integer_embeddings(rng, 10), integer_embeddings(rng, 64)
  scores, rows = search.top_k(queries, corpus, 5)
  expected_scores, expected_rows = numpy_top_k(queries, corpus, 5)
  np.testing.assert_array_equal(scores, expected_scores)
  np.testing.assert_array_equal(rows, expected_rows)
