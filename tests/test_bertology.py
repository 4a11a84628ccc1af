"""The BERTology analyses (bert_jax/bertology/) against numpy on `transformers`' own outputs, same weights."""

import json
import re

import matplotlib.image
import numpy as np
import pytest
import torch
import transformers

from bert_jax import config_checks
from bert_jax.bertology import attention
from bert_jax.model.bert_config import BertConfig
from configs import default
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
  result = attention.analyse(config, str(tmp_path / "workdir"))

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
    attention.analyse(config, str(tmp_path / "workdir"))
  config.bertology.update(output_dir=str(tmp_path / "other"), show_lines=(21,))
  with pytest.raises(ValueError, match=re.escape("bertology.show_lines has [21], but the input has 21 lines")):
    attention.analyse(config, str(tmp_path / "workdir"))
  assert not (tmp_path / "other").exists()


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
  config_checks.check(config, "attention")
  config.bertology.update(overrides)
  with pytest.raises(ValueError, match=re.escape(message)):
    config_checks.check(config, "attention")
