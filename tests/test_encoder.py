"""The model against the reference: Hugging Face's PyTorch `BertForPreTraining`, random weights, no download."""

import dataclasses

import flax.linen as nn
import helpers
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import transformers

from bert_jax.handoff.hf_configs import hf_config
from bert_jax.handoff.hf_format import load_safetensors, params_from_hf
from bert_jax.model import bert_config, param_layout, remat
from bert_jax.model.encoder import BertForPretraining
from bert_jax.train.objectives import bert as bert_objective


def _reference(config, seed=0, cls=transformers.BertForPreTraining, **hf_overrides):
  """transformers' `cls` (a model of `config`'s family, `hf_overrides` in its config) with random weights of `seed`."""
  torch.manual_seed(seed)
  model = cls(cls.config_class(**hf_config(config), **hf_overrides)).eval()
  with torch.no_grad():  # HF initialises LayerNorms to 1/0 and biases to 0; make every tensor matter.
    for name, param in model.named_parameters():
      if "LayerNorm" in name or name.endswith("bias"):
        param.add_(0.1 * torch.randn_like(param))
  return model


def _reference_outputs(hf_model, inputs, attentions=False):
  """`hf_model`'s outputs, every layer's hidden states included, on `_inputs`."""
  input_ids, input_mask, segment_ids, _ = inputs
  with torch.no_grad():
    return hf_model(
      torch.tensor(input_ids, dtype=torch.long),
      attention_mask=torch.tensor(input_mask),
      token_type_ids=torch.tensor(segment_ids, dtype=torch.long),
      output_hidden_states=True,
      output_attentions=attentions,
    )


def _inputs(config, batch=3, seq=24, predictions=6, seed=0):
  rng = np.random.default_rng(seed)
  input_ids = rng.integers(0, config.vocab_size, (batch, seq)).astype(np.int32)
  input_mask = np.ones((batch, seq), np.int32)
  input_mask[1, 15:] = 0  # Padding in two of the three rows.
  input_mask[2, 7:] = 0
  segment_ids = np.zeros((batch, seq), np.int32)
  segment_ids[:, 5:] = 1  # Both token types.
  segment_ids *= input_mask
  positions = rng.integers(0, seq, (batch, predictions)).astype(np.int32)
  return input_ids, input_mask, segment_ids, positions


def test_matches_hugging_face_bert_for_pretraining(small_model_config, tmp_path):
  config = small_model_config
  reference = _reference(config)
  reference.save_pretrained(tmp_path)  # The file format users have: model.safetensors.
  params = params_from_hf(load_safetensors(str(tmp_path / "model.safetensors")), config)

  input_ids, input_mask, segment_ids, positions = inputs = _inputs(config)
  expected = _reference_outputs(reference, inputs)
  with torch.no_grad():
    expected_sequence = expected.hidden_states[-1]
    expected_pooled = reference.bert.pooler(expected_sequence).numpy()
  expected_mlm = np.take_along_axis(expected.prediction_logits.numpy(), positions[:, :, None], axis=1)

  outputs = BertForPretraining(config).apply({"params": params}, input_ids, input_mask, segment_ids, positions)
  np.testing.assert_allclose(outputs["sequence_output"], expected_sequence.numpy(), atol=1e-5, rtol=0)
  np.testing.assert_allclose(outputs["pooled_output"], expected_pooled, atol=1e-5, rtol=0)
  np.testing.assert_allclose(outputs["mlm_logits"], expected_mlm, atol=1e-5, rtol=0)
  np.testing.assert_allclose(outputs["nsp_logits"], expected.seq_relationship_logits.numpy(), atol=1e-5, rtol=0)


def test_imported_tree_is_exactly_the_models_tree(small_model_config):
  config = small_model_config
  tensors = {name: value.numpy() for name, value in _reference(config).state_dict().items()}
  imported = params_from_hf(tensors, config)
  inputs = [jnp.zeros((1, 4), jnp.int32)] * 4
  initialised = nn.meta.unbox(BertForPretraining(config).init(jax.random.key(0), *inputs)["params"])
  assert jax.tree.structure(imported) == jax.tree.structure(initialised)
  assert jax.tree.map(np.shape, imported) == jax.tree.map(np.shape, initialised)


def test_imports_bert_model_files_and_old_gamma_beta_names(small_model_config):
  config = small_model_config
  tensors = {name: value.numpy() for name, value in _reference(config).state_dict().items()}
  encoder_only = {
    name.removeprefix("bert.")
    .replace("LayerNorm.weight", "LayerNorm.gamma")
    .replace("LayerNorm.bias", "LayerNorm.beta"): value
    for name, value in tensors.items()
    if name.startswith("bert.")
  }
  params = params_from_hf(encoder_only, config)
  assert set(params) == {"bert"}
  full = params_from_hf(tensors, config)
  jax.tree.map(np.testing.assert_array_equal, params["bert"], full["bert"])


def test_importer_names_what_is_wrong(small_model_config):
  config = small_model_config
  tensors = {name: value.numpy() for name, value in _reference(config).state_dict().items()}

  missing = dict(tensors)
  del missing["bert.encoder.layer.1.output.dense.weight"]
  with pytest.raises(ValueError, match=r"lack 1 tensor.*bert.encoder.layer.1.output.dense.weight"):
    params_from_hf(missing, config)

  with pytest.raises(ValueError, match=r"bert.embeddings.word_embeddings.weight has shape \(101, 32\)"):
    params_from_hf(tensors, config.__class__(**{**config.__dict__, "vocab_size": 100}))

  with pytest.raises(ValueError, match=r"no place for.*encoder.layer.1"):
    params_from_hf(tensors, config.__class__(**{**config.__dict__, "num_layers": 1}))

  untied = dict(tensors)
  untied["cls.predictions.decoder.weight"] = untied["cls.predictions.decoder.weight"] + 1.0
  with pytest.raises(ValueError, match="untied decoder"):
    params_from_hf(untied, config)


def test_every_parameter_has_logical_axis_names(small_model_config):
  inputs = [jnp.zeros((1, 4), jnp.int32)] * 4
  boxed = jax.eval_shape(BertForPretraining(small_model_config).init, jax.random.key(0), *inputs)["params"]
  leaves = jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
  assert leaves and all(isinstance(leaf, nn.LogicallyPartitioned) for leaf in leaves)
  for leaf in leaves:
    assert len(leaf.names) == leaf.value.ndim


def test_bfloat16_compute_keeps_float32_params_and_logits(small_model_config):
  config = small_model_config.__class__(**{**small_model_config.__dict__, "dtype": "bfloat16"})
  input_ids, input_mask, segment_ids, positions = _inputs(config)
  model = BertForPretraining(config)
  variables = model.init(jax.random.key(0), input_ids, input_mask, segment_ids, positions)
  assert {leaf.dtype for leaf in jax.tree.leaves(nn.meta.unbox(variables))} == {jnp.dtype("float32")}
  outputs = model.apply(variables, input_ids, input_mask, segment_ids, positions)
  assert outputs["sequence_output"].dtype == jnp.bfloat16
  assert outputs["mlm_logits"].dtype == outputs["nsp_logits"].dtype == jnp.float32
  reference = BertForPretraining(small_model_config).apply(variables, input_ids, input_mask, segment_ids, positions)
  np.testing.assert_allclose(outputs["nsp_logits"], reference["nsp_logits"], atol=0.1)


def test_padding_does_not_leak_into_real_tokens(small_model_config):
  input_ids, input_mask, segment_ids, positions = _inputs(small_model_config)
  model = BertForPretraining(small_model_config)
  variables = model.init(jax.random.key(0), input_ids, input_mask, segment_ids, positions)
  changed = input_ids.copy()
  changed[input_mask == 0] = 7  # Different tokens where the mask says padding.
  a = model.apply(variables, input_ids, input_mask, segment_ids, positions)["sequence_output"]
  b = model.apply(variables, changed, input_mask, segment_ids, positions)["sequence_output"]
  real = input_mask.astype(bool)
  np.testing.assert_allclose(a[real], b[real], atol=1e-6)


def test_dropout_is_active_in_training_and_a_function_of_the_key(small_model_config):
  input_ids, input_mask, segment_ids, positions = _inputs(small_model_config)
  model = BertForPretraining(small_model_config)
  variables = model.init(jax.random.key(0), input_ids, input_mask, segment_ids, positions)

  def run(key):
    return model.apply(
      variables,
      input_ids,
      input_mask,
      segment_ids,
      positions,
      deterministic=False,
      rngs={"dropout": jax.random.key(key)},
    )["nsp_logits"]

  np.testing.assert_array_equal(run(1), run(1))
  assert not np.allclose(run(1), run(2))


def _replace(config, **changes):
  return config.__class__(**{**config.__dict__, **changes})


def test_scanned_layers_equal_unrolled_and_layouts_convert_both_ways(small_model_config, tmp_path):
  config = _replace(small_model_config, num_layers=3)
  reference = _reference(config)
  reference.save_pretrained(tmp_path)
  unrolled = params_from_hf(load_safetensors(str(tmp_path / "model.safetensors")), config)
  scanned = param_layout.convert(unrolled, scanned=True)
  assert helpers.is_scanned(scanned) and not helpers.is_scanned(unrolled)

  # The converted tree is exactly the scanned model's own tree, names, shapes and logical axes included.
  scanned_model = BertForPretraining(_replace(config, scan_layers=True))
  inputs = _inputs(config)
  boxed = jax.eval_shape(scanned_model.init, jax.random.key(0), *inputs)["params"]
  assert jax.tree.map(np.shape, scanned) == jax.tree.map(np.shape, nn.meta.unbox(boxed))
  query = boxed["bert"]["layers"]["attention"]["query"]["kernel"]
  assert query.names == ("layers", "embed", "heads", "kv") and query.value.shape[0] == 3

  expected = BertForPretraining(config).apply({"params": unrolled}, *inputs)
  outputs = scanned_model.apply({"params": scanned}, *inputs)
  for name in expected:
    np.testing.assert_allclose(outputs[name], expected[name], atol=1e-6, rtol=1e-6)
  jax.tree.map(np.testing.assert_array_equal, param_layout.convert(scanned, scanned=False), unrolled)
  jax.tree.map(np.testing.assert_array_equal, param_layout.convert(unrolled, scanned=False), unrolled)


# Scanned layers with save_dots on an FSDP x TP mesh: tests/test_parallelism.py.
@pytest.mark.parametrize("scan_layers", [False, True])
@pytest.mark.slow
def test_remat_policies_leave_outputs_and_gradients_unchanged(small_model_config, scan_layers, monkeypatch):
  """Every named policy (model/remat.py) computes what a layer that keeps everything computes: the same loss and
  gradients, with dropout on (a policy that draws the masks again must draw the same ones)."""
  inputs = _inputs(small_model_config)
  policies = [name for name in remat.POLICY_NAMES if name != "offload_dense"]  # Host memory: TPU (test_tpu_compile).
  keep_everything = {"reference": jax.checkpoint_policies.everything_saveable}
  monkeypatch.setattr(remat, "policy", lambda name, policy=remat.policy: keep_everything.get(name) or policy(name))
  monkeypatch.setattr(bert_config, "REMAT_POLICIES", (*remat.POLICY_NAMES, "reference"))
  results = {}
  for policy in ("reference", *policies):
    model = BertForPretraining(_replace(small_model_config, remat=policy, scan_layers=scan_layers))
    params = nn.meta.unbox(model.init(jax.random.key(0), *inputs)["params"])

    def loss(params, model=model):
      outputs = model.apply(
        {"params": params}, *inputs, deterministic=False, rngs={"dropout": jax.random.key(1)}
      )  # Dropout on: rematerialisation must replay the same masks.
      return jnp.sum(outputs["mlm_logits"] ** 2) + jnp.sum(outputs["nsp_logits"])

    results[policy] = jax.jit(jax.value_and_grad(loss))(params)
  for policy in policies:
    np.testing.assert_allclose(results[policy][0], results["reference"][0], rtol=1e-6, err_msg=policy)
    jax.tree.map(
      lambda a, b, policy=policy: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4, err_msg=policy),
      results[policy][1],
      results["reference"][1],
    )


@pytest.mark.slow
def test_packed_instances_give_the_losses_and_gradients_they_give_alone(small_model_config):
  """Two instances, each alone in a row of 16 and packed into one row of 32 (instance numbers in `input_mask`,
  positions restarting, a [CLS] position each): the same per-instance MLM and NSP losses and the same gradients of
  the pretraining loss, within 1e-5 (float32)."""
  config = small_model_config
  model = BertForPretraining(config)
  rng = np.random.default_rng(3)
  lengths, seq, predictions = (11, 16), 16, 3
  alone = dict(
    input_ids=np.zeros((2, seq), np.int32),
    input_mask=np.zeros((2, seq), np.int32),
    segment_ids=np.zeros((2, seq), np.int32),
    masked_lm_positions=np.zeros((2, predictions), np.int32),
    masked_lm_ids=rng.integers(5, config.vocab_size, (2, predictions)).astype(np.int32),
    masked_lm_weights=np.array([[1, 1, 0], [1, 1, 1]], np.float32),
    next_sentence_labels=np.array([1, 0], np.int32),
  )
  for row, length in enumerate(lengths):
    alone["input_ids"][row, :length] = rng.integers(5, config.vocab_size, length)
    alone["input_mask"][row, :length] = 1
    alone["segment_ids"][row, length // 2 : length] = 1
    alone["masked_lm_positions"][row] = np.sort(rng.choice(np.arange(1, length), predictions, replace=False))
  # Packed: instance 1 at 0..10, instance 2 at 11..26, padding after; predictions of both, shifted.
  offset = lengths[0]
  packed = dict(
    input_ids=np.zeros((1, 2 * seq), np.int32),
    input_mask=np.zeros((1, 2 * seq), np.int32),
    segment_ids=np.zeros((1, 2 * seq), np.int32),
    position_ids=np.zeros((1, 2 * seq), np.int32),
    masked_lm_positions=np.concatenate([alone["masked_lm_positions"][0], alone["masked_lm_positions"][1] + offset])[
      None
    ],
    masked_lm_ids=alone["masked_lm_ids"].reshape(1, -1),
    masked_lm_weights=alone["masked_lm_weights"].reshape(1, -1),
    next_sentence_labels=alone["next_sentence_labels"][None],
    next_sentence_weights=np.ones((1, 2), np.float32),
    cls_positions=np.array([[0, offset]], np.int32),
  )
  for index, (start, length) in enumerate(((0, lengths[0]), (offset, lengths[1]))):
    for name in ("input_ids", "segment_ids"):
      packed[name][0, start : start + length] = alone[name][index, :length]
    packed["input_mask"][0, start : start + length] = index + 1
    packed["position_ids"][0, start : start + length] = np.arange(length)
  params = model.init(jax.random.key(0), *model.dummy_inputs())["params"]

  def per_instance(batch):
    outputs = model.apply({"params": params}, **bert_objective.model_inputs(batch))
    mlm = (
      optax.softmax_cross_entropy_with_integer_labels(outputs["mlm_logits"], batch["masked_lm_ids"])
      * batch["masked_lm_weights"]
    )
    nsp = optax.softmax_cross_entropy_with_integer_labels(outputs["nsp_logits"], batch["next_sentence_labels"])
    return mlm.reshape(2, predictions), nsp.reshape(2)

  for expected, actual in zip(jax.jit(per_instance)(alone), jax.jit(per_instance)(packed), strict=True):
    np.testing.assert_allclose(actual, expected, atol=1e-5, rtol=0)
  loss = bert_objective.make_loss().value
  grads = [jax.jit(jax.grad(lambda p, b: loss(p, b, model)[0]))(params, b) for b in (alone, packed)]
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=0), *grads)


@pytest.mark.parametrize(
  "family, scan_layers, remat",
  [("bert", False, "none"), ("bert", True, "full"), ("albert", True, "none"), ("albert", False, "save_dots")],
)
@pytest.mark.slow
def test_a_head_mask_equals_transformers_head_mask(small_model_config, family, scan_layers, remat):
  """[layers, heads] scaling each head's output, as `transformers`' head_mask scales its probabilities: in both
  layer layouts, under remat, and with ALBERT's one shared layer (each call still masks its own layer's heads)."""
  config = small_model_config  # 2 layers of 4 heads.
  cls = transformers.BertForPreTraining
  if family == "albert":
    config = dataclasses.replace(config, model_type="albert", embedding_size=16, layer_sharing="all")
    cls = transformers.AlbertForPreTraining
  reference = _reference(config, cls=cls, attn_implementation="eager")  # ALBERT's SDPA path ignores head_mask.
  params = params_from_hf({name: value.numpy() for name, value in reference.state_dict().items()}, config)
  head_mask = np.array([[1.0, 0.0, 1.0, 0.5], [0.0, 1.0, 1.0, 2.0]], np.float32)  # Pruned, kept and scaled heads.
  if family == "albert":  # transformers' ALBERT gives its shared layer head_mask[0] at every call (one group):
    head_mask = head_mask[[0, 0]]  # compare on a mask whose layers agree.
  input_ids, input_mask, segment_ids, positions = _inputs(config)
  with torch.no_grad():
    expected = reference(
      torch.tensor(input_ids, dtype=torch.long),
      attention_mask=torch.tensor(input_mask),
      token_type_ids=torch.tensor(segment_ids, dtype=torch.long),
      head_mask=torch.tensor(head_mask),
      output_hidden_states=True,
    )
  params = param_layout.convert(params, scanned=scan_layers)
  model = BertForPretraining(dataclasses.replace(config, scan_layers=scan_layers, remat=remat))
  apply = jax.jit(
    lambda p, mask: model.apply({"params": p}, input_ids, input_mask, segment_ids, positions, head_mask=mask)
  )
  outputs = apply(params, head_mask)
  np.testing.assert_allclose(outputs["sequence_output"], expected.hidden_states[-1].numpy(), atol=1e-5, rtol=0)
  expected_mlm = np.take_along_axis(expected.prediction_logits.numpy(), positions[:, :, None], axis=1)
  np.testing.assert_allclose(outputs["mlm_logits"], expected_mlm, atol=1e-5, rtol=0)
  unmasked = apply(params, None)
  assert np.abs(unmasked["sequence_output"] - outputs["sequence_output"]).max() > 1e-2
  np.testing.assert_array_equal(unmasked["sequence_output"], apply(params, np.ones_like(head_mask))["sequence_output"])


def test_a_model_without_a_head_mask_compiles_with_no_trace_of_it(small_model_config):
  """The head mask is an input only when given: without it the compiled program takes one argument fewer and does
  fewer FLOPs (the golden parameter tests show its numbers are bitwise those of before the mask existed)."""
  model = BertForPretraining(small_model_config)
  params = nn.meta.unbox(model.init(jax.random.key(0), *model.dummy_inputs())["params"])
  input_ids, input_mask, segment_ids, positions = _inputs(small_model_config)
  apply = lambda p, mask: model.apply({"params": p}, input_ids, input_mask, segment_ids, positions, head_mask=mask)
  without = jax.jit(apply).lower(params, None).compile()
  with_mask = jax.jit(apply).lower(params, jnp.ones((2, 4))).compile()
  count = lambda compiled: len(compiled.as_text().split("ENTRY")[1].split("\n}")[0].split("parameter(")) - 1
  assert count(with_mask) == count(without) + 1
  assert without.cost_analysis()["flops"] < with_mask.cost_analysis()["flops"]
  assert "head_mask" not in jax.jit(apply).lower(params, None).as_text()


def test_the_q_k_v_projections_one_merged_matmul_equal_flax_s_dense_general():
  # What the attention's query, key and value projections compute (`layers.merged_output_dot`: one matmul into
  # [..., heads * head_dim], so that what the remat policies keep is lane-dense on a TPU) equals flax's DenseGeneral
  # into [..., heads, head_dim], in float32 and in bfloat16, gradients included.
  from bert_jax.model.layers import merged_output_dot

  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(2, 5, 16)), jnp.float32)
  for dtype in (jnp.float32, jnp.bfloat16):
    layers = [nn.DenseGeneral((3, 8), dtype=dtype, dot_general=dot) for dot in (jax.lax.dot_general, merged_output_dot)]
    params = layers[0].init(jax.random.key(0), x)

    def loss(params, layer):
      return jnp.sum(jnp.sin(layer.apply(params, x).astype(jnp.float32)))

    outputs = [layer.apply(params, x) for layer in layers]
    assert outputs[1].shape == (2, 5, 3, 8) and outputs[1].dtype == dtype
    np.testing.assert_allclose(
      *(np.asarray(out, np.float32) for out in outputs), rtol=1e-6 if dtype == jnp.float32 else 1e-2
    )
    grads = [jax.grad(loss)(params, layer) for layer in layers]
    tolerance = dict(rtol=1e-5, atol=1e-6) if dtype == jnp.float32 else dict(rtol=1e-5, atol=1e-2)
    for a, b in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(grads[1]), strict=True):
      np.testing.assert_allclose(a, b, **tolerance)
  with pytest.raises(ValueError, match="contracts a kernel's first axis only"):
    merged_output_dot(x, jnp.ones((5, 16, 4)), (((1,), (0,)), ((0,), ())))
