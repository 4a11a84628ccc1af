"""The checks of tests/test_benchmark_objectives.py for bert_jax/benchmarks/finetune_glue.py, run there each in a
fresh interpreter (its absl flags --glue_dir, --vocab ... are defined by other benchmark modules too)."""

import pathlib
from types import SimpleNamespace
from unittest import mock

import pytest
from absl import flags
from absl.testing import flagsaver

from bert_jax.benchmarks import finetune_glue, random_start
from bert_jax.finetune import plan
from bert_jax.model.bert_config import BertConfig


def a_fine_tuning_stopped_before_its_last_step_writes_no_metrics(workdir: str):
  """The fine-tuning job returns None when a SIGTERM stopped it: no metrics.json, which later runs would read back as
  final."""
  with flagsaver.as_parsed(workdir=workdir, glue_dir="/glue", vocab="vocab.txt", init_from="/pretrained"):
    with mock.patch.object(finetune_glue, "_config", return_value=None):
      with mock.patch.object(finetune_glue.jobs, "run", return_value=None) as run:
        with pytest.raises(SystemExit, match="sst2/pretrained/bert_jax:transformers stopped before its last step"):
          finetune_glue._run("sst2", "pretrained", "bert_jax:transformers")
  assert run.call_count == 1
  assert not list(pathlib.Path(workdir).rglob("metrics.json"))


def random_weights_are_those_of_the_model_the_pretrained_run_fine_tunes(workdir: str):
  """The random mark is the pretrained contestant's model with fresh weights: a ModernBERT's RoPE bases, local window,
  norms, dropout (0) and head all come from the source, not only its sizes (a ModernBERT's random run had no
  rotary base and was refused)."""
  source = SimpleNamespace(
    config=BertConfig(
      model_type="modernbert",
      vocab_size=64,
      hidden_size=32,
      num_layers=3,
      num_heads=2,
      intermediate_size=48,
      rope_theta=160_000.0,
      local_rope_theta=10_000.0,
      local_attention=8,
      global_attention_every=3,
      norm_bias=False,
      linear_bias=False,
      hidden_dropout_prob=0.0,
      attention_dropout_prob=0.0,
      classifier_pooling="mean",
    )
  )
  flags.FLAGS.mark_as_parsed()  # Every other flag at its default.
  with flagsaver.as_parsed(workdir=workdir, glue_dir="/glue", vocab="vocab.txt", init_from="/pretrained"):
    with mock.patch.object(random_start.formats, "read_source", return_value=source):
      pretrained_run = finetune_glue._config("sst2", "pretrained", "transformers")
      random_run = finetune_glue._config("sst2", "random", "transformers")
  assert not random_run.init_from and random_run.tokenizer.path == "vocab.txt"
  random_model = plan.model_config(random_run, None)
  assert random_model == plan.model_config(pretrained_run, source)
  assert (random_model.rope_theta, random_model.local_attention, random_model.hidden_dropout_prob) == (160_000.0, 8, 0)


def the_modernbert_recipe_is_the_references_per_task_and_flags_override_it_only_where_given(workdir: str):
  """--recipe=modernbert takes each task's rate, epochs, rows and batch from configs/glue_modernbert.py (the
  program's own defaults, BERT's 3e-4 among them, do not leak into it); a flag given on the command line wins."""
  from configs import glue_modernbert

  flags.FLAGS.mark_as_parsed()
  with flagsaver.as_parsed(workdir=workdir, glue_dir="/glue", vocab="vocab.txt", init_from="/p", recipe="modernbert"):
    rte, cola = finetune_glue._recipe("rte"), finetune_glue._recipe("cola")
  assert (rte.learning_rate, rte.sweep.learning_rates, rte.batch_size, rte.finetune.num_epochs) == (1e-5, "", 16, 3)
  assert (rte.finetune.max_seq_length, rte.adam_b2, rte.max_grad_norm) == (256, 0.98, float("inf"))
  cola_rate, _, cola_epochs, _ = glue_modernbert.RECIPES["cola"]
  assert (cola.learning_rate, cola.finetune.num_epochs) == (cola_rate, cola_epochs)
  given = dict(recipe="modernbert", learning_rates="3e-4", max_seq_length="default:128")
  with flagsaver.as_parsed(workdir=workdir, glue_dir="/glue", vocab="vocab.txt", init_from="/p", **given):
    rte = finetune_glue._recipe("rte")
  assert (rte.sweep.learning_rates, rte.finetune.max_seq_length, rte.batch_size, rte.adam_b2) == ("3e-4", 128, 16, 0.98)
  with flagsaver.as_parsed(workdir=workdir, glue_dir="/glue", vocab="vocab.txt", init_from="/p"):  # BERT's recipe.
    rte = finetune_glue._recipe("rte")
  assert (rte.sweep.learning_rates, rte.batch_size, rte.finetune.num_epochs, rte.adam_b2) == ("3e-4", 32, 2, 0.999)
