"""The embeddings task (finetune/embeddings.py, finetune.task="embeddings"): its rows, its model and loss, its
refusals before any compute, and a tiny model fine-tuned end to end through jobs.run."""

import json

import jax
import numpy as np
import pytest

from bert_jax import jobs, sharding
from bert_jax.dry_run import planner
from bert_jax.finetune import plan as plan_lib
from bert_jax.finetune import tasks
from bert_jax.finetune.contrastive_loss import contrastive_loss
from bert_jax.finetune.rows import host_batch
from bert_jax.handoff import pretrained
from bert_jax.model import sentence_embedding
from bert_jax.model.encoder import BertModel
from bert_jax.model.sentence_embedding import Settings
from configs import embeddings as embeddings_config

WORDS = "man woman dog cat house city car book film movie london paris france germany president company".split()


def write_set(directory, hard_negatives: bool = True, pairs_file: bool = True):
  """A BEIR-layout set of 16 documents (two words of a topic each), a query per document naming one of its words,
  dev qrels, and a training pairs file of other queries of the same topics (a hard negative: the next topic's)."""
  directory.mkdir(parents=True, exist_ok=True)
  (directory / "qrels").mkdir(exist_ok=True)
  corpus = [dict(_id=f"d{i}", title=WORDS[i], text=f"{WORDS[i]} {WORDS[(i + 5) % 16]}") for i in range(16)]
  queries = [dict(_id=f"q{i}", text=f"the {WORDS[i]}") for i in range(16)]
  (directory / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus))
  (directory / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
  (directory / "qrels" / "dev.tsv").write_text(
    "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(16))
  )
  (directory / "qrels" / "train.tsv").write_text(
    "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(8))
  )
  if pairs_file:
    header = "anchor\tpositive" + ("\tnegative" if hard_negatives else "")
    rows = [
      f"a {WORDS[i]}\t{WORDS[i]} {WORDS[(i + 5) % 16]}" + (f"\t{WORDS[(i + 1) % 16]}" if hard_negatives else "")
      for i in range(16)
      for _ in range(2)  # Each pair twice: never twice in one batch.
    ]
    (directory / "train.tsv").write_text("\n".join([header, *rows]) + "\n")
  return directory


def config_for(data_dir, tokenizer, **contrastive):
  config = embeddings_config.get_config()
  config.finetune.update(data_dir=str(data_dir), max_seq_length=8, num_epochs=2.0, eval_batch_size=16)
  config.model.update(
    vocab_size=tokenizer.vocab_size,
    hidden_size=32,
    num_layers=1,
    num_heads=4,
    intermediate_size=48,
    max_position_embeddings=16,
  )
  config.tokenizer.update(kind="wordpiece", path=tokenizer.path, lower_case=True)
  config.update(batch_size=8, learning_rate=1e-3, log_every_steps=2)
  config.contrastive.update(contrastive)
  return config


def test_rows_of_pairs_and_of_a_dev_set(tmp_path, fixture_tokenizers):
  tokenizer = fixture_tokenizers["wordpiece"]
  data = write_set(tmp_path / "set")
  config = config_for(data, tokenizer, hard_negatives=1)
  config.embedding.update(query_prompt="question: ")
  task = tasks.make_task(config.finetune, config.contrastive, config.embedding)
  train = task.encode(task.read("train"), tokenizer, 8)
  assert train.num_rows == 32 and train.features["negative_input_ids"].shape == (32, 1, 8)
  assert set(train.features) == set(task.train_batch_shapes(8, 8)) - {"weight"}
  first = tokenizer.pair_row(tokenizer.encode("question: a man"), [])[0]
  assert train.features["query_input_ids"][0, : len(first)].tolist() == first  # The query prompt, then the text.
  assert train.features["document_input_ids"][0, :4].tolist() == tokenizer.pair_row(tokenizer.encode("man city"), [])[0]
  assert train.extra.shape == (32, 3)  # The texts the batches keep apart.
  dev = task.encode(task.read("dev"), tokenizer, 8)
  assert dev.num_rows == 32 and dev.examples[:2] == ["q0", "q1"] and dev.examples[16] == "d0"
  # Metrics from embeddings: each query's embedding equal to its document's retrieves it first.
  vectors = np.eye(16, dtype=np.float32)
  metrics = task.metrics(dev, np.concatenate([vectors, vectors]))
  assert metrics["ndcg@10"] == pytest.approx(1.0) and metrics["mrr@10"] == pytest.approx(1.0)
  task.write_predictions(dev, np.concatenate([vectors, vectors]), str(tmp_path / "dev.tsv"))
  lines = (tmp_path / "dev.tsv").read_text().splitlines()
  assert lines[0] == "query-id\tcorpus-id\tscore" and lines[1].split("\t")[:2] == ["q0", "d0"]


@pytest.mark.parametrize("model_type", ["bert", "modernbert"])
def test_the_model_embeds_as_sentence_embedding_and_the_loss_is_the_contrastive_loss(
  tmp_path, fixture_tokenizers, model_type
):
  tokenizer = fixture_tokenizers["wordpiece"]
  config = config_for(write_set(tmp_path / "set"), tokenizer, hard_negatives=1, symmetric=True)
  if model_type == "modernbert":
    config.model.update(model_type="modernbert", rope_theta=10000.0, local_rope_theta=10000.0)
  task = tasks.make_task(config.finetune, config.contrastive, config.embedding).with_settings(Settings("cls", False))
  model_cfg = jobs.check(config, "finetune").model
  model = task.model(model_cfg)
  params = jax.jit(lambda key: model.init(key, *model.dummy_inputs())["params"])(jax.random.key(0))
  train = task.encode(task.read("train"), tokenizer, 8)
  batch = {name: value[:8] for name, value in train.features.items()} | {"weight": np.ones(8, np.float32)}

  def embed(column):
    rows = {name: batch[f"{column}_{name}"].reshape(-1, 8) for name in ("input_ids", "input_mask", "segment_ids")}
    return sentence_embedding.sentence_embeddings(BertModel(model_cfg), params["bert"], rows, "cls", False)

  @jax.jit
  def both(params, batch):
    expected = contrastive_loss(embed("query"), embed("document"), embed("negative")[:, None], symmetric=True)
    return expected, task.loss().value(params, batch, model)

  expected, (loss, metrics) = both(params, batch)
  np.testing.assert_allclose(float(loss), float(expected), rtol=1e-5)
  assert float(metrics["task_count"]) == 8 and 0 <= float(metrics["task_accuracy"]) <= 8


@pytest.mark.parametrize(
  "change,message",
  [
    (dict(data_dir=""), r"finetune.task='embeddings' reads a BEIR-layout set and pairs: set finetune.data_dir"),
    (dict(num_microbatches=2), r"num_microbatches=2: the embeddings task's negatives are the whole batch's"),
    (dict(scale=0.0), r"contrastive.scale=0.0; expected a positive scale"),
    (dict(hard_negatives=-1), r"contrastive.hard_negatives=-1; expected 0 or more"),
    (dict(matryoshka_dims="32,8,x"), r"contrastive.matryoshka_dims='32,8,x' is not a comma-separated list"),
    (dict(matryoshka_dims="64,16"), r"contrastive.matryoshka_dims=\(64, 16\): \[64\] outside 1..32"),
    (dict(teacher="/some/teacher"), r"distill.teacher='/some/teacher': the embeddings task has no task distillation"),
  ],
)
def test_bad_settings_are_refused_at_the_front_door(tmp_path, fixture_tokenizers, change, message):
  config = config_for(tmp_path, fixture_tokenizers["wordpiece"])
  for key, value in change.items():
    node = {"data_dir": config.finetune, "num_microbatches": config, "teacher": config.distill}.get(
      key, config.contrastive
    )
    node[key] = value
  with pytest.raises(ValueError, match=message):
    jobs.check(config, "finetune")


def test_bad_data_is_refused_before_any_compute(tmp_path, fixture_tokenizers):
  tokenizer = fixture_tokenizers["wordpiece"]
  data = write_set(tmp_path / "set", pairs_file=False)
  config = config_for(data, tokenizer, hard_negatives=1)
  task = tasks.make_task(config.finetune, config.contrastive, config.embedding)
  with pytest.raises(ValueError, match=r"contrastive.hard_negatives=1, but .* has no pairs file"):
    task.read("train")
  config.contrastive.hard_negatives = 0
  task = tasks.make_task(config.finetune, config.contrastive, config.embedding)
  read = task.read("train")  # A BEIR set's own training qrels.
  assert [(p.anchor, p.positive) for p in read[:2]] == [("the man", "man man city"), ("the woman", "woman woman car")]
  (data / "train.tsv").write_text("anchor\tpositive\nthe man\tman\n\tthe woman\n")
  with pytest.raises(ValueError, match=r"train.tsv:3: empty 'anchor'"):
    jobs.run(config, str(tmp_path / "workdir"), "finetune")
  assert not (tmp_path / "workdir" / "checkpoints").exists()


@pytest.mark.slow
def test_a_tiny_model_fine_tunes_end_to_end(tmp_path, fixture_tokenizers):
  """A sweep of two seeds through jobs.run on a pairs file with a hard negative and a BEIR dev set: nDCG@10 per
  member at each epoch, best/ written with how it embeds, and loadable as the encoder that embeds as it evaluated."""
  tokenizer = fixture_tokenizers["wordpiece"]
  config = config_for(write_set(tmp_path / "set"), tokenizer, hard_negatives=1)
  config.sweep.seeds = 2
  config.embedding.pooling = "cls"
  workdir = tmp_path / "workdir"
  summary = jobs.run(config, str(workdir), "finetune")
  assert summary["main_metric"] == "ndcg@10" and len(summary["evaluations"]) == 2
  firsts, finals = ([m["ndcg@10"] for m in e["results"]["dev"]] for e in summary["evaluations"])
  assert len(finals) == 2 and all(first < final <= 1 for first, final in zip(firsts, finals, strict=True))  # Learnt.
  assert summary["embedding"] == dict(
    pooling="cls", normalized=True, query_prompt="", document_prompt="", max_seq_length=8
  )
  assert (workdir / "best").exists() and (workdir / "predictions" / "dev.tsv").exists()
  loaded = pretrained.load(str(workdir / "best"))
  assert loaded.task.head == "embedding" and set(loaded.params) == {"bert"}
  assert loaded.embedding == Settings("cls", True, "", "", 8)  # How it embeds, for a later load or export.
  # The best member's weights embed the dev set to the nDCG@10 recorded for it.
  task = tasks.make_task(config.finetune, config.contrastive, config.embedding)
  dev = task.encode(task.read("dev"), tokenizer, 8)
  rows = {name: dev.features[name] for name in ("input_ids", "input_mask", "segment_ids")}
  vectors = sentence_embedding.sentence_embeddings(BertModel(loaded.config), loaded.params["bert"], rows, "cls", True)
  best = summary["best"]
  np.testing.assert_allclose(task.metrics(dev, np.asarray(vectors))["ndcg@10"], best["value"], atol=1e-5)


@pytest.mark.slow
def test_the_training_step_on_eight_devices_equals_one_device_at_eight_times_the_batch(tmp_path, fixture_tokenizers):
  """Benchmark 3 (global negatives): the same pairs, batch 16 as 2 per device on 8 devices and as 16 on one device,
  through the job's own run (`plan.make_run`: model, loss, optimizer, jitted step): equal losses at two steps, hard
  negatives and the symmetric loss included, dropout on."""
  tokenizer = fixture_tokenizers["wordpiece"]
  config = config_for(write_set(tmp_path / "set"), tokenizer, hard_negatives=1, symmetric=True)
  config.batch_size = 16
  config.model.update(hidden_dropout_prob=0.1, attention_dropout_prob=0.1)
  checked = jobs.check(config, "finetune")
  task = tasks.make_task(config.finetune, config.contrastive, config.embedding)
  train = task.encode(task.read("train"), tokenizer, 8)
  plan = plan_lib.make_plan(config, checked.members, None, train.num_rows)
  stream = task.batches(train, config.batch_size)

  def losses_on(devices):
    run = plan_lib.make_run(config, plan, task, devices=devices)
    state = run.init_state([0])
    found = []
    for step in (1, 2):
      rows, weight = stream.step(step, 0)
      batch = sharding.global_batch(host_batch(train.features, rows[None], weight[None]), run.mesh, members=True)
      state, sums = run.train_step(state, batch, jax.random.key(step)[None])
      found.append(float(sums["task_loss"][0]) / float(sums["task_count"][0]))
    return found

  one, eight = losses_on(jax.devices()[:1]), losses_on(jax.devices()[:8])
  np.testing.assert_allclose(eight, one, rtol=2e-6)
  assert one[1] != one[0]  # The second step ran on updated weights.


def test_the_planner_keeps_the_batch_whole(tmp_path, fixture_tokenizers):
  """Microbatches would split the negatives: the planner tries every remat policy at one microbatch alone."""
  config = config_for(tmp_path, fixture_tokenizers["wordpiece"])
  config.dry_run.plan_remat = ("none", "full")
  assert planner.candidates(config, per_chip=64, row_tokens=256) == [("none", 1), ("full", 1)]
  config.finetune.task = "sst2"
  assert ("none", 2) in planner.candidates(config, per_chip=64, row_tokens=256)
