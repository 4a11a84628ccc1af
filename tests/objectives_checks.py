"""The checks of tests/test_benchmark_objectives.py, run there each in a fresh interpreter: the benchmark's module
defines absl flags (--vocab, --glue_dir, ...) that other benchmark modules a test process imports define too, and
absl refuses a flag defined twice."""

import contextlib
import io
import pathlib
from unittest import mock

import jax.numpy as jnp
import pytest
from absl.testing import flagsaver

from bert_jax import config_checks
from bert_jax.benchmarks import objectives
from bert_jax.flops import span_boundary_flops
from bert_jax.model.bert_config import preset
from bert_jax.train.step import TrainState
from configs import modernbert_base

DEFAULTS = dict(vocab="vocab.txt", prepared_dir="/prepared", size="tiny", learning_rate="1e-3", evals="10")
MODERN = ["bert", "bert_mlm30", "modernbert_bert_recipe", "modernbert"]


def every_contestant_is_a_valid_config_at_every_size_with_the_encoder_that_size_names(size):
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
  # SpanBERT: span masking alone's step, and its head at every prediction, its position embedding scaled from 200 at
  # BERT-Base's width.
  position_size = round(200 * hidden / 768)
  assert configs["spanbert"].span_boundary.position_embedding_size == position_size
  model_cfg = config_checks.check_pretraining(configs["spanbert"])  # Findings as every objective is.
  predictions = configs["spanbert"].data.max_predictions_per_seq
  head = span_boundary_flops(model_cfg, configs["spanbert"].batch_size, predictions, position_size)
  assert flops["spanbert"] - flops["bert_spans"] == 3 * head


def random_weights_are_fine_tuned_once_per_architecture_and_only_when_asked():
  with flagsaver.as_parsed(random_init="true", **DEFAULTS):
    assert objectives.random_init_contestants(MODERN) == ["bert", "modernbert_bert_recipe"]
    assert objectives.random_init_contestants(["modernbert", "bert_mlm30"]) == ["modernbert", "bert_mlm30"]
  with flagsaver.as_parsed(random_init="false", **DEFAULTS):
    assert objectives.random_init_contestants(MODERN) == []


def a_contestant_stopped_before_its_last_step_writes_no_result(workdir: str):
  """The pretraining job returns at the step a SIGTERM stopped it: the benchmark must not take that state for the
  contestant's result (it is read back, and never pretrained again, by every later run)."""
  stopped = TrainState(step=jnp.asarray(3), params={}, opt_state=())
  with flagsaver.as_parsed(**DEFAULTS, workdir=workdir):
    budget = 10 * objectives.flops_per_step(objectives.contestant_config("bert"))
    with mock.patch.object(objectives.pretraining, "pretrain", return_value=stopped) as pretrain:
      with pytest.raises(SystemExit, match="bert stopped at step 3 of 10; nothing written"):
        objectives.pretrain("bert", budget)
  assert pretrain.call_args.args[0].num_train_steps == 10 and pretrain.call_args.args[2] is not None  # Checked.
  assert not (pathlib.Path(workdir) / "bert" / "objective_result.json").exists()


def _glue(values: dict) -> dict:
  """finetune_glue's results for one task: per init, its members' final dev metric (seeds in order)."""
  return {
    "sst2": {
      f"{init} bert_jax:transformers": dict(main_metric="accuracy", final={"dev": [{"accuracy": v} for v in seeds]})
      for init, seeds in values.items()
    }
  }


def the_paired_table_sets_each_contestant_against_bert_and_its_architectures_random_weights():
  results = [
    dict(name="bert", glue=_glue({"pretrained": [0.60, 0.62, 0.64], "random": [0.50, 0.52, 0.51]})),
    dict(name="modernbert_bert_recipe", glue=_glue({"pretrained": [0.70, 0.71, 0.75], "random": [0.55, 0.50, 0.51]})),
    dict(name="modernbert", glue=_glue({"pretrained": [0.61, 0.66, 0.62]})),
  ]
  printed = io.StringIO()
  with flagsaver.as_parsed(**DEFAULTS), contextlib.redirect_stdout(printed):
    objectives._print_paired(results, ["sst2"])
  rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:] for line in printed.getvalue().splitlines()}
  # Differences by seed 10, 10, 13 (t = 11 with 2 degrees of freedom); 10, 9, 11; 1, 4, -2; 6, 16, 11.
  assert rows["bert"] == ["-", "+11.0 (p = 0.0082) |"]
  assert rows["modernbert_bert_recipe"] == ["+10.0 (p = 0.0033)", "+20.0 (p = 0.017) |"]
  assert rows["modernbert"] == ["+1.0 (p = 0.62)", "+11.0 (p = 0.062) |"]  # Against ModernBERT's random weights.
