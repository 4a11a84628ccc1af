"""The equal-compute benchmark's contestants (bert_jax/benchmarks/objectives.py): each a valid config at every size
it offers, changing only what its recipe changes."""

import pytest
from absl.testing import flagsaver

from bert_jax.benchmarks import objectives
from bert_jax.model.bert_config import preset
from configs import modernbert_base

DEFAULTS = dict(vocab="vocab.txt", prepared_dir="/prepared", size="tiny", learning_rate="1e-3", evals="10")
MODERN = ["bert", "bert_mlm30", "modernbert_bert_recipe", "modernbert"]


@pytest.mark.parametrize("size", objectives.SIZES)
def test_every_contestant_is_a_valid_config_at_every_size_with_the_encoder_that_size_names(size):
  with flagsaver.as_parsed(**{**DEFAULTS, "size": size, "learning_rate": "5e-4"}):
    configs = {name: objectives.contestant_config(name, steps=100) for name in objectives.CONTESTANTS}
    flops = {name: objectives.flops_per_step(config) for name, config in configs.items()}
  for name, config in configs.items():
    for field in ("num_layers", "hidden_size", "num_heads"):
      assert config.model[field] == preset(size)[field], (name, field)
    assert config.learning_rate == 5e-4
    assert (config.num_train_steps, config.warmup_steps) == (100, 10)
  hidden = preset(size)["hidden_size"]
  assert configs["modernbert"].model.intermediate_size == 3 * hidden // 2  # GeGLU, 1.5 times as ModernBERT-base's.
  assert configs["bert"].model.intermediate_size == 4 * hidden
  # StableAdamW's decoupled decay stays 1e-5 a step at the peak whatever the rate; AdamW's is BERT's.
  assert configs["modernbert"].weight_decay * 5e-4 == pytest.approx(modernbert_base.DECOUPLED_WEIGHT_DECAY)
  assert configs["bert"].weight_decay == configs["modernbert_bert_recipe"].weight_decay == 0.01
  # 30% masking makes a step dearer; ModernBERT's architecture (GeGLU 1.5 H, no NSP head) makes it cheaper.
  assert flops["bert_mlm30"] > flops["bert"] > flops["modernbert_bert_recipe"]


def test_random_weights_are_fine_tuned_once_per_architecture_and_only_when_asked():
  with flagsaver.as_parsed(random_init="true", **DEFAULTS):
    assert objectives.random_init_contestants(MODERN) == ["bert", "modernbert_bert_recipe"]
    assert objectives.random_init_contestants(["modernbert", "bert_mlm30"]) == ["modernbert", "bert_mlm30"]
  with flagsaver.as_parsed(random_init="false", **DEFAULTS):
    assert objectives.random_init_contestants(MODERN) == []
