import functools

import jax
import ml_collections
import numpy as np
import pytest

from bert_jax import progress, sharding
from bert_jax.data import instances as instances_lib
from bert_jax.data.pretraining_batch import check_pretraining_batch
from bert_jax.model.mesh_context import with_activation_rules
from bert_jax.train import pretraining, step
from bert_jax.train.objectives import bert as bert_objective
from tests.helpers import data_parallel_run, synthetic_batches


def _run(config, devices, batches):
  run, state = data_parallel_run(config, devices)
  key = jax.random.key(7)
  losses = []
  for batch in batches:
    state, metrics = run.train_step(state, sharding.global_batch(batch, run.mesh), key)
    losses.append(float(metrics["loss"]))
  return state, losses


@pytest.mark.slow
def test_eight_devices_data_parallel_equal_one_device(small_config):
  batches = synthetic_batches(small_config, 3)
  state_1, losses_1 = _run(small_config, jax.devices()[:1], batches)
  state_8, losses_8 = _run(small_config, jax.devices(), batches)
  assert len(jax.devices()) == 8
  np.testing.assert_allclose(losses_8, losses_1, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5), state_8.params, state_1.params)
  assert int(state_8.step) == 3


def test_state_is_created_directly_into_its_shardings(small_config):
  small_config.mesh.update(data=4, fsdp=2)
  small_config.logical_axis_rules = (
    ("vocab", None),
    ("embed", "fsdp"),
    ("embed_out", None),
    ("mlp", None),
    ("heads", None),
    ("kv", None),
  )
  small_config.ema_decay = 0.999
  state = pretraining.make_run(small_config).init_state(0)
  kernel = state.params["bert"]["layer_0"]["intermediate"]["kernel"]  # [embed, mlp], embed -> fsdp
  assert kernel.sharding.spec == jax.sharding.PartitionSpec("fsdp", None)
  assert {shard.data.shape for shard in kernel.addressable_shards} == {(16, 48)}
  adam_mu = state.opt_state[1][0].mu["bert"]["layer_0"]["intermediate"]["kernel"]
  assert adam_mu.sharding == kernel.sharding  # Optimizer moments follow their parameter.
  average = state.ema["bert"]["layer_0"]["intermediate"]["kernel"]  # The moving average of the parameters, too.
  assert average.sharding == kernel.sharding and np.array_equal(average, kernel)


@pytest.mark.slow
def test_training_fits_a_fixed_batch(small_config):
  small_config.update(learning_rate=3e-3, warmup_steps=0, num_train_steps=1000)  # ~constant lr
  small_config.model.update(hidden_dropout_prob=0.0, attention_dropout_prob=0.0)
  batch = synthetic_batches(small_config, 1)[0]
  _, losses = _run(small_config, jax.devices()[:1], [batch] * 60)
  assert losses[-1] < 0.2 * losses[0], losses


def test_metrics_are_sums_with_denominators(small_config):
  run, state = data_parallel_run(small_config, jax.devices())
  batch = synthetic_batches(small_config, 1)[0]
  metrics = run.eval_step(state.params, sharding.global_batch(batch, run.mesh))
  assert float(metrics["mlm_count"]) == batch["masked_lm_weights"].sum()
  assert float(metrics["nsp_count"]) == small_config.batch_size
  assert 0 <= float(metrics["mlm_accuracy"]) <= float(metrics["mlm_count"])
  # Untrained: about ln(vocab) per masked token.
  np.testing.assert_allclose(float(metrics["mlm_loss"]) / float(metrics["mlm_count"]), np.log(101), rtol=0.1)


def test_mlm_weights_exclude_padding_predictions(small_config):
  run, state = data_parallel_run(small_config, jax.devices()[:1])
  batch = synthetic_batches(small_config, 1)[0]
  before = run.eval_step(state.params, sharding.global_batch(batch, run.mesh))
  changed = dict(batch, masked_lm_ids=np.where(batch["masked_lm_weights"] > 0, batch["masked_lm_ids"], 99))
  after = run.eval_step(state.params, sharding.global_batch(changed, run.mesh))
  assert (batch["masked_lm_weights"] == 0).any()
  np.testing.assert_allclose(float(after["mlm_loss"]), float(before["mlm_loss"]), rtol=1e-6)


@pytest.mark.parametrize("name", ["input_ids", "masked_lm_ids"])
def test_out_of_vocabulary_ids_stop_before_the_step(small_config, name):
  batch = synthetic_batches(small_config, 1)[0]
  batch[name][0, 1] = small_config.model.vocab_size
  with pytest.raises(ValueError, match=rf"{name}\[0, 1\] = 101 is outside \[0, 101\)"):
    check_pretraining_batch(
      batch, batch_size=8, max_seq_length=32, max_predictions_per_seq=5, vocab_size=101, type_vocab_size=2
    )


def test_the_sentence_loss_is_on_for_nsp_and_sop_only_and_its_metrics_are_shown_only_then(small_config):
  small_config.data.instances = "sop"  # The config's data.instances picks the run's sentence task.
  run, state = data_parallel_run(small_config, jax.devices()[:1])
  assert run.loss.value.keywords == {"sentence_task": "sop"}
  for instances, task in (("nsp", "nsp"), ("doc_sentences", None), ("full_sentences", None)):
    assert instances_lib.sentence_task(ml_collections.ConfigDict(dict(instances=instances))) == task
  batch = sharding.global_batch(synthetic_batches(small_config, 1)[0], run.mesh)
  tasks = (None, "nsp", "sop")
  losses = jax.jit(
    lambda params, batch: [bert_objective.pretraining_loss(params, batch, run.model, sentence_task=t) for t in tasks]
  )(state.params, batch)
  (loss, metrics), with_tasks = losses[0], dict(zip(tasks[1:], losses[1:], strict=True))
  np.testing.assert_allclose(float(loss), float(metrics["mlm_loss"]) / (float(metrics["mlm_count"]) + 1e-5), rtol=1e-6)
  assert not [name for name in metrics if name.startswith(("nsp", "sop"))] and float(metrics["row_instances"]) == 8
  for task, (with_task, task_metrics) in with_tasks.items():  # The same head and labels, named for the task.
    assert {name for name in task_metrics if name.startswith(task)} == {
      f"{task}_{m}" for m in ("loss", "accuracy", "count")
    }
    np.testing.assert_allclose(float(with_task) - float(loss), float(task_metrics[f"{task}_loss"]) / 8, rtol=1e-5)
  # The progress and eval lines show the sentence task's metrics only when there is one.
  assert bert_objective.shown_metrics(None, evaluation=True) == ("mlm_loss", "mlm_accuracy")
  assert bert_objective.shown_metrics("sop") == ("mlm_loss", "mlm_accuracy", "sop_accuracy")
  summary = progress.summarize(jax.device_get(metrics), 1)
  assert progress.format_metrics(summary, ("mlm_loss", "nsp_accuracy")) == f" | mlm_loss {summary['mlm_loss']:.4f}"


def test_a_family_without_a_sentence_head_trains_its_masked_lm_alone(small_config):
  """ModernBERT's pretraining model has no sentence head (no `nsp_logits`), and its rows carry no sentence task: the
  loss is the masked LM's, and it falls on a fixed batch."""
  small_config.model.update(
    model_type="modernbert", rope_theta=10_000.0, local_attention=8, global_attention_every=2, linear_bias=False
  )
  small_config.data.instances = "full_sentences"
  run, state = data_parallel_run(small_config, jax.devices()[:1])
  assert run.loss.value.keywords == {"sentence_task": None}
  batch = sharding.global_batch(synthetic_batches(small_config, 1)[0], run.mesh)
  losses = []
  for _ in range(4):
    state, metrics = run.train_step(state, batch, jax.random.key(7))
    losses.append(float(metrics["loss"]))
  assert not [name for name in metrics if name.startswith(("nsp", "sop"))]
  mlm_loss = float(metrics["mlm_loss"]) / (float(metrics["mlm_count"]) + 1e-5)
  np.testing.assert_allclose(losses[-1], mlm_loss, rtol=1e-5)
  assert losses[-1] < losses[0], losses


@pytest.mark.slow
def test_gradient_accumulation_equals_the_full_batch(small_config):
  small_config.batch_size = 16
  run, state = data_parallel_run(small_config, jax.devices()[:2])
  batch = sharding.global_batch(synthetic_batches(small_config, 1)[0], run.mesh)

  def grads(num_microbatches):
    fn = functools.partial(step.gradients, model=run.model, loss=run.loss, num_microbatches=num_microbatches)
    fn = with_activation_rules(fn, run.mesh, run.rules)
    return jax.jit(fn)(state.params, batch, None)  # No dropout: the same function of the same inputs.

  (full_loss, full_metrics), full_grads = grads(1)
  (loss, metrics), accumulated = grads(4)
  np.testing.assert_allclose(loss, full_loss, rtol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5), metrics, full_metrics)
  scale = max(float(np.abs(g).max()) for g in jax.tree.leaves(full_grads))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5 * scale, rtol=1e-4), accumulated, full_grads)

  # The pretraining run's held-out step takes its batch in the train step's slices: the same metric sums.
  small_config.num_microbatches = 4
  sliced = pretraining.make_run(small_config, jax.devices()[:2])
  programs = [str(r.eval_step.trace(state.params, batch).jaxpr) for r in (sliced, run)]
  assert "length=4" in programs[0] and "length=4" not in programs[1]  # A loop over 4 slices.
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5),
    sliced.eval_step(state.params, batch),
    run.eval_step(state.params, batch),
  )

  # A batch that does not split evenly is refused before anything is compiled.
  with pytest.raises(ValueError, match="microbatch"):
    sharding.check_batch_size(16, run.mesh, num_microbatches=16)
