"""The embedder: packed rows give each text the embedding it has alone (BERT and ModernBERT, whose local attention must
not cross instances), in input order, with prompts per kind; the packer's batches and shapes."""

import jax
import numpy as np
import pytest

from bert_jax import sharding
from bert_jax.data.tokenizer import load_tokenizer
from bert_jax.handoff import hf_configs
from bert_jax.model import sentence_embedding
from bert_jax.model.bert_config import BertConfig
from bert_jax.model.encoder import BertModel
from bert_jax.retrieval import embedder

WORDS = [f"w{i}" for i in range(60)]
SEQ = 32


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  vocab = tmp_path_factory.mktemp("embedder") / "vocab.txt"
  vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ":", "query", *WORDS]) + "\n")
  return load_tokenizer("wordpiece", str(vocab))


def _texts(count: int, seed: int = 0) -> list[str]:
  rng = np.random.default_rng(seed)
  # Lengths from empty to past max_seq_length (truncated), most shorter than ModernBERT's window below.
  return [" ".join(rng.choice(WORDS, rng.integers(0, 40 if i % 5 == 0 else 12))) for i in range(count)]


def _model(family: str, vocab_size: int) -> BertConfig:
  if family == "bert":
    return BertConfig(
      vocab_size=vocab_size,
      hidden_size=32,
      num_layers=2,
      num_heads=4,
      intermediate_size=48,
      max_position_embeddings=64,
      hidden_dropout_prob=0.0,
      attention_dropout_prob=0.0,
    )
  fields = dict(
    model_type="modernbert",
    vocab_size=vocab_size,
    hidden_size=32,
    num_hidden_layers=3,  # Layers 0 global, 1 and 2 local.
    num_attention_heads=4,
    intermediate_size=48,
    max_position_embeddings=64,
    local_attention=8,  # 4 keys each side: shorter than many texts and than a packed row.
    global_attn_every_n_layers=3,
    global_rope_theta=1000.0,
    local_rope_theta=20.0,
    initializer_range=0.2,  # Attention far from uniform, so that positions, windows and instances matter.
  )
  return hf_configs.config_from_hf(fields, "test")


def _params(model_cfg: BertConfig) -> dict:
  ids = np.zeros((1, 8), np.int32)
  return BertModel(model_cfg).init(jax.random.key(0), ids, np.ones_like(ids), ids)["params"]


def _alone(model_cfg, params, rows, pooling, pad_to=None):
  """Each row's embedding computed unpacked: one row per text, padded to `pad_to` (all in one batch), or alone
  (`pad_to` None: a batch of one, no padding)."""
  encoder = BertModel(model_cfg)
  if pad_to is None:
    return np.concatenate([_alone(model_cfg, params, [row], pooling, len(row)) for row in rows])
  ids = np.zeros((len(rows), pad_to), np.int32)
  mask = np.zeros_like(ids)
  for i, row in enumerate(rows):
    ids[i, : len(row)], mask[i, : len(row)] = row, 1
  batch = dict(input_ids=ids, input_mask=mask, segment_ids=np.zeros_like(ids))
  return np.asarray(sentence_embedding.sentence_embeddings(encoder, params, batch, pooling, True))


@pytest.mark.parametrize("family, pooling", [("bert", "mean"), ("bert", "cls"), ("modernbert", "mean")])
def test_packed_rows_embed_each_text_as_it_embeds_alone(tokenizer, family, pooling):
  model_cfg = _model(family, 72)
  params = _params(model_cfg)
  settings = sentence_embedding.Settings(pooling=pooling, normalized=True)
  embed = embedder.Embedder(model_cfg, params, tokenizer, settings, SEQ, batch_size=2)
  texts = _texts(40)
  got = embed.embed(texts)
  rows = embed.rows(texts)
  assert max(len(row) for row in rows) == SEQ and min(len(row) for row in rows) == 2  # Truncated; empty texts.
  assert rows[1] == [tokenizer.cls_id, *tokenizer.encode(texts[1]), tokenizer.sep_id]
  batches = embedder.pack(rows, SEQ, 2, tokenizer.pad_id)
  assert max(int(batch.arrays["input_mask"].max()) for batch in batches) > 2  # Several texts share rows.
  assert got.shape == (40, 32) and got.dtype == np.float32
  np.testing.assert_allclose(got, _alone(model_cfg, params, rows, pooling, pad_to=SEQ), atol=1e-5)
  few = [int(np.argmax([len(row) for row in rows])), 1, 2, 3]  # Alone, unpadded (a program per length): a few.
  np.testing.assert_allclose(got[few], _alone(model_cfg, params, [rows[i] for i in few], pooling), atol=1e-5)
  assert embed.last_stats == dict(texts=40, tokens=sum(map(len, rows)), seconds=embed.last_stats["seconds"])


def test_batches_are_sharded_over_the_mesh_and_prompts_go_before_their_kind(tokenizer):
  model_cfg = _model("bert", 72)
  mesh = sharding.make_mesh({"data": -1})
  params = jax.device_put(_params(model_cfg), sharding.replicated(mesh))
  settings = sentence_embedding.Settings(pooling="mean", query_prompt="query : ")
  embed = embedder.Embedder(model_cfg, params, tokenizer, settings, SEQ, batch_size=8, mesh=mesh)
  texts = _texts(30, seed=1)
  queries, documents = embed.embed(texts, "query"), embed.embed(texts, "document")
  single = embedder.Embedder(model_cfg, _params(model_cfg), tokenizer, settings, SEQ, batch_size=1)
  np.testing.assert_allclose(documents, single.embed(texts), atol=1e-5)
  np.testing.assert_allclose(queries, single.embed(["query : " + text for text in texts]), atol=1e-5)
  assert not np.allclose(queries, documents, atol=1e-3)
  with pytest.raises(ValueError, match=r"kind='passage'; expected one of \('query', 'document'\)"):
    embed.embed(texts, "passage")
  with pytest.raises(ValueError, match=r"batch_size=6 must be positive and split over the 8 data-parallel devices"):
    embedder.Embedder(model_cfg, params, tokenizer, settings, SEQ, batch_size=6, mesh=mesh)
  with pytest.raises(ValueError, match=r"max_seq_length=80: expected more than the 2 special tokens .* at most"):
    embedder.Embedder(model_cfg, params, tokenizer, settings, 80, batch_size=8, mesh=mesh)


def test_the_packer_places_every_text_once_in_a_few_shapes():
  rng = np.random.default_rng(0)
  rows = [list(range(2, 2 + n)) for n in rng.integers(2, 129, 500)]
  batches = embedder.pack(rows, 128, 4, 0, min_rows=2)
  placed = np.concatenate([batch.texts for batch in batches])
  assert sorted(placed.tolist()) == list(range(500))
  assert embedder.row_widths(128) == (16, 32, 64, 128) and embedder.row_widths(100) == (16, 32, 64, 100)
  # Every batch the same number of token positions but the last, which takes as many rows (a multiple of min_rows)
  # as the texts left need.
  assert [batch.arrays["input_ids"].size for batch in batches[:-1]] == [4 * 128] * (len(batches) - 1)
  last_rows, last_width = batches[-1].arrays["input_ids"].shape
  assert last_rows % 2 == 0 and (last_rows == 2 or last_rows // 2 * last_width < 1.25 * batches[-1].tokens)
  for batch in batches:
    arrays = batch.arrays
    for text, row, slot in zip(batch.texts, batch.rows, batch.slots, strict=True):
      at = np.flatnonzero(arrays["input_mask"][row] == slot + 1)
      assert arrays["input_ids"][row, at].tolist() == rows[text]
      assert arrays["position_ids"][row, at].tolist() == list(range(len(rows[text])))
      assert arrays["cls_positions"][row, slot] == at[0]
  with pytest.raises(ValueError, match=r"Row 1 has 129 tokens; max_seq_length=128"):
    embedder.pack([[2, 3], list(range(129))], 128, 4, 0)
  real = sum(int((batch.arrays["input_mask"] > 0).sum()) for batch in batches)
  assert real == sum(map(len, rows)) and real / sum(batch.arrays["input_ids"].size for batch in batches) > 0.9
