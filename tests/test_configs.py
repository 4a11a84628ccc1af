"""Every shipped config passes the checks, every out-of-range value is refused before anything is written, the two
BERT-Large phases fit together, as do ModernBERT's phase 1 and context extension, the tiny ModernBERT learns, and
ModernBERT's GLUE recipe decays weights as its reference does."""

import functools
import importlib
import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax import config_checks, jobs
from bert_jax.handoff import pretrained
from bert_jax.model.bert_config import ARCHITECTURE_FIELDS, SIZE_FIELDS
from bert_jax.train.optim import Steps, make_optimizer, make_schedule
from configs import (
  default,
  glue_modernbert,
  large,
  large_phase2,
  modernbert_base,
  modernbert_context_extension,
  modernbert_large,
  modernbert_large_context_extension,
  modernbert_tiny,
  tiny,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]
NAMES = sorted(p.stem for p in (ROOT / "configs").glob("*.py") if p.stem != "__init__")


# The shipped configs whose placeholder path (gs://BUCKET/...) must be replaced before they run: the key it is in.
PLACEHOLDERS = {
  "distil": "distill.teacher",
  "ettin_base": ("data.mixture_sources", "tokenizer.path"),
  "large_phase2": "init_from",
  "mmbert_base": ("data.mixture_sources", "tokenizer.path"),
  "modernbert_context_extension": "init_from",
  "modernbert_large_context_extension": "init_from",
}


@pytest.mark.parametrize("name", NAMES)
def test_every_config_passes_the_checks_of_its_mode(name):
  config = importlib.import_module(f"configs.{name}").get_config()
  mode = "finetune" if config.finetune.task else "pretrain"
  if config.finetune.task in ("conll2003", "swag", "embeddings"):
    config.finetune.data_dir = "gs://bucket/data"  # Their docstrings' commands set it.
  keys = PLACEHOLDERS.get(name, ())
  for key in (keys,) if isinstance(keys, str) else keys:  # Refused as shipped, naming the key, at once (no network
    # call); a dry run compiles it.
    with pytest.raises(ValueError, match=rf"^{re.escape(key)}='[^']*gs://BUCKET/.*' names the placeholder bucket"):
      jobs.check(config, mode)
    if key == "init_from":  # A pretraining dry run compiles phase 2 without reading phase 1.
      jobs.check(config, "dry_run")
    *parents, last = key.split(".")
    node = functools.reduce(lambda node, parent: node[parent], parents, config)
    node[last] = node[last].replace("gs://BUCKET/", "gs://bucket/")
  checked = jobs.check(config, mode)
  assert checked.mode == mode and checked.model.num_layers == config.model.num_layers
  if mode == "finetune":
    assert len(checked.members) == max(len(config.sweep.learning_rates.split(",")), 1) * config.sweep.seeds


def test_the_checked_task_names_are_the_tasks_fine_tuning_builds():
  from bert_jax.finetune import tasks

  assert sorted(config_checks.TASKS) == sorted(tasks.NAMES)


FINETUNING_BAD_VALUES = [
  ("sweep.learning_rates", "1e-4,inf", "every learning rate must be positive and finite"),
  ("sweep.learning_rates", "nan", "every learning rate must be positive and finite"),
  ("sweep.learning_rates", "2e-5,0", "every learning rate must be positive and finite"),
  ("sweep.learning_rates", "2e-5;3e-5", "is not a comma-separated list of numbers"),
  ("sweep.seeds", 0, "sweep.seeds=0 must be at least 1."),
  ("finetune.num_epochs", 0.0, "finetune.num_epochs=0.0 must be positive."),
  ("finetune.warmup_fraction", 1.0, "finetune.warmup_fraction=1.0 must be in [0, 1)."),
  ("finetune.max_seq_length", 7, "finetune.max_seq_length=7 must be at least 8."),
  ("finetune.task", "mnli-x", "finetune.task='mnli-x'; expected one of"),
  ("finetune.task", "swag", "finetune.task='swag' reads files: set finetune.data_dir."),
  ("finetune.max_seq_length", 1024, "finetune.max_seq_length=1024 exceeds model.max_position_embeddings=512."),
  ("ema_decay", 0.999, "ema_decay=0.999: the moving average of the parameters is pretraining's; fine-tuning keeps"),
]


@pytest.mark.parametrize(
  "key,value,message", FINETUNING_BAD_VALUES, ids=[f"{key}={value}" for key, value, _ in FINETUNING_BAD_VALUES]
)
def test_a_bad_fine_tuning_value_is_refused_naming_it(key, value, message):
  from configs import glue

  config = glue.get_config()
  *parents, name = key.split(".")
  functools.reduce(lambda node, parent: node[parent], parents, config)[name] = value
  with pytest.raises(ValueError, match=re.escape(message)):
    jobs.check(config, "finetune")


def test_phase_two_continues_phase_one_on_the_same_schedule():
  phase_1, phase_2 = large.get_config(), large_phase2.get_config()
  assert phase_1.model == phase_2.model and phase_1.optimizer == phase_2.optimizer  # Checkpoints load as they are.
  assert phase_1.schedule_end_step == phase_2.schedule_end_step == phase_2.num_train_steps == 1_000_000
  assert phase_1.num_train_steps == 900_000  # The paper: 90% of steps at 128, the rest at 512.
  assert (phase_1.data.max_seq_length, phase_2.data.max_seq_length) == (128, 512)
  assert phase_2.data.max_predictions_per_seq == 80 and phase_2.init_from
  schedule_1, schedule_2 = make_schedule(phase_1), make_schedule(phase_2)
  for step in (10_000, 899_999, 900_000):
    assert float(schedule_1(step)) == float(schedule_2(step))
  assert float(schedule_2(900_000)) == pytest.approx(1e-5, rel=1e-3)  # A tenth of the peak left for phase 2.


@pytest.mark.parametrize(
  "phase_1_module, extension_module",
  [(modernbert_base, modernbert_context_extension), (modernbert_large, modernbert_large_context_extension)],
  ids=["base", "large"],
)
def test_the_context_extension_continues_modernberts_phase_one_at_8192_tokens(phase_1_module, extension_module):
  phase_1, extension = phase_1_module.get_config(), extension_module.get_config()
  # Phase 1's checkpoints load as they are (same shapes, family and optimizer); only the global RoPE base rises.
  for name in (*SIZE_FIELDS, *ARCHITECTURE_FIELDS):
    assert phase_1.model[name] == extension.model[name], name
  assert phase_1.optimizer == extension.optimizer == "stable_adamw" and extension.init_from
  assert (phase_1.model.rope_theta, phase_1.model.local_rope_theta) == (10_000, 10_000)
  assert (extension.model.rope_theta, extension.model.local_rope_theta) == (160_000, 10_000)
  assert (phase_1.data.max_seq_length, extension.data.max_seq_length) == (1024, 8192)
  for config in (phase_1, extension):  # 30% of a full row fits: the cap never lowers the masking rate.
    assert config.data.max_predictions_per_seq >= round(0.3 * config.data.max_seq_length)
  # Phase 1 holds its peak to its end; the extension continues its step count at its own peak, 250B tokens, then
  # decays by 1-sqrt over its last 50B tokens to 0.001 of it.
  end_1, end = phase_1_module.PHASE_1_STEPS, extension.num_train_steps
  assert float(make_schedule(phase_1)(end_1)) == pytest.approx(phase_1.learning_rate)
  schedule = make_schedule(extension)
  tokens_per_step = extension.batch_size * extension.data.max_seq_length
  decay_start = end - round(50e9 / tokens_per_step)
  assert (decay_start - end_1) * tokens_per_step == pytest.approx(250e9, rel=1e-4)
  for step in (end_1, decay_start):
    assert float(schedule(step)) == pytest.approx(extension.learning_rate)
  assert float(schedule(decay_start + 1)) < extension.learning_rate
  assert float(schedule(end)) == pytest.approx(1e-3 * extension.learning_rate)


# (key, bad value, what the error says): every value the issue names, and one per other range checked.
BAD_VALUES = [
  ("learning_rate", -1.0, "learning_rate=-1.0 must be positive."),
  ("learning_rate", float("nan"), "learning_rate=nan must be positive."),
  ("max_grad_norm", 0.0, "max_grad_norm=0.0 must be in (0, inf]. inf disables clipping."),
  ("adam_b1", 1.5, "adam_b1=1.5 must be in [0, 1)."),
  ("adam_b2", 1.0, "adam_b2=1.0 must be in [0, 1)."),
  ("adam_eps", 0.0, "adam_eps=0.0 must be positive."),
  ("weight_decay", -0.01, "weight_decay=-0.01 must be non-negative."),
  ("warmup_steps", -1, "warmup_steps=-1 must be non-negative."),
  ("seed", -1, "seed=-1 must be non-negative."),
  ("lease_timeout_seconds", 0.0, "lease_timeout_seconds=0.0 must be positive."),
  ("keep_checkpoints", 0, "keep_checkpoints=0 must be at least 1."),
  ("model.initializer_range", 0.0, "model.initializer_range=0.0 must be positive."),
  ("model.layer_norm_eps", -1e-12, "model.layer_norm_eps=-1e-12 must be positive."),
  ("model.attention_dropout_prob", 1.0, "model.attention_dropout_prob must be in [0, 1), got 1.0."),
  ("model.vocab_size", 10**12, "model.vocab_size=1000000000000 must be in [1, 16777216] (2**24, 18 times the"),
  ("guard.nonfinite", "ignore", "guard.nonfinite='ignore'; expected one of ('skip', 'stop')."),
  ("guard.spike_factor", 0.5, "guard.spike_factor=0.5 must be 0 (off) or greater than 1."),
  ("guard.spike_window", 0, "guard.spike_window=0 must be at least 1."),
  ("guard.max_consecutive_skips", 0, "guard.max_consecutive_skips=0 must be at least 1."),
  ("data.masked_lm_prob", 1.5, "data.masked_lm_prob=1.5 must be in (0, 1]."),
  ("data.masked_lm_prob", 0.0, "data.masked_lm_prob=0.0 must be in (0, 1]."),
  ("data.short_seq_prob", 2.0, "data.short_seq_prob=2.0 must be in [0, 1]."),
  ("data.mask_token_fraction", 1.5, "data.mask_token_fraction=1.5 must be in [0, 1]."),
  ("data.random_token_fraction", -0.1, "data.random_token_fraction=-0.1 must be in [0, 1]."),
  ("data.random_token_fraction", 0.3, "data.mask_token_fraction=0.8 and data.random_token_fraction=0.3 add up to 1.1"),
  ("data.span_geometric_p", 0.0, "data.span_geometric_p=0.0 must be in (0, 1]."),
  ("data.span_max_words", 0, "data.span_max_words=0 must be at least 1."),
  ("data.shuffle_buffer", 0, "data.shuffle_buffer=0 must be at least 1."),
  ("data.num_shards", 0, "data.num_shards=0 must be at least 1."),
  ("data.masking", "whole_words", "data.masking='whole_words'; expected one of ('tokens', 'words', 'spans')."),
  ("data.instances", "roberta", "data.instances='roberta'; expected one of ('nsp', 'sop', 'doc_sentences', 'full"),
  ("tokenizer.train_max_sentences", 0, "tokenizer.train_max_sentences=0 must be at least 1."),
  ("eval_steps", -1, "eval_steps=-1 must be non-negative. 0 disables evaluation."),
  ("electra.generator_hidden_fraction", 0.0, "electra.generator_hidden_fraction=0.0 must be in (0, 1]."),
  ("electra.generator_layers_fraction", 1.5, "electra.generator_layers_fraction=1.5 must be in (0, 1]."),
  ("electra.rtd_weight", -1.0, "electra.rtd_weight=-1.0 must be non-negative."),
  ("electra.sampling_temperature", 0.0, "electra.sampling_temperature=0.0 must be positive."),
  ("batch_warmup_tokens", -1, "batch_warmup_tokens=-1 must be non-negative. 0: no batch-size warmup."),
  ("ema_decay", 1.0, "ema_decay=1.0 must be in [0, 1). 0: no moving average of the parameters."),
  ("ema_decay", -0.5, "ema_decay=-0.5 must be in [0, 1)."),
]
# Values at the edges of those ranges, and the sentinels, that must pass.
GOOD_VALUES = [
  ("max_grad_norm", float("inf")),
  ("adam_b1", 0.0),
  ("weight_decay", 0.0),
  ("warmup_steps", 0),
  ("guard.spike_factor", 0.0),
  ("guard.spike_factor", 1.5),
  ("data.masked_lm_prob", 1.0),
  ("data.short_seq_prob", 0.0),
  ("data.random_token_fraction", 0.2),  # With mask_token_fraction 0.8: nothing stays unchanged.
  ("data.span_geometric_p", 1.0),
  ("data.short_seq_prob", 1.0),
  ("data.shuffle_buffer", 1),
  ("eval_steps", 0),
  ("model.vocab_size", 2**24),
  ("ema_decay", 0.0),
  ("ema_decay", 0.9999),
]


def _tiny_with(key: str, value):
  config = tiny.get_config()
  *parents, name = key.split(".")
  node = functools.reduce(lambda node, parent: node[parent], parents, config)
  node[name] = value
  return config


@pytest.mark.parametrize("key,value,message", BAD_VALUES, ids=[f"{key}={value}" for key, value, _ in BAD_VALUES])
def test_an_out_of_range_value_is_refused_naming_key_value_and_range(key, value, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    config_checks.check_pretraining(_tiny_with(key, value))


@pytest.mark.parametrize("key,value", GOOD_VALUES, ids=[f"{key}={value}" for key, value in GOOD_VALUES])
def test_the_edges_of_each_range_pass(key, value):
  config_checks.check_pretraining(_tiny_with(key, value))


# (keys with a warmup on configs/tiny.py's batch of 32, what the error says); the mesh's share: tests/test_train.py.
BAD_BATCH_WARMUPS = [
  (dict(), "batch_warmup_start=0 must be in [1, batch_size=32): the warmup's first batch, in rows"),
  (dict(batch_warmup_start=64), "batch_warmup_start=64 must be in [1, batch_size=32)"),
  (dict(batch_warmup_start=32), "batch_warmup_start=32 must be in [1, batch_size=32)"),
  (
    dict(batch_warmup_start=12),
    "batch_size=32 is not a multiple of batch_warmup_start=12: the warmup's sizes are 12, 24",
  ),
  (
    dict(batch_warmup_start=1),
    "batch_warmup_start=1 makes 32 batch sizes up to batch_size=32, each its own compiled train step; expected at "
    "most 16: a batch_warmup_start of at least 2",
  ),
  (dict(batch_warmup_start=8, num_microbatches=16), "batch_warmup_start=8 does not split into num_microbatches=16"),
  (
    dict(batch_warmup_start=8, data=dict(num_readers=16)),
    "batch_warmup_start=8 does not split over data.num_readers=16",
  ),
]


@pytest.mark.parametrize("keys, message", BAD_BATCH_WARMUPS, ids=[message[:40] for _, message in BAD_BATCH_WARMUPS])
def test_a_bad_batch_warmup_is_refused_naming_its_keys(keys, message):
  config = tiny.get_config()
  config.update(dict(batch_warmup_tokens=10_000, **keys))
  with pytest.raises(ValueError, match=re.escape(message)):
    config_checks.check_pretraining(config)


def test_a_batch_warmup_passes_its_checks_in_pretraining_and_is_refused_in_fine_tuning():
  from configs import glue

  config = tiny.get_config()
  config.update(dict(batch_warmup_tokens=10_000, batch_warmup_start=8, num_microbatches=8))
  config.data.num_readers = 4
  config_checks.check_pretraining(config)
  config = glue.get_config()
  config.update(dict(batch_warmup_tokens=10_000, batch_warmup_start=8))
  with pytest.raises(ValueError, match=re.escape("batch_warmup_tokens=10000: the batch-size warmup is pretraining's")):
    jobs.check(config, "finetune")


def test_data_masking_and_the_older_masking_keys_are_checked_together(caplog):
  def notes():
    return [record.getMessage() for record in caplog.records if "deprecated" in record.getMessage()]

  for scheme in ("tokens", "words", "spans"):
    config_checks.check_pretraining(_tiny_with("data.masking", scheme))
  assert not notes()
  # An older key alone still works, read as data.masking's spelling, with a note naming both.
  for key, scheme in (("whole_word_masking", "words"), ("span_masking", "spans")):
    caplog.clear()
    config_checks.check_pretraining(_tiny_with(f"data.{key}", True))
    assert notes() == [f"data.{key}=True is deprecated: write data.masking={scheme!r} instead."]
  config = _tiny_with("data.masking", "spans")
  config.data.whole_word_masking = False  # What older configs wrote beside span_masking=True: it agrees.
  config_checks.check_pretraining(config)
  contradictions = [
    (dict(whole_word_masking=True, span_masking=True), "data.whole_word_masking=True and data.span_masking=True"),
    (dict(masking="words", span_masking=True), "data.span_masking=True contradicts data.masking='words'"),
    (dict(masking="spans", whole_word_masking=True), "data.whole_word_masking=True contradicts data.masking='spans'"),
    (dict(masking="words", whole_word_masking=False), "data.whole_word_masking=False contradicts data.masking='words'"),
  ]
  for keys, message in contradictions:
    config = tiny.get_config()
    config.data.update(keys)
    with pytest.raises(ValueError, match=re.escape(message)):
      config_checks.check_pretraining(config)


def test_data_instances_and_the_older_next_sentence_prediction_key_are_checked_together():
  config = _tiny_with("data.instances", "sop")
  config.data.next_sentence_prediction = True
  with pytest.raises(
    ValueError, match=re.escape("data.next_sentence_prediction=True contradicts data.instances='sop'")
  ):
    config_checks.check_pretraining(config)
  config.data.next_sentence_prediction = False  # No next-sentence prediction: true of sentence order too.
  config_checks.check_pretraining(config)
  config = _tiny_with("data.instances", "full_sentences")
  config.data.pack_instances = True
  with pytest.raises(ValueError, match=re.escape("data.pack_instances=True with data.instances='full_sentences'")):
    config_checks.check_pretraining(config)


def test_a_sentence_task_for_a_family_without_a_sentence_head_is_refused():
  config = _tiny_with("model.model_type", "modernbert")
  config.model.update(rope_theta=160000.0, max_position_embeddings=config.data.max_seq_length)
  with pytest.raises(ValueError, match=re.escape("model.model_type='modernbert' has no sentence head")):
    config_checks.check_pretraining(config)
  config.data.instances = "full_sentences"
  config_checks.check_pretraining(config)


def test_an_infinite_max_grad_norm_leaves_the_update_unclipped():
  def first_update(max_grad_norm: float) -> np.ndarray:
    # With this epsilon Adam's first step is about linear in the gradient, so clipping shows in the update.
    config = default.get_config()
    config.update(max_grad_norm=max_grad_norm, warmup_steps=0, adam_eps=1e6, weight_decay=0.0)
    tx = make_optimizer(config)
    params = {"dense": {"kernel": jnp.zeros(4)}}
    grads = {"dense": {"kernel": jnp.full(4, 1e3)}}  # Global norm 2000.
    return np.asarray(tx.update(grads, tx.init(params), params)[0]["dense"]["kernel"])

  unclipped = first_update(float("inf"))
  assert np.isfinite(unclipped).all()
  np.testing.assert_allclose(unclipped, -1e-4 * 1e3 / (1e3 + 1e6), rtol=1e-5)  # -lr * g / (|g| + eps), whole g.
  assert np.abs(first_update(1.0)).max() < np.abs(unclipped).max() / 100  # A finite norm does clip it.


@pytest.mark.parametrize(
  "flags,line",
  [
    (["--config.data.shuffle_buffer=0"], "--mode=pretrain: data.shuffle_buffer=0 must be at least 1."),
    (
      ["--mode=prepare", "--config.data.eval_fraction=0.9"],
      "--mode=prepare: data.eval_fraction=0.9 must be in [0, 0.5].",
    ),
  ],
)
def test_a_bad_value_stops_main_with_one_line_before_the_workdir_is_written(tmp_path, flags, line):
  workdir = tmp_path / "run"
  command = [sys.executable, "-m", "bert_jax.main", "--config=configs/tiny.py", f"--workdir={workdir}"]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  result = subprocess.run([*command, *flags], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert result.returncode == 1
  # One line, from config_checks in main, before TensorFlow is imported (its start-up lines) or anything written.
  assert result.stderr.strip() == line
  assert not workdir.exists()


@pytest.mark.slow
def test_the_tiny_modernbert_as_shipped_beats_word_frequencies_on_held_out_documents(tmp_path):
  """configs/modernbert_tiny.py, the ModernBERT recipe (30% masking, StableAdamW, wsd) at the quick start's scale,
  run as its docstring says: its last evaluation, at 15% masking on the held-out documents, is far above the unigram
  model's (0.38 against 0.096 in accuracy, 2.81 against 4.98 in loss: docs/benchmarks.md). Then its context
  extension starts from its workdir."""
  command = [sys.executable, "-m", "bert_jax.main", "--config=configs/modernbert_tiny.py", f"--workdir={tmp_path}"]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)  # One device, as on a laptop.
  result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "eval masking  15% of tokens" in result.stderr and "masking       30% of tokens" in result.stderr
  found = re.search(
    r"eval at step 550 \| mlm_loss ([\d.]+) \(unigram ([\d.]+)\) \| mlm_acc ([\d.]+) \(unigram ([\d.]+)\)",
    result.stderr,
  )
  assert found, result.stderr[-3000:]
  loss, unigram_loss, accuracy, unigram_accuracy = map(float, found.groups())
  assert accuracy >= 0.3 and accuracy > 3 * unigram_accuracy, found.group(0)
  assert loss < unigram_loss - 1.5, found.group(0)
  _the_context_extension_continues(tmp_path, unigram_loss)


def _the_context_extension_continues(phase_1_dir: pathlib.Path, unigram_loss: float):
  """ModernBERT's context extension (configs/modernbert_context_extension.py's `extend`) from the tiny phase 1's
  workdir, at twice its row length for a few steps: it continues phase 1's step, optimizer and tokenizer, its global
  layers' RoPE base raised to 160,000 (the local layers' kept), and its first steps train from phase 1's weights (a
  loss far below the unigram model's), not from fresh ones."""
  phase_1 = modernbert_tiny.get_config()
  config = modernbert_context_extension.extend(
    modernbert_tiny.get_config(),
    phase_1_steps=phase_1.num_train_steps,
    batch_size=8,
    num_microbatches=1,
    learning_rate=phase_1.learning_rate / 3,
    decoupled_weight_decay=modernbert_base.DECOUPLED_WEIGHT_DECAY,
  )
  length = 2 * phase_1.data.max_seq_length
  config.data.update(max_seq_length=length, max_predictions_per_seq=modernbert_base.max_predictions(length))
  config.update(num_train_steps=phase_1.num_train_steps + 3, lr_decay_fraction=0.5, warmup_steps=0)
  config.update(log_every_steps=1, eval_steps=0, checkpoint_every_steps=3, init_from=str(phase_1_dir))
  # Phase 1's tokenizer, as the run's refusal without it says (its copy in the checkpoint).
  config.tokenizer.path = str(phase_1_dir / "checkpoints" / str(phase_1.num_train_steps) / "tokenizer" / "spm.model")
  workdir = phase_1_dir.parent / "extension"
  state = jobs.run(config, str(workdir), "pretrain")
  assert int(state.step) == phase_1.num_train_steps + 3  # Phase 1's step count, continued.

  extended, first = pretrained.load(str(workdir)), pretrained.load(str(phase_1_dir))
  assert (first.config.rope_theta, first.config.local_rope_theta) == (10_000, 10_000)
  assert (extended.config.rope_theta, extended.config.local_rope_theta) == (160_000, 10_000)
  assert extended.tokenizer.identity()["sha256"] == first.tokenizer.identity()["sha256"]
  history = extended.source.history["train"]
  assert history["mlm_loss"] < unigram_loss - 1.0, history  # Phase 1's weights, not fresh ones (about 6.0).
  moved = jax.tree.leaves(jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))), extended.params, first.params))
  assert 0 < max(moved) < 0.05, max(moved)  # Three steps from phase 1's parameters.


def test_a_mistyped_tokenizer_path_with_the_embedded_corpus_is_refused_before_anything_is_written(tmp_path):
  from bert_jax.data import prepare

  config = tiny.get_config()
  config.tokenizer.path = str(tmp_path / "elsewhere" / "spm.modle")
  with pytest.raises(FileNotFoundError, match=r"tokenizer.path='.*spm.modle' does not exist. With data.embedded_corp"):
    prepare.prepare_for_run(config, str(tmp_path / "run"))
  assert not (tmp_path / "run").exists() and not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize("task", sorted(glue_modernbert.RECIPES))
def test_modernberts_glue_recipe_decays_a_weight_as_the_references_decoupled_adamw_does(task):
  """At the task's peak rate, a step with no gradient multiplies a kernel by 1 - the reference's decoupled decay
  (Composer's DecoupledAdamW: the decay not scaled by the rate), and the task, rate, batch and epochs are its."""
  config = glue_modernbert.get_config(task)
  rate, decay, epochs, batch = glue_modernbert.RECIPES[task]
  assert (config.finetune.task, config.learning_rate, config.batch_size) == (task, rate, batch)
  assert (config.finetune.num_epochs, config.adam_b2, config.max_grad_norm) == (epochs, 0.98, float("inf"))
  tx = make_optimizer(config, steps=Steps(0, 10))
  params = {"dense": {"kernel": jnp.full((3,), 2.0)}}
  new = optax.apply_updates(params, tx.update(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)[0])
  np.testing.assert_allclose(new["dense"]["kernel"], 2.0 * (1 - decay), rtol=1e-6)
  checked = jobs.check(config, "finetune")
  assert checked.members[0].learning_rate == rate


def test_modernberts_glue_recipe_names_an_unknown_task():
  with pytest.raises(ValueError, match=r"configs/glue_modernbert.py:mnli-x: expected one of \['cola', "):
    glue_modernbert.get_config("mnli-x")
