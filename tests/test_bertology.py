"""The BERTology analyses (bert_jax/bertology/) against numpy on `transformers`' own outputs, same weights."""

import json
import re

import jax
import jax.numpy as jnp
import matplotlib.image
import numpy as np
import pytest
import torch
import transformers

from bert_jax import jobs
from bert_jax.bertology import attention, feature_based, heads
from bert_jax.finetune import tasks
from bert_jax.handoff import pretrained
from bert_jax.model.bert_config import BertConfig
from bert_jax.model.encoder import BertModel, encoder_intermediates
from configs import default, glue
from configs import ner as ner_config
from tests.helpers import write_sst2
from tests.test_encoder import _reference
from tests.test_roberta import write_hf_directory

SEQ = 16


@pytest.fixture(scope="module")
def hf_bert(tmp_path_factory):
  """A Hugging Face BERT directory (L2 H32 A4, random weights with sharp attention) and its model."""
  config = BertConfig(
    vocab_size=60, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=48, max_position_embeddings=40
  )
  model = _reference(config, seed=3, cls=transformers.BertModel)
  with torch.no_grad():  # Random weights attend almost uniformly; sharpen them so that heads differ.
    for layer in model.encoder.layer:
      layer.attention.self.query.weight.mul_(20.0)
      layer.attention.self.key.weight.mul_(20.0)
  directory = tmp_path_factory.mktemp("hf_bert")
  write_hf_directory(model, directory, config.vocab_size)
  return directory, model


def _lines(rng, count: int) -> list[str]:
  """Lines of known words (w0..w54) and an unknown one, 1 to 20 words: some are cut at SEQ tokens."""
  words = lambda n: " ".join(f"w{i}" if i < 55 else "unknown" for i in rng.integers(0, 58, n))
  return [words(int(n)) for n in rng.integers(1, 21, count)]


def _numpy_statistics(model, tokenizer, lines: list[str]) -> dict[str, np.ndarray]:
  """The module's statistics from transformers' `output_attentions`, line by line, in numpy."""
  sums, queries = {}, 0
  for line in lines:
    ids = tokenizer(line, truncation=True, max_length=SEQ)["input_ids"]
    with torch.no_grad():
      found = model(torch.tensor([ids]), output_attentions=True).attentions
    probs = np.stack([a[0].numpy().astype(np.float64) for a in found])  # [layers, heads, n, n]
    n = len(ids)
    ids = np.array(ids)
    per_query = dict(
      entropy=-(probs * np.log(np.where(probs > 0, probs, 1))).sum(-1),
      to_cls=probs[..., ids == tokenizer.cls_token_id].sum(-1),
      to_sep=probs[..., ids == tokenizer.sep_token_id].sum(-1),
      to_previous=np.stack([probs[..., q, q - 1] if q else np.zeros(probs.shape[:2]) for q in range(n)], -1),
      to_next=np.stack([probs[..., q, q + 1] if q < n - 1 else np.zeros(probs.shape[:2]) for q in range(n)], -1),
      to_self=np.stack([probs[..., q, q] for q in range(n)], -1),
      distance=(probs * np.abs(np.arange(n)[:, None] - np.arange(n)[None, :])).sum(-1),
    )
    for name, value in per_query.items():
      sums[name] = sums.get(name, 0) + value.sum(-1)
    queries += n
  return {name: value / queries for name, value in sums.items()}


def test_attention_statistics_equal_numpy_on_transformers_attentions(hf_bert, tmp_path):
  directory, model = hf_bert
  lines = _lines(np.random.default_rng(0), 21)  # Two batches of 8 and a partial one.
  (tmp_path / "a.txt").write_text("\n".join(lines[:12]) + "\n")
  (tmp_path / "b.txt").write_text("\n".join(lines[12:]) + "\n")
  config = default.get_config()
  settings = dict(input_pattern=str(tmp_path / "*.txt"), max_seq_length=SEQ, batch_size=8, show_lines=(3, 20))
  config.bertology.update(source=str(directory), output_dir=str(tmp_path / "out"), **settings)
  result = jobs.run(config, str(tmp_path / "workdir"), "attention")

  tokenizer = transformers.BertTokenizer(str(directory / "vocab.txt"))
  expected = _numpy_statistics(model, tokenizer, lines)
  assert sorted(result["statistics"]) == sorted(expected) == sorted(attention.STATISTICS)
  for name, value in expected.items():
    np.testing.assert_allclose(result["statistics"][name], value, atol=2e-6, err_msg=name)
  # The statistics tell heads apart (the sharpened weights) and stand out from even attention, whose marks are
  # the same statistics of attention spread over each line's tokens.
  assert np.ptp(expected["entropy"]) > 0.3 and np.all(expected["to_self"] <= 1)
  lengths = np.array([len(tokenizer(line, truncation=True, max_length=SEQ)["input_ids"]) for line in lines])
  assert result["uniform"]["entropy"] == pytest.approx(np.sum(lengths * np.log(lengths)) / lengths.sum(), rel=1e-6)
  assert result["uniform"]["to_cls"] == pytest.approx(len(lines) / lengths.sum(), rel=1e-6)  # 1/n per query.
  assert result["uniform"]["to_sep"] == pytest.approx(result["uniform"]["to_cls"]) == result["uniform"]["to_self"]
  assert np.all(np.array(result["statistics"]["entropy"]) < result["uniform"]["entropy"])
  assert result["lines"] == 21 and result["tokens"] == result["query_tokens"] == sum(lengths)
  assert result["truncated"] == sum(len(tokenizer.tokenize(line)) > SEQ - 2 for line in lines) > 0
  assert (result["layers"], result["heads"], result["source_format"]) == (2, 4, "huggingface")
  assert json.loads((tmp_path / "out" / "attention.json").read_text()) == result

  heatmaps = matplotlib.image.imread(tmp_path / "out" / "attention_statistics.png")
  assert heatmaps.shape[0] > 300 and heatmaps.shape[1] > 600 and heatmaps.std() > 0.05
  for number in (3, 20):
    image = matplotlib.image.imread(tmp_path / "out" / f"attention_map_line{number}.png")
    assert image.shape[0] > 200 and image.std() > 0.05
  assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
    "attention.json",
    "attention_map_line20.png",
    "attention_map_line3.png",
    "attention_statistics.png",
  ]

  # What an earlier analysis wrote is never overwritten; a line to draw beyond the input is named.
  with pytest.raises(FileExistsError, match="bertology.output_dir=.* is not empty"):
    jobs.run(config, str(tmp_path / "workdir"), "attention")
  config.bertology.update(output_dir=str(tmp_path / "other"), show_lines=(21,))
  with pytest.raises(ValueError, match=re.escape("bertology.show_lines has [21], but the input has 21 lines")):
    jobs.run(config, str(tmp_path / "workdir"), "attention")
  assert not (tmp_path / "other").exists()


def test_an_input_without_lines_is_refused_naming_the_pattern_before_the_source_is_read(tmp_path):
  """Empty files and no line to draw divided the sums by zero queries (a bare ZeroDivisionError) after the model ran."""
  (tmp_path / "a.txt").write_text("")
  (tmp_path / "b.txt").write_bytes(b"")
  config = default.get_config()
  pattern = str(tmp_path / "*.txt")
  never_read = str(tmp_path / "no_model")  # Reading it would fail otherwise: the input is refused first.
  config.bertology.update(input_pattern=pattern, source=never_read, output_dir=str(tmp_path / "out"), show_lines=())
  message = f"bertology.input_pattern={pattern!r} matches {[str(tmp_path / n) for n in ('a.txt', 'b.txt')]}, which hold"
  with pytest.raises(ValueError, match=re.escape(message) + " no lines: there is no attention to analyse."):
    jobs.run(config, str(tmp_path / "workdir"), "attention")
  assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]


@pytest.mark.parametrize(
  "overrides,message",
  [
    (dict(input_pattern=""), "--mode=attention needs bertology.input_pattern and bertology.output_dir."),
    (dict(max_seq_length=2), "bertology.max_seq_length=2 must be"),
    (dict(show_lines=(-1,)), "bertology.show_lines=(-1,) must be line numbers, from 0."),
  ],
)
def test_a_bad_attention_setting_is_refused_naming_it(overrides, message):
  config = default.get_config()
  config.bertology.update(input_pattern="*.txt", output_dir="/tmp/out")
  jobs.check(config, "attention")
  config.bertology.update(overrides)
  with pytest.raises(ValueError, match=re.escape(message)):
    jobs.check(config, "attention")


@pytest.mark.parametrize(
  "overrides,message",
  [
    (dict(finetune=dict(task="")), "--mode=heads needs finetune.task, the task the model was fine-tuned on"),
    (dict(bertology=dict(output_dir="")), "--mode=heads needs bertology.output_dir."),
    (dict(bertology=dict(prune_step=0.0)), "bertology.prune_step=0.0 must be in (0, 1]."),
    (dict(bertology=dict(prune_max=1.5)), "bertology.prune_max=1.5 must be in [0, 1]."),
  ],
)
def test_a_bad_heads_setting_is_refused_naming_it(overrides, message):
  config = glue.get_config()
  config.finetune.update(task="sst2", data_dir="/data/SST-2")
  config.bertology.output_dir = "/tmp/out"
  jobs.check(config, "heads")
  config.update_from_flattened_dict({f"{a}.{b}": v for a, values in overrides.items() for b, v in values.items()})
  with pytest.raises(ValueError, match=re.escape(message)):
    jobs.check(config, "heads")


@pytest.fixture(scope="module")
def fine_tuned_sst2(tmp_path_factory):
  """A Hugging Face BertForSequenceClassification directory fine-tuned (so its config says) on SST-2, with random
  weights and sharp attention; the model (eager attention: it applies head_mask); an SST-2 directory."""
  config = BertConfig(
    vocab_size=100, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=48, max_position_embeddings=40
  )
  labels = dict(id2label={0: "0", 1: "1"}, label2id={"0": 0, "1": 1}, finetuning_task="sst2")
  model = _reference(
    config, seed=4, cls=transformers.BertForSequenceClassification, attn_implementation="eager", **labels
  )
  with torch.no_grad():
    for layer in model.bert.encoder.layer:
      layer.attention.self.query.weight.mul_(8.0)
      layer.attention.self.key.weight.mul_(8.0)
  directory = tmp_path_factory.mktemp("sst2_model")
  write_hf_directory(model, directory, config.vocab_size)
  data = tmp_path_factory.mktemp("glue") / "SST-2"
  write_sst2(data)
  # Trained for real (60 steps on the 64 training rows), so that its predictions depend on its heads.
  finetune = glue.get_config().finetune
  finetune.update(task="sst2", data_dir=str(data))
  task = tasks.make_task(finetune)
  train = task.encode(task.read("train"), pretrained.load(str(directory)).tokenizer, 16).features
  optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
  model.train()
  for step in range(60):
    rows = slice(16 * (step % 4), 16 * (step % 4) + 16)
    loss = model(
      torch.tensor(train["input_ids"][rows], dtype=torch.long),
      attention_mask=torch.tensor(train["input_mask"][rows]),
      token_type_ids=torch.tensor(train["segment_ids"][rows], dtype=torch.long),
      labels=torch.tensor(train["label"][rows], dtype=torch.long),
    ).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
  model.eval()
  model.save_pretrained(directory)
  return directory, model, data


def _accuracy(model, features: dict, head_mask: np.ndarray) -> float:
  with torch.no_grad():
    out = model(
      torch.tensor(features["input_ids"], dtype=torch.long),
      attention_mask=torch.tensor(features["input_mask"]),
      token_type_ids=torch.tensor(features["segment_ids"], dtype=torch.long),
      head_mask=torch.tensor(head_mask),
    )
  return float((out.logits.argmax(-1).numpy() == features["label"]).mean())


def test_head_importance_and_pruning_equal_transformers_gradients_and_accuracy(fine_tuned_sst2, tmp_path):
  directory, model, data = fine_tuned_sst2
  config = glue.get_config()
  config.finetune.update(task="sst2", data_dir=str(data), max_seq_length=16)
  settings = dict(source=str(directory), output_dir=str(tmp_path / "out"), batch_size=8, prune_step=0.25)
  config.bertology.update(prune_max=1.0, **settings)
  result = jobs.run(config, str(tmp_path / "workdir"), "heads")

  # The same dev rows through transformers: |d(batch's summed loss) / d head_mask|, added up, over the rows.
  task = tasks.make_task(config.finetune)
  encoded = task.encode(task.read("dev"), pretrained.load(str(directory)).tokenizer, 16)
  features, rows = encoded.features, encoded.num_rows
  expected = np.zeros((2, 4))
  for start in range(0, rows, 8):
    batch = {name: torch.tensor(value[start : start + 8]) for name, value in features.items()}
    mask = torch.ones(2, 4, requires_grad=True)
    out = model(
      batch["input_ids"].long(),
      attention_mask=batch["input_mask"],
      token_type_ids=batch["segment_ids"].long(),
      head_mask=mask,
      labels=batch["label"].long(),
    )
    (out.loss * len(batch["label"])).backward()
    expected += mask.grad.abs().numpy()
  expected /= rows
  np.testing.assert_allclose(result["importance"], expected, rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(result["importance_normalized"], heads.normalized(expected), rtol=1e-4, atol=1e-6)
  assert np.ptp(expected) > 0.1 * expected.max()  # Heads differ.

  # Pruned 2 heads (25%) at a time, least important first (by the full model's importance, then by the importance
  # under the mask so far); each step's accuracy is transformers' under the same mask. The trained model keeps its
  # accuracy with 6 of its 8 heads gone, and loses it with all 8 (its [CLS] then sees no word).
  assert [row["heads_pruned"] for row in result["pruning"]] == [0, 2, 4, 6, 8]
  accuracies = [row["accuracy"] for row in result["pruning"]]
  assert accuracies[0] > 0.9 and accuracies[-1] < accuracies[0] - 0.2
  assert len(result["pruned_order"]) == 8
  first = np.argsort(heads.normalized(expected), axis=None, kind="stable")[:2]
  assert [layer * 4 + head for layer, head in result["pruned_order"][:2]] == first.tolist()
  mask = np.ones((2, 4), np.float32)
  for step, row in enumerate(result["pruning"]):
    assert row["accuracy"] == pytest.approx(_accuracy(model, features, mask), abs=1e-9), step
    for layer, head in result["pruned_order"][2 * step : 2 * step + 2]:
      mask[layer, head] = 0
  assert json.loads((tmp_path / "out" / "heads.json").read_text()) == result
  for name in ("head_importance.png", "pruning.png"):
    assert matplotlib.image.imread(tmp_path / "out" / name).std() > 0.05

  # A model without the task's head is refused, naming what it is.
  config.finetune.task = "rte"
  config.bertology.output_dir = str(tmp_path / "other")
  with pytest.raises(ValueError, match="is fine-tuned on 'sst2'; --mode=heads needs a model fine-tuned on"):
    jobs.run(config, str(tmp_path / "workdir"), "heads")


@pytest.mark.slow
def test_the_scalar_mix_finds_the_layer_a_task_is_a_function_of(tmp_path):
  """A sentence task whose label is a linear function of layer 1's mean-pooled features only: the probe on layer 1
  scores best, and the learned mix puts most of its weight there. The model's feed-forward layers are scaled up, so
  that each layer adds what the residual stream did not hold (else every layer is nearly a linear image of the
  embeddings, and any probe reads any layer's direction)."""
  config = BertConfig(
    vocab_size=60, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=48, max_position_embeddings=40
  )
  model = _reference(config, seed=5, cls=transformers.BertModel)
  with torch.no_grad():
    for layer in model.encoder.layer:
      layer.intermediate.dense.weight.mul_(10.0)
      layer.output.dense.weight.mul_(10.0)
  directory = tmp_path / "model"
  write_hf_directory(model, directory, config.vocab_size)
  rng = np.random.default_rng(1)
  data = tmp_path / "SST-2"
  data.mkdir()
  splits = {"train": 480, "dev": 240}
  sentences = {
    split: [" ".join(f"w{i}" for i in rng.integers(0, 55, rng.integers(4, 12))) for _ in range(rows)]
    for split, rows in splits.items()
  }
  config = glue.get_config()
  config.finetune.update(task="sst2", data_dir=str(data), max_seq_length=SEQ)
  write = lambda split, labels: (data / f"{split}.tsv").write_text(
    "sentence\tlabel\n" + "".join(f"{text}\t{label}\n" for text, label in zip(sentences[split], labels, strict=True))
  )
  for split, rows in splits.items():
    write(split, [0] * rows)
  loaded, task = pretrained.load(str(directory)), tasks.make_task(config.finetune)
  direction = rng.normal(size=loaded.config.hidden_size)
  projections = {}
  for split in splits:
    rows = task.encode(task.read(split), loaded.tokenizer, SEQ).features
    _, state = BertModel(loaded.config).apply(
      {"params": loaded.params["bert"]},
      rows["input_ids"],
      rows["input_mask"],
      rows["segment_ids"],
      mutable=["intermediates"],
    )
    layer_1 = np.asarray(encoder_intermediates(state["intermediates"], loaded.config)["hidden_states"][1])
    real = rows["input_mask"][:, :, None] > 0
    projections[split] = ((layer_1 * real).sum(1) / real.sum(1)) @ direction
  threshold = np.median(projections["train"])
  for split in splits:
    write(split, (projections[split] > threshold).astype(int).tolist())

  settings = dict(probe_epochs=40, probe_learning_rate=1e-2, batch_size=32)
  config.bertology.update(source=str(directory), output_dir=str(tmp_path / "out"), **settings)
  result = jobs.run(config, str(tmp_path / "workdir"), "probe")
  scores, weights = result["layer_scores"], result["mix_weights"]
  assert len(scores) == len(weights) == 3 and result["metric"] == "accuracy"
  assert int(np.argmax(scores)) == 1 and scores[1] > 0.85, scores
  assert int(np.argmax(weights)) == 1 and weights[1] > 0.5, weights
  assert result["mix_score"] > 0.85 and 0.5 < result["expected_layer"] < 1.5
  assert json.loads((tmp_path / "out" / "probe.json").read_text()) == result
  assert matplotlib.image.imread(tmp_path / "out" / "probe.png").std() > 0.05


def test_a_token_task_is_probed_per_token(hf_bert, tmp_path):
  """CoNLL-2003 columns: a probe per layer and the mix on each word's first piece, scored by conlleval's F1."""
  from tests.test_ner import TRAIN, VALID

  (tmp_path / "train.txt").write_text(TRAIN)
  (tmp_path / "valid.txt").write_text(VALID)
  config = ner_config.get_config()
  config.finetune.update(data_dir=str(tmp_path), max_seq_length=SEQ)
  config.bertology.update(source=str(hf_bert[0]), output_dir=str(tmp_path / "out"), batch_size=8, probe_epochs=2)
  result = jobs.run(config, str(tmp_path / "workdir"), "probe")
  assert (result["task"], result["metric"], result["pooling"], result["split"]) == ("conll2003", "f1", "token", "dev")
  assert len(result["layer_scores"]) == 3 and all(0 <= score <= 1 for score in result["layer_scores"])
  assert sum(result["mix_weights"]) == pytest.approx(1.0) and np.isfinite(result["final_loss"])


@pytest.mark.slow
def test_the_feature_based_tagger_learns_tags_from_frozen_layers(hf_bert, tmp_path):
  """Tags that the word decides (w0-w9 a person, w10-w19 a place): a BiLSTM on the frozen layers learns them; the
  features are the chosen layers, concatenated or summed."""
  rng = np.random.default_rng(2)
  tag = lambda word: "B-PER" if word < 10 else "B-LOC" if word < 20 else "O"
  for split, count in (("train", 160), ("valid", 60)):
    sentences = [rng.integers(0, 55, rng.integers(3, 9)) for _ in range(count)]
    text = "\n\n".join("\n".join(f"w{w} {tag(w)}" for w in sentence) for sentence in sentences)
    (tmp_path / f"{split}.txt").write_text(text + "\n")
  config = ner_config.get_config()
  config.finetune.update(data_dir=str(tmp_path), max_seq_length=SEQ)
  settings = dict(batch_size=16, probe_epochs=12, probe_learning_rate=1e-2, lstm_size=16, lstm_layers=1)
  config.bertology.update(source=str(hf_bert[0]), output_dir=str(tmp_path / "concat"), **settings)
  with pytest.raises(
    ValueError, match=re.escape("bertology.feature_layers has -4; this model has hidden states -3..2")
  ):
    jobs.run(config, str(tmp_path / "workdir"), "feature_based")  # The default, the paper's last four, of 2 layers.
  config.bertology.feature_layers = (-1, -2, -3)
  result = jobs.run(config, str(tmp_path / "workdir"), "feature_based")
  assert (result["layers"], result["combine"], result["feature_width"]) == ([-1, -2, -3], "concat", 3 * 32)
  assert result["metrics"]["f1"] > 0.9, result["metrics"]
  assert json.loads((tmp_path / "concat" / "feature_based.json").read_text()) == result
  config.bertology.update(output_dir=str(tmp_path / "sum"), feature_layers=(0, -1), feature_combine="sum")
  summed = jobs.run(config, str(tmp_path / "workdir"), "feature_based")
  assert (summed["feature_width"], summed["layers"]) == (32, [0, -1]) and summed["metrics"]["f1"] > 0.5


def test_the_feature_layers_benchmark_compares_the_papers_choices():
  """benchmarks/feature_layers: BERT-Base gets the paper's rows (table 7); a 2-layer model's "last four" are its
  three hidden states, named so."""
  from bert_jax.benchmarks import feature_layers

  assert feature_layers.choices(12) == [
    ("embeddings only", (0,), "concat"),
    ("second-to-last hidden", (-2,), "concat"),
    ("last hidden", (-1,), "concat"),
    ("sum of the last 4", (-1, -2, -3, -4), "sum"),
    ("concatenation of the last 4", (-1, -2, -3, -4), "concat"),
    ("sum of all 12 layers", tuple(range(1, 13)), "sum"),
  ]
  tiny = feature_layers.choices(2)
  assert tiny[3] == ("sum of the last 3 (the embeddings included)", (-1, -2, -3), "sum")
  assert tiny[5] == ("sum of all 2 layers", (1, 2), "sum")


def test_the_taggers_scores_of_real_tokens_never_read_the_padding():
  """BiLstmTagger (the feature-based tagger's model): [batch, seq, features] -> [batch, seq, labels], and what lies
  beyond a row's length changes none of its real tokens' scores, in either direction of either layer."""
  tagger = feature_based.BiLstmTagger(lstm_size=8, lstm_layers=2, num_labels=3)
  x = jax.random.normal(jax.random.key(0), (2, 6, 4))
  lengths = jnp.array([4, 6])
  params = tagger.init(jax.random.key(1), x, lengths)
  scores = tagger.apply(params, x, lengths)
  padded_differently = tagger.apply(params, x.at[0, 4:].set(100.0), lengths)
  assert scores.shape == (2, 6, 3)
  np.testing.assert_array_equal(scores[0, :4], padded_differently[0, :4])
  np.testing.assert_array_equal(scores[1], padded_differently[1])
  assert not np.allclose(scores[0, 4:], padded_differently[0, 4:])  # The padding itself was read, and changed.
