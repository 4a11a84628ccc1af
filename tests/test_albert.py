"""ALBERT (`model_type="albert"`: factorised embeddings, `gelu_new`, shared layers) against transformers' PyTorch
`AlbertForPreTraining`, random weights, no download; and the partial sharing modes, which have no reference, by
construction."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers

from bert_jax import flops
from bert_jax.handoff import hf_configs
from bert_jax.handoff.hf_format import params_from_hf
from bert_jax.model.encoder import BertForPretraining, encoder_intermediates
from tests.test_encoder import _inputs, _reference, _reference_outputs
from tests.test_roberta import check_fine_tunes, check_hf_round_trip


@pytest.fixture
def albert_config(small_model_config):
  return dataclasses.replace(
    small_model_config, model_type="albert", embedding_size=16, num_layers=3, hidden_act="gelu_new", layer_sharing="all"
  )


@pytest.mark.parametrize("sharing, scan_layers", [("all", False), ("all", True), ("none", False)])
def test_matches_hugging_face_albert_for_pretraining(albert_config, sharing, scan_layers):
  """One group for every layer (sharing "all", in both layouts) and a group per layer ("none")."""
  config = dataclasses.replace(albert_config, layer_sharing=sharing)
  reference = _reference(config, cls=transformers.AlbertForPreTraining)
  assert reference.config.num_hidden_groups == (1 if sharing == "all" else config.num_layers)
  params = params_from_hf({name: value.numpy() for name, value in reference.state_dict().items()}, config)
  input_ids, input_mask, segment_ids, positions = inputs = _inputs(config)
  expected = _reference_outputs(reference, inputs)
  model = BertForPretraining(dataclasses.replace(config, scan_layers=scan_layers))
  outputs, state = jax.jit(lambda p, *x: model.apply({"params": p}, *x, mutable=["intermediates"]))(
    params, input_ids, input_mask, segment_ids, positions
  )
  hidden = encoder_intermediates(state["intermediates"]["bert"], model.config)["hidden_states"]
  # The embeddings after their projection to the hidden width, then each layer's output.
  np.testing.assert_allclose(hidden, np.stack(expected.hidden_states), atol=1e-5, rtol=0)
  np.testing.assert_allclose(outputs["sequence_output"], expected.hidden_states[-1].numpy(), atol=1e-5, rtol=0)
  expected_mlm = np.take_along_axis(expected.prediction_logits.numpy(), positions[:, :, None], axis=1)
  np.testing.assert_allclose(outputs["mlm_logits"], expected_mlm, atol=1e-5, rtol=0)
  np.testing.assert_allclose(outputs["nsp_logits"], expected.sop_logits.numpy(), atol=1e-5, rtol=0)


@pytest.mark.slow
def test_albert_files_load_and_export_as_transformers_reads_them(albert_config, tmp_path):
  reference = _reference(albert_config, cls=transformers.AlbertForPreTraining)
  loaded = check_hf_round_trip(reference, albert_config, tmp_path / "pretraining")
  assert set(loaded.params["bert"]) == {"embeddings", "embeddings_project", "shared_layer", "pooler"}
  encoder = _reference(dataclasses.replace(albert_config, layer_sharing="none"), cls=transformers.AlbertModel)
  loaded = check_hf_round_trip(encoder, dataclasses.replace(albert_config, layer_sharing="none"), tmp_path / "bare")
  assert set(loaded.params) == {"bert"}
  check_fine_tunes(str(tmp_path / "pretraining" / "exported"), tmp_path)  # Shared layers, factorised embeddings.
  two_groups = dict(hf_configs.hf_config(albert_config), num_hidden_groups=2)
  with pytest.raises(ValueError, match=r"num_hidden_groups=2 and inner_group_num=1 for num_hidden_layers=3"):
    hf_configs.config_from_hf(two_groups, "config.json")


def _unshared(params: dict, config, sharing: str) -> dict:
  """`params` of a model with `sharing`, as the unshared model's: each layer holds copies of the shared modules."""
  names = {"attention": ("attention", "attention_layer_norm"), "ffn": ("intermediate", "output", "output_layer_norm")}
  bert = {key: value for key, value in params["bert"].items() if not key.startswith("shared_")}
  for i in range(config.num_layers):
    bert[f"layer_{i}"] = dict(bert[f"layer_{i}"], **{name: params["bert"][f"shared_{name}"] for name in names[sharing]})
  return dict(params, bert=bert)


@pytest.mark.parametrize("sharing, remat", [("attention", "none"), ("ffn", "full")])
@pytest.mark.slow
def test_partial_sharing_is_the_unshared_model_with_copies_and_sums_their_gradients(albert_config, sharing, remat):
  config = dataclasses.replace(albert_config, layer_sharing=sharing, remat=remat)
  unshared_config = dataclasses.replace(config, layer_sharing="none")
  model, unshared_model = BertForPretraining(config), BertForPretraining(unshared_config)
  rng = np.random.default_rng(0)
  shapes = nn.meta.unbox(jax.eval_shape(lambda: model.init(jax.random.key(0), *model.dummy_inputs())["params"]))
  params = jax.tree.map(lambda x: rng.normal(0, 0.2, x.shape).astype(np.float32), shapes)
  shared = {key for key in params["bert"] if key.startswith("shared_")}
  expected_shared = {"attention": {"shared_attention", "shared_attention_layer_norm"}}.get(sharing)
  assert shared == (expected_shared or {"shared_intermediate", "shared_output", "shared_output_layer_norm"})
  layer = set(params["bert"]["layer_0"])
  assert not {name.removeprefix("shared_") for name in shared} & layer  # Exactly one copy of each shared module.
  inputs = _inputs(config)

  def loss(p, m):
    outputs, state = m.apply({"params": p}, *inputs, mutable=["intermediates"])
    hidden = encoder_intermediates(state["intermediates"]["bert"], m.config)
    return jnp.sum(outputs["mlm_logits"] ** 2) + jnp.sum(outputs["nsp_logits"]), hidden

  def both(params, copies):  # One compilation.
    grad = jax.value_and_grad(loss, has_aux=True)
    return grad(params, model), grad(copies, unshared_model)

  ((value, hidden), grads), ((expected, expected_hidden), copy_grads) = jax.jit(both)(
    params, _unshared(params, config, sharing)
  )
  np.testing.assert_allclose(value, expected, rtol=1e-6)
  for name in hidden:
    np.testing.assert_allclose(hidden[name], expected_hidden[name], atol=1e-6, rtol=0)
  for name in shared:  # The shared module's gradient is the sum of its copies'.
    summed = jax.tree.map(
      lambda *g: sum(g), *(copy_grads["bert"][f"layer_{i}"][name.removeprefix("shared_")] for i in range(3))
    )
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5), grads["bert"][name], summed)


def test_flops_count_the_projection_and_the_factorised_head_as_xla_does(albert_config):
  """The model FLOPs of the forward pass (a third of a train step's) are XLA's count of the compiled forward within
  10% (XLA also counts norms and softmaxes), and what factorising the embeddings changes (the projection, the
  narrower MLM transform and decoder) within 3%: leaving out the projection would be 5% off."""
  batch, seq, predictions = 4, 32, 5
  counts = []
  for config in (albert_config, dataclasses.replace(albert_config, model_type="bert", embedding_size=0)):
    config = dataclasses.replace(config, vocab_size=2000, hidden_size=64, intermediate_size=256)
    model = BertForPretraining(config)
    params = jax.eval_shape(lambda m=model: m.init(jax.random.key(0), *m.dummy_inputs())["params"])
    ids = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    positions = jax.ShapeDtypeStruct((batch, predictions), jnp.int32)
    lowered = jax.jit(lambda p, i, mask, s, pos, m=model: m.apply({"params": p}, i, mask, s, pos)).lower(
      params, ids, ids, ids, positions
    )
    xla = lowered.compile().cost_analysis()["flops"]
    ours = flops.train_flops_per_step(config, batch, seq, predictions) / 3
    assert ours == pytest.approx(xla, rel=0.1), (config.embedding_width, ours, xla)
    counts.append((ours, xla))
  (albert, albert_xla), (bert, bert_xla) = counts
  assert bert - albert == pytest.approx(bert_xla - albert_xla, rel=0.03)
