"""The retrieval probe of pretraining: each evaluation's nDCG@10 is exact search over the trained encoder's own
sentence embeddings, shown on the evaluation line, written to TensorBoard and kept in the checkpoint's history; a
bad set or a probe the run cannot make is refused before anything is written."""

import copy
import dataclasses
import glob
import json
import logging
import os
import socket
import subprocess
import sys

import helpers
import jax
import numpy as np
import pytest

from bert_jax import jobs, sharding
from bert_jax.data.tokenizer import load_tokenizer
from bert_jax.model import sentence_embedding
from bert_jax.model.bert_config import model_config
from bert_jax.model.encoder import BertModel
from bert_jax.retrieval import search
from bert_jax.retrieval.beir import read as read_beir
from bert_jax.retrieval.embedder import Embedder
from bert_jax.train.retrieval_probe import RetrievalProbe

NAMES = ("ndcg@10", "mrr@10", "recall@100")  # What the probe reports, as retrieval_<name>.

# One host of a probe over 8 devices in all: argv coordinator, process id, process count, vocabulary, BEIR set.
_HOST = """
import json, sys
import flax.linen as nn
import jax
import numpy as np
address, index, hosts, vocab, beir_dir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
if hosts > 1:
  jax.distributed.initialize(address, num_processes=hosts, process_id=index)
from bert_jax import sharding
from bert_jax.data.tokenizer import load_tokenizer
from bert_jax.model import sentence_embedding
from bert_jax.model.bert_config import BertConfig
from bert_jax.model.encoder import BertModel
from bert_jax.retrieval.beir import read
from bert_jax.retrieval.embedder import Embedder
from bert_jax.train.retrieval_probe import RetrievalProbe

model_cfg = BertConfig(
  vocab_size=104, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=48, max_position_embeddings=40
)
ids = np.zeros((1, 8), np.int32)
params = jax.device_get(nn.unbox(BertModel(model_cfg).init(jax.random.key(0), ids, ids + 1, ids, True)["params"]))
mesh = sharding.make_mesh({"data": -1})
encoder = jax.device_put(params, sharding.replicated(mesh))
tokenizer = load_tokenizer("wordpiece", vocab, True)
embedder = Embedder(model_cfg, encoder, tokenizer, sentence_embedding.Settings(), 32, 8, mesh)
print("MEASURED", json.dumps(RetrievalProbe(read(beir_dir), embedder, mesh).measure({"bert": encoder})), flush=True)
"""


def _write_beir(directory, qrels_rows=None) -> str:
  """A BEIR set over wordpiece_run's words (w0 .. w94): 30 documents of 5-9 words, 12 queries of three of one
  document's words, that document judged relevant (2) and another sharing a word judged partly (1)."""
  rng = np.random.default_rng(1)
  words = [f"w{i}" for i in range(95)]
  documents = {f"d{i}": list(rng.choice(words, rng.integers(5, 10), replace=False)) for i in range(30)}
  queries, qrels = {}, []
  for i in range(12):
    target = f"d{2 * i}"
    queries[f"q{i}"] = " ".join(rng.choice(documents[target], 3, replace=False))
    qrels += [(f"q{i}", target, 2), (f"q{i}", f"d{2 * i + 1}", 1)]
  (directory / "qrels").mkdir(parents=True)
  lines = [json.dumps({"_id": doc_id, "title": "", "text": " ".join(text)}) for doc_id, text in documents.items()]
  (directory / "corpus.jsonl").write_text("\n".join(lines) + "\n")
  lines = [json.dumps({"_id": query_id, "text": text}) for query_id, text in queries.items()]
  (directory / "queries.jsonl").write_text("\n".join(lines) + "\n")
  rows = ["query-id\tcorpus-id\tscore", *("\t".join(map(str, row)) for row in qrels_rows or qrels)]
  (directory / "qrels" / "test.tsv").write_text("\n".join(rows) + "\n")
  return str(directory)


def _eval_scalars(workdir: str, tag: str) -> dict[int, float]:
  """{step: the value of `tag` that the job wrote to TensorBoard's eval directory}."""
  from bert_jax.tensorflow_cpu import tf

  values = {}
  for path in glob.glob(os.path.join(workdir, "tensorboard", "eval", "events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag == tag:
          values[event.step] = float(tf.make_ndarray(value.tensor))
  return values


def _embed_one_by_one(model_cfg, params, tokenizer, texts: list[str], max_seq_length: int) -> np.ndarray:
  """Each text alone in a row of its own, padded to `max_seq_length` (no packing, no mesh): mean-pooled,
  normalised."""
  rows = [tokenizer.pair_row(tokenizer.encode(text)[: max_seq_length - 2], [])[0] for text in texts]
  input_ids = np.full((len(rows), max_seq_length), tokenizer.pad_id, np.int32)
  input_mask = np.zeros((len(rows), max_seq_length), np.int32)
  for i, ids in enumerate(rows):
    input_ids[i, : len(ids)], input_mask[i, : len(ids)] = ids, 1
  batch = dict(input_ids=input_ids, input_mask=input_mask, segment_ids=np.zeros_like(input_ids))
  encoder = BertModel(model_cfg)
  embed = jax.jit(lambda params, batch: sentence_embedding.sentence_embeddings(encoder, params, batch, "mean", True))
  return np.asarray(embed(params, batch), np.float32)


def _expected(model_cfg, params, tokenizer, beir_set, max_seq_length: int) -> dict:
  """`search.retrieval_metrics` of `beir_set` embedded one text at a time by the encoder `params`."""
  documents = [beir_set.document_text(doc_id) for doc_id in beir_set.corpus]
  queries = _embed_one_by_one(model_cfg, params, tokenizer, list(beir_set.queries.values()), max_seq_length)
  corpus = _embed_one_by_one(model_cfg, params, tokenizer, documents, max_seq_length)
  return search.retrieval_metrics(queries, corpus, beir_set)


@pytest.fixture
def probe_config(wordpiece_run, tmp_path):
  """wordpiece_run's config (its prepared corpus and vocabulary) with a probe on a tiny BEIR set."""
  config = copy.deepcopy(wordpiece_run[1])
  config.retrieval_probe.data_dir = _write_beir(tmp_path / "beir")
  return config


def test_measure_is_exact_search_over_the_encoders_own_embeddings_compiled_once(wordpiece_run, tmp_path):
  """`measure` on wordpiece_run's final parameters equals exact search over embeddings computed one text at a time;
  other parameters of the same tree run through the programs already compiled, and score otherwise."""
  _, config, params = wordpiece_run
  mesh = sharding.make_mesh({"data": -1})
  encoder = jax.device_put(params["bert"], sharding.replicated(mesh))
  tokenizer = load_tokenizer("wordpiece", config.tokenizer.path, config.tokenizer.lower_case)
  model_cfg = model_config(config)
  embedder = Embedder(model_cfg, encoder, tokenizer, sentence_embedding.Settings(), 32, 8, mesh)
  probe = RetrievalProbe(read_beir(_write_beir(tmp_path / "beir")), embedder, mesh, max_queries=10)
  assert list(probe.beir_set.queries) == list(probe.beir_set.qrels) == [f"q{i}" for i in range(10)]

  measured = probe.measure({"bert": encoder, "cls": None})
  expected = _expected(model_cfg, params["bert"], tokenizer, probe.beir_set, 32)
  assert measured == pytest.approx({f"retrieval_{name}": expected[name] for name in NAMES}, abs=1e-6)
  compiled = embedder._embed._cache_size()

  other = jax.tree.map(lambda x: x * 1.5, encoder)
  remeasured = probe.measure({"bert": other})
  assert embedder._embed._cache_size() == compiled
  expected = _expected(model_cfg, jax.device_get(other), tokenizer, probe.beir_set, 32)
  assert remeasured == pytest.approx({f"retrieval_{name}": expected[name] for name in NAMES}, abs=1e-6)
  assert remeasured != measured


@pytest.mark.slow
def test_the_probe_reports_the_ndcg_of_the_trained_encoders_own_embeddings(probe_config, tmp_path, caplog):
  """Two steps, an evaluation at each: the probe's nDCG@10, MRR@10 and recall@100 at step 2 are exact search over
  the final parameters' embeddings computed one text at a time, and they are on the console, in TensorBoard and in
  the checkpoint's history."""
  config = probe_config
  config.update(eval_every_steps=1, checkpoint_every_steps=2)
  config.retrieval_probe.max_queries = 10  # The first 10 of the 12 judged queries.
  caplog.set_level(logging.INFO, logger="absl")
  workdir = str(tmp_path / "run")
  state = jobs.run(config, workdir, "pretrain")

  params = jax.tree.map(np.asarray, jax.device_get(state.params))
  beir_set = read_beir(config.retrieval_probe.data_dir)
  kept = list(beir_set.queries)[:10]
  beir_set = dataclasses.replace(
    beir_set, queries={q: beir_set.queries[q] for q in kept}, qrels={q: beir_set.qrels[q] for q in kept}
  )
  tokenizer = load_tokenizer("wordpiece", config.tokenizer.path, config.tokenizer.lower_case)
  expected = _expected(model_config(config), params["bert"], tokenizer, beir_set, config.data.max_seq_length)
  assert 0.3 < expected["ndcg@10"] < 1.0  # Words shared with the relevant documents rank them high, not all first.

  history = json.loads((tmp_path / "run" / "checkpoints" / "2" / "history" / "metadata").read_text())["eval"]
  assert history["step"] == 2
  for name in NAMES:
    assert history[f"retrieval_{name}"] == pytest.approx(expected[name], abs=1e-6)
  tensorboard = _eval_scalars(workdir, "retrieval_ndcg@10")
  assert sorted(tensorboard) == [1, 2]
  assert tensorboard[2] == pytest.approx(expected["ndcg@10"], abs=1e-6)
  assert tensorboard[1] != tensorboard[2]  # Each evaluation measures the parameters of its step.

  lines = [record.getMessage() for record in caplog.records]
  (eval_line,) = [line for line in lines if line.startswith("eval at step 2")]
  assert eval_line.endswith(f" | ndcg@10 {expected['ndcg@10']:.4f}") and "mlm_loss" in eval_line
  (summary,) = [line for line in lines if line.startswith("Training finished at step 2")]
  assert f"ndcg@10 {expected['ndcg@10']:.4f}" in summary  # The summary's eval row.
  (header,) = [line for line in lines if "retrieval probe" in line]
  assert f"{config.retrieval_probe.data_dir} (test): 10 queries, 30 documents" in header


def test_a_bad_set_is_refused_naming_its_line_before_anything_is_written(probe_config, tmp_path):
  config = probe_config
  config.retrieval_probe.data_dir = _write_beir(tmp_path / "bad", [("q0", "d0", 1), ("q1", "d99", 1)])
  workdir = tmp_path / "run"
  with pytest.raises(ValueError, match=r"qrels/test.tsv:3 judges document 'd99', which corpus.jsonl does not hold"):
    jobs.run(config, str(workdir), "pretrain")
  assert not workdir.exists()

  config.retrieval_probe.data_dir = str(tmp_path / "beir")
  config.retrieval_probe.split = "dev"
  with pytest.raises(
    FileNotFoundError, match=r"has no qrels/dev.tsv \(the split 'dev'\); the splits there: \['test'\]"
  ):
    jobs.run(config, str(workdir), "pretrain")
  assert not workdir.exists()


@pytest.mark.parametrize(
  "override, message",
  [
    (dict(source="synthetic"), r"data.source='synthetic': the probe tokenizes its set with the run's tokenizer"),
    (dict(eval_steps=0), r"with eval_steps=0: the probe runs at each evaluation"),
    (dict(max_seq_length=41), r"retrieval_probe.max_seq_length=41 .* gives rows of 41 tokens; expected .* at most"),
    (dict(max_queries=-1), r"retrieval_probe.max_queries=-1 must be non-negative"),
    (dict(batch_size=3), r"batch_size=3 must be positive and split over the 8 data-parallel devices"),
  ],
)
def test_a_probe_the_run_cannot_make_is_refused_before_anything_is_written(probe_config, tmp_path, override, message):
  config = probe_config
  for key, value in override.items():
    if key == "source":
      config.data.source = value
    elif key == "eval_steps":
      config.eval_steps = value
    else:
      config.retrieval_probe[key] = value
  workdir = tmp_path / "run"
  with pytest.raises(ValueError, match=message):
    jobs.run(config, str(workdir), "pretrain")
  assert not workdir.exists()


@pytest.mark.slow
def test_two_hosts_measure_what_one_host_of_as_many_devices_measures(tmp_path):
  """Every host reads the same set and builds the same batches: 2 processes of 4 devices run the same programs on
  global arrays, and each gets the figures 1 process of 8 devices gets."""
  words = [f"w{i}" for i in range(95)]
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *words]) + "\n")
  beir_dir = _write_beir(tmp_path / "beir")
  with socket.socket() as free:
    free.bind(("localhost", 0))
    address = f"localhost:{free.getsockname()[1]}"

  def start(index: int, hosts: int) -> subprocess.Popen:
    devices = 8 // hosts
    flags = f"--xla_force_host_platform_device_count={devices} {helpers.FAST_COMPILES}"
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=flags)
    arguments = ["-c", _HOST, address, str(index), str(hosts), str(vocab), beir_dir]
    return subprocess.Popen(
      [sys.executable, *arguments], cwd=helpers.ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )

  def measured(process: subprocess.Popen) -> dict:
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr[-3000:]
    (line,) = [line for line in stdout.splitlines() if line.startswith("MEASURED ")]
    return json.loads(line.removeprefix("MEASURED "))

  one = measured(start(0, 1))
  two = [measured(process) for process in [start(index, 2) for index in range(2)]]
  assert 0 < one["retrieval_ndcg@10"] <= 1
  assert two[0] == pytest.approx(one, abs=1e-6) and two[1] == pytest.approx(one, abs=1e-6)
