import importlib

import jax
import numpy as np
import pytest

from bert_jax.model import bert_config
from bert_jax.model.bert_config import PRESETS, BertConfig, preset
from bert_jax.model.encoder import BertForPretraining


def _param_count(config: BertConfig) -> int:
  """Counted from shapes alone (jax.eval_shape): nothing is allocated, even for BERT-Large."""
  ids = jax.ShapeDtypeStruct((1, 8), np.int32)
  positions = jax.ShapeDtypeStruct((1, 2), np.int32)
  variables = jax.eval_shape(BertForPretraining(config).init, jax.random.key(0), ids, ids, ids, positions)
  return sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(variables))


@pytest.mark.parametrize(
  "name, millions",
  [
    ("base", 110),
    ("large", 340),
    ("configs.roberta_base", 125),
    ("configs.albert_base", 12),
    ("configs.modernbert_base", 149),
    ("configs.modernbert_large", 395),
  ],
)
def test_paper_sizes_have_the_papers_parameter_counts(name, millions):
  """BERT's two sizes, and RoBERTa's, ALBERT's (factorised embeddings, one shared layer) and ModernBERT's configs
  (gated feed-forward, no biases, no position table)."""
  if name.startswith("configs."):
    config = bert_config.model_config(importlib.import_module(name).get_config())
  else:
    config = BertConfig(**preset(name))
  count = _param_count(config)
  # The paper's figures are rounded; the encoder with pooler and heads is within 2% of them.
  assert abs(count / 1e6 - millions) / millions < 0.02, count


def test_miniatures_grid_follows_the_bert_recipe():
  for layers in (2, 4, 6, 8, 10, 12):
    for hidden in (128, 256, 512, 768):
      size = PRESETS[f"L{layers}_H{hidden}"]
      assert size == dict(num_layers=layers, hidden_size=hidden, num_heads=hidden // 64, intermediate_size=4 * hidden)
  assert PRESETS["tiny"] == PRESETS["L2_H128"]
  assert PRESETS["large"] == dict(num_layers=24, hidden_size=1024, num_heads=16, intermediate_size=4096)


def test_bad_model_configs_name_the_value():
  with pytest.raises(ValueError, match="hidden_size=100 is not divisible by model.num_heads=12"):
    BertConfig(hidden_size=100, num_heads=12)
  with pytest.raises(ValueError, match="dtype='float16'"):
    BertConfig(dtype="float16")
  with pytest.raises(ValueError, match="Unknown model preset 'huge'"):
    preset("huge")
  with pytest.raises(ValueError, match=r"model.hidden_act='relu' is not supported; expected one of \('gelu'"):
    BertConfig(hidden_act="relu")
  with pytest.raises(ValueError, match=r"model.layer_sharing='half' is not supported"):
    BertConfig(layer_sharing="half")
  with pytest.raises(ValueError, match=r"model.embedding_size must be a non-negative integer, got -1"):
    BertConfig(embedding_size=-1)


def test_a_fine_tuning_config_takes_the_encoder_s_dropout_from_its_source_unless_it_sets_it():
  """configs/glue.py (and the fine-tuning configs built on it) leaves the encoder's dropout unset: a run takes its
  source's (ModernBERT's and ALBERT v2's 0, BERT's 0.1), as transformers' from_pretrained reads config.json; with no
  source, BERT's 0.1; set, it overrides the source's."""
  from bert_jax.model.bert_config import from_fields
  from configs import glue

  fields = glue.get_config().model.to_dict()
  dropout = lambda model: (model.hidden_dropout_prob, model.attention_dropout_prob)  # noqa: E731
  assert dropout(from_fields(fields, BertConfig(hidden_dropout_prob=0.0, attention_dropout_prob=0.05))) == (0.0, 0.05)
  assert dropout(from_fields(fields)) == (0.1, 0.1)
  fields.update(hidden_dropout_prob=0.2)
  assert dropout(from_fields(fields, BertConfig(hidden_dropout_prob=0.0, attention_dropout_prob=0.0))) == (0.2, 0.0)
