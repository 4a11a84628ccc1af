"""Sentence embeddings (model/sentence_embedding.py): sentence-transformers' pooling and normalisation, for single
and packed rows."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.model.bert_config import BertConfig
from bert_jax.model.encoder import BertModel
from bert_jax.model.sentence_embedding import normalize, pool, sentence_embeddings

SMALL = dict(vocab_size=64, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32, max_position_embeddings=32)


def test_mean_pooling_averages_the_unpadded_tokens_and_cls_takes_the_first():
  hidden = np.random.default_rng(0).normal(size=(2, 5, 3)).astype(np.float32)
  mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int32)
  mean = np.asarray(pool(jnp.asarray(hidden), jnp.asarray(mask), "mean"))
  np.testing.assert_allclose(mean[0], hidden[0, :3].mean(0), rtol=1e-6)
  np.testing.assert_allclose(mean[1], hidden[1].mean(0), rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(pool(jnp.asarray(hidden), jnp.asarray(mask), "cls")), hidden[:, 0])
  with pytest.raises(ValueError, match="pooling='max'; expected one of"):
    pool(jnp.asarray(hidden), jnp.asarray(mask), "max")


def test_normalize_gives_unit_vectors_and_leaves_a_zero_vector_zero():
  x = jnp.array([[3.0, 4.0], [0.0, 0.0]])
  np.testing.assert_allclose(np.asarray(normalize(x)), [[0.6, 0.8], [0.0, 0.0]], rtol=1e-6)


@pytest.mark.parametrize("model_type", ["bert", "modernbert"])
@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_a_packed_row_embeds_each_instance_as_its_own_row_would(model_type, pooling):
  extra = (
    dict(model_type="modernbert", rope_theta=10000.0, local_rope_theta=10000.0) if model_type == "modernbert" else {}
  )
  config = BertConfig(**SMALL, hidden_dropout_prob=0.0, attention_dropout_prob=0.0, **extra)
  model = BertModel(config)
  ids = jnp.zeros((1, 16), jnp.int32)
  params = model.init(jax.random.PRNGKey(0), ids, ids, ids)["params"]
  a, b = [2, 5, 6, 7, 3], [2, 9, 10, 3]
  single = dict(
    input_ids=jnp.array([a + [0] * 11, b + [0] * 12], jnp.int32),
    input_mask=jnp.array([[1] * 5 + [0] * 11, [1] * 4 + [0] * 12], jnp.int32),
    segment_ids=jnp.zeros((2, 16), jnp.int32),
  )
  packed = dict(
    input_ids=jnp.array([a + b + [0] * 7], jnp.int32),
    input_mask=jnp.array([[1] * 5 + [2] * 4 + [0] * 7], jnp.int32),
    segment_ids=jnp.zeros((1, 16), jnp.int32),
    position_ids=jnp.array([list(range(5)) + list(range(4)) + [0] * 7], jnp.int32),
    cls_positions=jnp.array([[0, 5, 0]], jnp.int32),
  )
  expected = sentence_embeddings(model, params, single, pooling, normalized=True)
  got = sentence_embeddings(model, params, packed, pooling, normalized=True)
  assert got.shape == (1, 3, 16)
  np.testing.assert_allclose(np.asarray(got[0, :2]), np.asarray(expected), atol=1e-5)
  np.testing.assert_array_equal(np.asarray(got[0, 2]), 0.0)  # The third slot holds no instance.


def test_a_jobs_settings_are_the_configs_where_set_else_the_sources_else_the_defaults():
  import ml_collections

  from bert_jax.model.sentence_embedding import Settings, settings
  from configs import default

  embedding = default.get_config().embedding
  assert settings(embedding) == Settings(pooling="mean", normalized=True)
  source = Settings(pooling="cls", normalized=False, query_prompt="query: ", max_seq_length=256)
  assert settings(embedding, source) == source
  embedding.normalize = True
  assert settings(embedding, source) == Settings("cls", True, "query: ", "", 256)
  embedding.pooling = "max"
  with pytest.raises(ValueError, match="pooling='max'; expected one of"):
    settings(embedding, source)
  assert isinstance(embedding, ml_collections.ConfigDict)
