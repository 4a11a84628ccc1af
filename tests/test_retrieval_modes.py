"""`--mode=retrieve` and `--mode=mine`: their configs refused before anything runs; a bad set refused before the model
is read; and, end to end on a small pretrained source, retrieve's metrics.json equal to pytrec_eval's measures of each
text embedded alone, mine's negatives those of `retrieval/mining.py` on those embeddings, read back as the
embeddings task reads pairs."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import pytrec_eval

from bert_jax import jobs
from bert_jax.handoff import pretrained
from bert_jax.model import sentence_embedding
from bert_jax.model.encoder import BertModel
from bert_jax.retrieval import mining


def retrieval_config(config, **settings):
  config.retrieval.update({key: str(value) if key.endswith("_dir") else value for key, value in settings.items()})
  return config


@pytest.mark.parametrize(
  ("overrides", "message"),
  [
    (dict(data_dir=""), r"--mode=retrieve needs retrieval.data_dir \(a BEIR-layout set"),
    (dict(output_dir=""), r"--mode=retrieve needs retrieval.data_dir .* and retrieval.output_dir"),
    (dict(split=""), r"retrieval.split is empty"),
    (dict(top_k=50), r"retrieval.top_k=50 must be at least 100"),
    (dict(batch_size=0), r"retrieval.batch_size=0 must be at least 1"),
    (dict(max_seq_length=2), r"retrieval.max_seq_length=2 must be 0 \(the source's\) or at least 3"),
    (dict(data_dir="gs://BUCKET/beir/scifact"), r"retrieval.data_dir='gs://BUCKET/beir/scifact' names the placeholder"),
  ],
)
def test_the_config_is_refused_before_anything_runs(small_config, overrides, message):
  config = retrieval_config(small_config, **(dict(data_dir="/data/scifact", output_dir="/out") | overrides))
  with pytest.raises(ValueError, match=message):
    jobs.check(config, "retrieve")


def test_an_unknown_pooling_is_refused(small_config):
  config = retrieval_config(small_config, data_dir="/data/scifact", output_dir="/out")
  config.embedding.pooling = "max"
  with pytest.raises(ValueError, match=r"embedding.pooling='max'; expected one of \('cls', 'mean'\)"):
    jobs.check(config, "retrieve")


WORDS = [f"w{i}" for i in range(1, 30)]


def write_beir_set(directory, rng):
  """24 documents and 10 queries of the run's vocabulary ("w1 w7 w3 ..."), graded judgements."""
  directory.mkdir()
  docs = {
    f"doc{i}": (" ".join(rng.choice(WORDS, 2)), " ".join(rng.choice(WORDS, rng.integers(3, 20)))) for i in range(24)
  }
  queries = {f"q{i}": " ".join(rng.choice(WORDS, rng.integers(2, 6))) for i in range(10)}
  lines = [json.dumps({"_id": doc_id, "title": title, "text": text}) for doc_id, (title, text) in docs.items()]
  (directory / "corpus.jsonl").write_text("\n".join(lines) + "\n")
  lines = [json.dumps({"_id": query_id, "text": text}) for query_id, text in queries.items()]
  (directory / "queries.jsonl").write_text("\n".join(lines) + "\n")
  qrels = {q: {f"doc{d}": int(rng.integers(1, 3)) for d in rng.choice(24, 3, replace=False)} for q in queries}
  (directory / "qrels").mkdir()
  rows = [f"{q}\t{d}\t{score}" for q, judged in qrels.items() for d, score in judged.items()]
  (directory / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(rows) + "\n")
  return docs, queries, qrels


def test_a_bad_set_is_refused_before_the_model_is_read(small_config, tmp_path):
  write_beir_set(tmp_path / "set", np.random.default_rng(0))
  with (tmp_path / "set" / "qrels" / "test.tsv").open("a") as f:
    f.write("q1\tdoc99\t1\n")
  config = retrieval_config(
    small_config, data_dir=tmp_path / "set", output_dir=tmp_path / "out", source=str(tmp_path / "no_model")
  )
  with pytest.raises(ValueError, match=r"test.tsv:32 judges document 'doc99', which corpus.jsonl does not hold"):
    jobs.run(config, str(tmp_path / "workdir"), "retrieve")
  assert not (tmp_path / "out").exists()


def alone(loaded, texts, seq):
  """Each text's mean-pooled, normalised embedding, one text a row, no packing: the reference."""
  model = BertModel(loaded.config)
  rows = []
  for text in texts:
    ids = loaded.tokenizer.pair_row(loaded.tokenizer.encode(text)[: seq - 2], [])[0]
    ids = jnp.asarray([ids], jnp.int32)
    sequence_output, _ = model.apply({"params": loaded.params["bert"]}, ids, jnp.ones_like(ids), jnp.zeros_like(ids))
    rows.append(sentence_embedding.normalize(sentence_embedding.pool(sequence_output, jnp.ones_like(ids), "mean"))[0])
  return np.asarray(jax.device_get(jnp.stack(rows)), np.float64)


@pytest.mark.slow
def test_retrieve_writes_pytrec_evals_metrics_of_the_embedded_set(small_config, exports, tmp_path):
  docs, queries, qrels = write_beir_set(tmp_path / "set", np.random.default_rng(1))
  config = retrieval_config(
    small_config,
    data_dir=tmp_path / "set",
    output_dir=tmp_path / "out",
    source=exports["bundle"],
    batch_size=8,
    max_seq_length=24,
  )
  report = jobs.run(config, str(tmp_path / "workdir"), "retrieve")
  written = json.loads((tmp_path / "out" / "metrics.json").read_text())
  assert written == json.loads(json.dumps(report))
  assert (written["documents"], written["queries"], written["max_seq_length"]) == (24, 10, 24)
  assert written["embedding"]["pooling"] == "mean" and written["embedding"]["normalized"]

  loaded = pretrained.load(exports["bundle"])
  doc_texts = [f"{title} {text}".strip() for title, text in docs.values()]
  scores = alone(loaded, list(queries.values()), 24) @ alone(loaded, doc_texts, 24).T
  run = {q: {d: float(scores[i, j]) for j, d in enumerate(docs)} for i, q in enumerate(queries)}
  evaluator = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.10,100", "map_cut.100", "recip_rank"})
  reference = evaluator.evaluate(run)
  for name, measure in (("ndcg@10", "ndcg_cut_10"), ("recall@10", "recall_10"), ("map@100", "map_cut_100")):
    expected = np.mean([reference[q][measure] for q in queries])
    assert written["metrics"][name] == pytest.approx(expected, abs=1e-6), name
  assert written["metrics"]["recall@100"] == 1.0  # every document retrieved
  with pytest.raises(FileExistsError, match=r"retrieval.output_dir=.* is not empty"):
    jobs.run(config, str(tmp_path / "workdir"), "retrieve")


@pytest.mark.parametrize(
  ("overrides", "message"),
  [
    (dict(pairs_file=""), r"--mode=mine needs mine.pairs_file \(anchor and positive columns"),
    (dict(output_dir=""), r"--mode=mine needs mine.pairs_file .* and mine.output_dir"),
    (dict(num_negatives=0), r"mine.num_negatives=0 must be at least 1"),
    (dict(range_min=-1), r"mine.range_min=-1 must be non-negative"),
    (dict(range_min=4, range_max=6), r"mine.num_negatives=3 exceeds the 2 ranks from mine.range_min=4 to"),
    (dict(batch_size=0), r"mine.batch_size=0 must be at least 1"),
  ],
)
def test_the_mine_config_is_refused_before_anything_runs(small_config, overrides, message):
  small_config.mine.update(dict(pairs_file="/data/train.jsonl", output_dir="/out") | overrides)
  with pytest.raises(ValueError, match=message):
    jobs.check(small_config, "mine")


@pytest.mark.slow
def test_mine_writes_the_negatives_of_each_text_embedded_alone(small_config, exports, tmp_path):
  pairs = pytest.importorskip("bert_jax.finetune.pairs")
  rng = np.random.default_rng(2)
  text = lambda n: " ".join(rng.choice(WORDS, n))  # noqa: E731
  anchors = [text(3) for _ in range(12)]
  anchors[4] = anchors[1]  # an anchor with two positives
  positives = [text(int(rng.integers(4, 12))) for _ in range(12)]
  (tmp_path / "train.jsonl").write_text(
    "".join(json.dumps(dict(anchor=a, positive=p)) + "\n" for a, p in zip(anchors, positives, strict=True))
  )
  documents = [dict(_id=f"d{i}", title=text(1), text=text(int(rng.integers(4, 12)))) for i in range(20)]
  (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in documents))
  small_config.mine.update(
    source=exports["bundle"],
    pairs_file=str(tmp_path / "train.jsonl"),
    corpus_file=str(tmp_path / "corpus.jsonl"),
    output_dir=str(tmp_path / "out"),
    num_negatives=2,
    range_min=1,
    batch_size=8,
    max_seq_length=24,
  )
  report = jobs.run(small_config, str(tmp_path / "workdir"), "mine")
  assert json.loads((tmp_path / "out" / "mining.json").read_text()) == json.loads(json.dumps(report))

  found = mining.texts(anchors, positives, [f"{d['title']} {d['text']}" for d in documents])
  loaded = pretrained.load(exports["bundle"])
  expected = mining.mine(
    anchors,
    positives,
    found,
    alone(loaded, found.anchors, 24),
    alone(loaded, found.corpus, 24),
    mining.MiningSettings(num_negatives=2, range_min=1),
  )
  written = [json.loads(line) for line in (tmp_path / "out" / "negatives.jsonl").read_text().splitlines()]
  assert written == expected and len(written) == 12 == report["rows"]
  read_back = pairs.read_pairs(tmp_path / "out" / "negatives.jsonl", 2)
  assert [(p.anchor, p.positive, p.negatives) for p in read_back] == [
    (row["anchor"], row["positive"], (row["negative_1"], row["negative_2"])) for row in written
  ]
