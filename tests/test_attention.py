"""The fused attention kernels against the XLA path: the splash kernel (Pallas, in interpret mode on CPU) with packed
and unpacked rows, alone and sharded over the mesh inside the train step; which kernel "auto" takes; what the
config refuses."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import sharding
from bert_jax.data.pretraining_batch import pretraining_shapes
from bert_jax.model import attention, bert_config
from bert_jax.model.bert_config import BertConfig
from bert_jax.model.encoder import BertForPretraining
from bert_jax.model.mesh_context import with_activation_rules
from bert_jax.train import pretraining
from bert_jax.train.objectives import bert as bert_objective


def _packed_batch(config: BertConfig, batch=4, seq=160, predictions=6, seed=0) -> dict:
  """Rows of 1, 2 and 3 instances and padding; seq 160 is not a multiple of the kernel's block (128)."""
  rng = np.random.default_rng(seed)
  input_mask = np.zeros((batch, seq), np.int32)
  position_ids = np.zeros((batch, seq), np.int32)
  cls_positions = np.zeros((batch, 3), np.int32)
  next_sentence_weights = np.zeros((batch, 3), np.float32)
  for row, lengths in enumerate(([150], [40, 90], [30, 60, 50], [seq])):
    start = 0
    for instance, length in enumerate(lengths):
      input_mask[row, start : start + length] = instance + 1
      position_ids[row, start : start + length] = np.arange(length)
      cls_positions[row, instance] = start
      next_sentence_weights[row, instance] = 1
      start += length
  return dict(
    input_ids=rng.integers(0, config.vocab_size, (batch, seq)).astype(np.int32) * (input_mask > 0),
    input_mask=input_mask,
    segment_ids=((position_ids > 10) * (input_mask > 0)).astype(np.int32),
    position_ids=position_ids,
    cls_positions=cls_positions,
    masked_lm_positions=rng.integers(0, 30, (batch, predictions)).astype(np.int32),
    masked_lm_ids=rng.integers(0, config.vocab_size, (batch, predictions)).astype(np.int32),
    masked_lm_weights=np.ones((batch, predictions), np.float32),
    next_sentence_labels=rng.integers(0, 2, (batch, 3)).astype(np.int32),
    next_sentence_weights=next_sentence_weights,
  )


@pytest.fixture(scope="module")
def model_config() -> BertConfig:
  return BertConfig(
    vocab_size=101,
    hidden_size=32,
    num_layers=2,
    num_heads=2,
    intermediate_size=48,
    max_position_embeddings=160,
    hidden_dropout_prob=0.0,
    attention_dropout_prob=0.0,
  )


# ModernBERT's parts (model_type "modernbert"): rotary positions, local attention within 16 tokens each side (rows
# of 160), layers 0 and 3 global; scanned, layers 1-3 run as one scan that chooses each layer's span.
_MODERNBERT = dict(
  model_type="modernbert",
  num_layers=4,
  rope_theta=1000.0,
  local_rope_theta=50.0,
  local_attention=32,
  global_attention_every=3,
  norm_bias=False,
  linear_bias=False,
)


def _loss_and_grads(config: BertConfig, params, batch):
  loss = bert_objective.make_loss(None if config.model_type == "modernbert" else "nsp")
  return jax.jit(jax.value_and_grad(lambda p: loss.value(p, batch, BertForPretraining(config))[0]))(params)


def _outputs(config: BertConfig, params, inputs):
  return jax.jit(lambda p: BertForPretraining(config).apply({"params": p}, **inputs))(params)


@pytest.mark.parametrize(
  "packed, family",
  [(True, {}), (False, {}), (True, _MODERNBERT), (False, dict(_MODERNBERT, scan_layers=True))],
  ids=["bert-packed", "bert", "modernbert-packed", "modernbert-scanned"],
)
@pytest.mark.slow
def test_splash_equals_xla_in_outputs_and_gradients(model_config, packed, family):
  """Local windows smaller than the rows (ModernBERT's) compose with the instances' segment ids in the kernel."""
  model_config = dataclasses.replace(model_config, **family)
  batch = _packed_batch(model_config)
  if not packed:  # One instance per row, BERT's padding mask.
    batch.update(
      input_mask=(batch["input_mask"] > 0).astype(np.int32), next_sentence_labels=batch["next_sentence_labels"][:, 0]
    )
    del batch["position_ids"], batch["cls_positions"], batch["next_sentence_weights"]
  splash = dataclasses.replace(model_config, attention="splash")
  model = BertForPretraining(model_config)
  params = jax.jit(model.init)(jax.random.key(0), *model.dummy_inputs())["params"]
  inputs = bert_objective.model_inputs(batch)
  real = batch["input_mask"] > 0
  expected, actual = _outputs(model_config, params, inputs), _outputs(splash, params, inputs)
  np.testing.assert_allclose(actual["sequence_output"][real], expected["sequence_output"][real], atol=2e-5, rtol=0)
  np.testing.assert_allclose(actual["mlm_logits"], expected["mlm_logits"], atol=2e-5, rtol=0)
  if "nsp_logits" in expected:
    np.testing.assert_allclose(actual["nsp_logits"], expected["nsp_logits"], atol=2e-5, rtol=0)
  # A head mask (bertology's pruning and head importance) scales each head's context, in either kernel's layout.
  head_mask = jnp.asarray(
    np.random.default_rng(0).choice([0.0, 0.5, 1.0], (model_config.num_layers, model_config.num_heads)), jnp.float32
  )
  masked = dict(inputs, head_mask=head_mask)
  expected, actual = _outputs(model_config, params, masked), _outputs(splash, params, masked)
  np.testing.assert_allclose(actual["sequence_output"][real], expected["sequence_output"][real], atol=2e-5, rtol=0)

  expected_loss, expected_grads = _loss_and_grads(model_config, params, batch)
  actual_loss, actual_grads = _loss_and_grads(splash, params, batch)
  np.testing.assert_allclose(actual_loss, expected_loss, rtol=1e-6)
  for got, want in zip(jax.tree.leaves(actual_grads), jax.tree.leaves(expected_grads), strict=True):
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-4)


@pytest.mark.slow
def test_splash_sharded_over_the_mesh_equals_xla_in_loss_and_gradients(small_config):
  """Under run.make_run's mesh of 8 devices (batch over data x fsdp, heads over tensor), as the train step traces
  it: the kernel runs per shard (shard_map), forward and backward."""
  small_config.model.update(vocab_size=104, max_position_embeddings=160, hidden_dropout_prob=0.0)
  small_config.model.update(attention_dropout_prob=0.0, scan_layers=True)
  small_config.mesh.update(data=2, fsdp=2, tensor=2)
  small_config.data.update(max_seq_length=160, max_predictions_per_seq=6)
  small_config.batch_size = 4
  host_batch = _packed_batch(bert_config.model_config(small_config))
  assert {name: (v.shape, v.dtype) for name, v in host_batch.items()} == {
    name: (shape, np.dtype(dtype)) for name, (shape, dtype) in pretraining_shapes(4, 160, 6, 3).items()
  }
  results = {}
  for kind in ("xla", "splash"):
    small_config.model.attention = kind
    the_run = pretraining.make_run(small_config)
    batch = jax.device_put(host_batch, sharding.batch_sharding(the_run.mesh))

    def loss_and_grads(params, batch, the_run=the_run):
      value = lambda p: the_run.loss.value(p, batch, the_run.model)[0]
      return jax.value_and_grad(value)(params)

    sharded = jax.jit(
      with_activation_rules(loss_and_grads, the_run.mesh, the_run.rules),
      in_shardings=(the_run.shardings.params, sharding.batch_sharding(the_run.mesh)),
    )
    results[kind] = jax.device_get(sharded(the_run.init_state(0).params, batch))
  (xla_loss, xla_grads), (splash_loss, splash_grads) = results["xla"], results["splash"]
  np.testing.assert_allclose(splash_loss, xla_loss, rtol=1e-6)
  for got, want in zip(jax.tree.leaves(splash_grads), jax.tree.leaves(xla_grads), strict=True):
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-4)


def test_cudnn_path_passes_the_mask_and_scale_as_the_xla_path_computes(model_config):
  """The cudnn wrapper through jax.nn.dot_product_attention's XLA implementation (no GPU here): same context."""
  rng = np.random.default_rng(0)
  query, key, value = (jnp.asarray(rng.normal(size=(3, 24, 4, 8)), jnp.float32) for _ in range(3))
  input_mask = jnp.asarray(np.repeat([[1] * 10 + [2] * 8 + [0] * 6], 3, axis=0), jnp.int32)
  scores = jnp.einsum("bqhd,bkhd->bhqk", query, key)
  scores = jnp.where(attention.attention_mask(input_mask), scores, -jnp.inf)
  expected = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, -1), value)
  actual = attention.dot_product_attention(query, key, value, input_mask, implementation="xla")
  real = np.asarray(input_mask) > 0
  np.testing.assert_allclose(np.asarray(actual)[real], np.asarray(expected)[real], atol=1e-5)


def test_auto_takes_the_kernel_of_the_platform_only_without_attention_dropout():
  choose_kernel = attention.choose_kernel
  assert choose_kernel("auto", "tpu", attention_dropout_prob=0.0, dtype="float32") == "splash"
  assert choose_kernel("auto", "tpu", attention_dropout_prob=0.1, dtype="bfloat16") == "xla"
  assert choose_kernel("auto", "gpu", attention_dropout_prob=0.0, dtype="bfloat16") == "cudnn"
  assert choose_kernel("auto", "gpu", attention_dropout_prob=0.0, dtype="float32") == "xla"
  assert choose_kernel("auto", "cpu", attention_dropout_prob=0.0, dtype="bfloat16") == "xla"
  assert choose_kernel("splash", "cpu", attention_dropout_prob=0.0, dtype="float32") == "splash"  # Interpreted.


@pytest.mark.parametrize(
  "fields, message",
  [
    (dict(attention="splash"), r"attention_dropout_prob=0.1: set model.attention_dropout_prob=0"),
    (dict(attention="cudnn", attention_dropout_prob=0.0), r"'cudnn' runs in bfloat16 only"),
    (dict(attention="flash"), r"model.attention='flash' is not supported"),
  ],
)
def test_the_config_refuses_what_a_kernel_cannot_do(fields, message):
  with pytest.raises(ValueError, match=message):
    BertConfig(**fields)


def test_the_step_of_a_fused_kernel_is_checked_before_compiling(small_config):
  small_config.model.update(attention="splash", attention_dropout_prob=0.1)
  with pytest.raises(ValueError, match="no dropout on attention probabilities"):
    pretraining.make_run(small_config)
