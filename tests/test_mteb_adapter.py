"""The mteb adapter: mteb 2.x scores a bert_jax model in-process on a tiny retrieval task built in the test, with the
scores bert_jax's own retrieval metrics give the same embeddings."""

import numpy as np
import pytest

from bert_jax.retrieval import beir, search
from bert_jax.retrieval.embedder import Embedder
from bert_jax.retrieval.mteb_adapter import MtebEncoder
from configs import default
from tests.helpers import hf_bert_directory

mteb = pytest.importorskip("mteb")

WORDS = [f"w{i}" for i in range(60)]


@pytest.fixture(autouse=True)
def _global_seeds_restored():
  """mteb seeds Python's, numpy's, torch's and TensorFlow's global generators when it makes a task or an evaluator
  (mteb/_set_seed.py); each is put back as it was, for the tests that run after this one in the same worker. (The
  pretraining stream no longer depends on TensorFlow's: tests/test_pipeline.py.)"""
  import random
  import sys

  python, numpy = random.getstate(), np.random.get_state()
  torch = sys.modules.get("torch")
  torch_state = torch.random.get_rng_state() if torch else None
  yield
  random.setstate(python)
  np.random.set_state(numpy)
  if torch_state is not None:
    torch.random.set_rng_state(torch_state)
  if "tensorflow" in sys.modules:
    sys.modules["tensorflow"].random.set_seed(None)  # No global seed: TensorFlow's default, as before mteb.


def _retrieval_set() -> beir.BeirSet:
  """40 documents of random words (half with a title), 12 queries, each a few words of its one or two relevant
  documents: a random model's mean embeddings rank them well above chance, not perfectly."""
  rng = np.random.default_rng(0)
  corpus = {}
  for i in range(40):
    words = rng.choice(WORDS, rng.integers(4, 30))
    corpus[f"d{i}"] = dict(title=" ".join(words[:2]) if i % 2 else "", text=" ".join(words[2:]))
  queries, qrels = {}, {}
  for q in range(12):
    relevant = [f"d{d}" for d in rng.choice(40, 1 + q % 2, replace=False)]
    words = [word for d in relevant for word in corpus[d]["text"].split()[:3]]
    queries[f"q{q}"] = " ".join(words)
    qrels[f"q{q}"] = {d: 1 + (j == 0) for j, d in enumerate(relevant)}
  return beir.BeirSet("in-memory", "test", corpus, queries, qrels)


def _task(retrieval_set: beir.BeirSet):
  from datasets import Dataset
  from mteb.abstasks.retrieval import AbsTaskRetrieval
  from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData
  from mteb.abstasks.task_metadata import TaskMetadata

  class TinyRetrieval(AbsTaskRetrieval):
    metadata = TaskMetadata(
      name="TinyRetrieval",
      description="A retrieval set built in bert_jax's test of its mteb adapter.",
      reference="https://github.com/embeddings-benchmark/mteb",
      dataset={"path": "NA", "revision": "NA"},
      type="Retrieval",
      category="t2t",
      modalities=["text"],
      eval_splits=["test"],
      eval_langs=["eng-Latn"],
      main_score="ndcg_at_10",
      date=("2026-12-01", "2026-12-01"),
      domains=[],
      task_subtypes=[],
      license="cc-by-4.0",
      annotations_creators="derived",
      dialect=[],
      sample_creation="found",
      bibtex_citation="",
    )

    def load_data(self, num_proc=None, **kwargs):
      split = RetrievalSplitData(
        queries=Dataset.from_list([dict(id=q, text=text) for q, text in retrieval_set.queries.items()]),
        corpus=Dataset.from_list([dict(id=d, **document) for d, document in retrieval_set.corpus.items()]),
        relevant_docs=retrieval_set.qrels,
        top_ranked=None,
      )
      self.dataset = {"default": {"test": split}}
      self.data_loaded = True

  return TinyRetrieval()


@pytest.mark.slow  # mteb and datasets take seconds to import.
def test_mteb_scores_a_bert_jax_model_as_bert_jax_s_retrieval_metrics_do(tmp_path):
  config = default.get_config()
  config.embed.update(max_seq_length=32, batch_size=8)
  config.embedding.query_prompt = "w59 "  # Queries and documents embed differently: mteb must say which is which.
  embedder = Embedder.from_source(hf_bert_directory(tmp_path / "hf", WORDS), config)
  retrieval_set = _retrieval_set()
  result = mteb.evaluate(MtebEncoder(embedder), _task(retrieval_set), cache=None, show_progress_bar=False)
  scores = result.task_results[0].scores["test"][0]

  queries = embedder.embed(list(retrieval_set.queries.values()), "query")
  documents = embedder.embed([retrieval_set.document_text(d) for d in retrieval_set.corpus], "document")
  ours = search.retrieval_metrics(queries, documents, retrieval_set)  # At 10 and 100 (all 40 documents).
  assert 0.3 < ours["ndcg@10"] < 0.99  # Neither chance nor a perfect ranking: the comparison can fail.
  for name in ("ndcg@10", "mrr@10", "recall@10", "map@100", "ndcg@100"):
    measure, k = name.split("@")
    assert scores[f"{measure}_at_{k}"] == pytest.approx(ours[name], abs=1e-5), name
  # The prompt reached the queries only.
  plain = search.retrieval_metrics(embedder.embed(list(retrieval_set.queries.values())), documents, retrieval_set)
  assert plain["ndcg@10"] != pytest.approx(ours["ndcg@10"], abs=1e-6)
