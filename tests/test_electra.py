"""ELECTRA: the generator and discriminator against transformers' `ElectraForMaskedLM` / `ElectraForPreTraining`
(random weights, no download), the replaced-token-detection loss (no gradient through the sampling, the labels), and
a tiny run end to end: pretraining, `pretrained.load`, the Hugging Face export, fine-tuning."""

import copy
import dataclasses
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from bert_jax import flops, jobs
from bert_jax.handoff import export, pretrained
from bert_jax.handoff.hf_format import load_safetensors, params_from_hf
from bert_jax.model.bert_config import generator_config
from bert_jax.model.electra import ElectraForPretraining, generator_as_masked_lm, with_generator
from bert_jax.model.encoder import init_params
from bert_jax.train.objectives import electra
from configs import electra_small, glue
from tests.helpers import write_sst2
from tests.test_albert import check_transformers_encodes_as_bert_jax, mixed_case_lines, train_mixed_case_sentencepiece
from tests.test_encoder import _inputs, _reference
from tests.test_roberta import check_hf_round_trip, write_hf_directory


@pytest.fixture
def electra_configs(small_model_config):
  """A discriminator with factorised embeddings (E=16 < H=32) and its generator (H=8, one head: projected too)."""
  discriminator = dataclasses.replace(small_model_config, model_type="electra", embedding_size=16)
  return discriminator, generator_config(discriminator, 0.25, 1.0)


def _hf_pair(discriminator, generator):
  """transformers' discriminator and generator with random weights, the generator's embeddings the
  discriminator's (copied: ELECTRA shares them)."""
  hf_discriminator = _reference(discriminator, cls=transformers.ElectraForPreTraining)
  hf_generator = _reference(generator, seed=1, cls=transformers.ElectraForMaskedLM)
  with torch.no_grad():
    for name, param in hf_generator.electra.embeddings.named_parameters():
      param.copy_(dict(hf_discriminator.electra.embeddings.named_parameters())[name])
  return hf_discriminator, hf_generator


def _numpy_state(model) -> dict:
  return {name: value.numpy() for name, value in model.state_dict().items()}


def _electra_params(hf_discriminator, hf_generator, discriminator, generator) -> dict:
  params = params_from_hf(_numpy_state(hf_discriminator), discriminator)
  params["bert"]["pooler"] = {"kernel": np.zeros((32, 32), np.float32), "bias": np.zeros(32, np.float32)}
  return with_generator(params, params_from_hf(_numpy_state(hf_generator), generator), "test")


def test_matches_hugging_face_electra_discriminator_and_generator(electra_configs):
  discriminator, generator = electra_configs
  assert (generator.hidden_size, generator.num_heads, generator.intermediate_size) == (8, 1, 32)
  hf_discriminator, hf_generator = _hf_pair(discriminator, generator)
  params = _electra_params(hf_discriminator, hf_generator, discriminator, generator)
  assert set(params["generator"]) == {"embeddings_project", "layer_0", "layer_1", *_MLM}

  input_ids, input_mask, segment_ids, positions = _inputs(discriminator)
  with torch.no_grad():
    torch_inputs = dict(
      input_ids=torch.tensor(input_ids, dtype=torch.long),
      attention_mask=torch.tensor(input_mask),
      token_type_ids=torch.tensor(segment_ids, dtype=torch.long),
    )
    expected_rtd = hf_discriminator(**torch_inputs).logits.numpy()
    expected_mlm = hf_generator(**torch_inputs).logits.numpy()
  model = ElectraForPretraining(discriminator, generator)
  outputs = jax.jit(model.apply)({"params": params}, input_ids, input_mask, segment_ids, positions)
  np.testing.assert_allclose(outputs["rtd_logits"], expected_rtd, atol=1e-5, rtol=0)
  expected_mlm = np.take_along_axis(expected_mlm, positions[:, :, None], axis=1)
  np.testing.assert_allclose(outputs["mlm_logits"], expected_mlm, atol=1e-5, rtol=0)
  # The generator as a masked LM of its own config is the same tree transformers' ElectraForMaskedLM converts to.
  jax.tree.map(
    np.testing.assert_array_equal, generator_as_masked_lm(params), params_from_hf(_numpy_state(hf_generator), generator)
  )


_MLM = ("mlm_transform", "mlm_layer_norm", "mlm_output_bias")


def _batch(config, seed=0, batch=3, seq=24, predictions=6):
  """A pretraining batch over `_inputs`' sequences: in each row, up to `predictions` real tokens (never [CLS] at 0)
  selected, most replaced by [MASK] (id 4), some kept, the last slot of row 0 padding."""
  input_ids, input_mask, segment_ids, _ = _inputs(config, batch, seq, predictions, seed)
  rng = np.random.default_rng(seed)
  positions = np.zeros((batch, predictions), np.int32)
  weights = np.zeros((batch, predictions), np.float32)
  for row in range(batch):
    real = int(input_mask[row].sum())
    chosen = np.sort(rng.choice(np.arange(1, real), min(predictions, real - 1), replace=False))
    positions[row, : len(chosen)], weights[row, : len(chosen)] = chosen, 1.0
  weights[0, -1], positions[0, -1] = 0.0, 0  # A padded prediction slot.
  masked_ids = np.take_along_axis(input_ids, positions, axis=1) * (weights > 0)
  masked_input = input_ids.copy()
  for row in range(batch):
    for slot in range(predictions):
      if weights[row, slot] and slot % 3:  # Two thirds [MASK], a third kept.
        masked_input[row, positions[row, slot]] = 4
  return dict(
    input_ids=masked_input,
    input_mask=input_mask,
    segment_ids=segment_ids,
    masked_lm_positions=positions,
    masked_lm_ids=masked_ids.astype(np.int32),
    masked_lm_weights=weights,
    next_sentence_labels=np.zeros(batch, np.int32),
  ), input_ids


@pytest.fixture
def electra_model(electra_configs):
  """A one-layer discriminator and generator with random parameters (no initialisation to compile)."""
  discriminator, generator = (dataclasses.replace(config, num_layers=1) for config in electra_configs)
  model = ElectraForPretraining(discriminator, generator)
  shapes = nn.meta.unbox(jax.eval_shape(lambda: init_params(model, jax.random.key(0))))
  rng = np.random.default_rng(0)
  return model, jax.tree.map(lambda x: rng.normal(0, 0.1, x.shape).astype(np.float32), shapes)


def _split(grads: dict) -> tuple[dict, dict, dict]:
  """Gradient leaves by '/'-joined path: the generator's, the discriminator's own (its layers, projection and RTD
  head; the pooler, which ELECTRA never trains, left out), and the shared embeddings'."""
  named = {"/".join(str(k.key) for k in path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(grads)}
  generator = {name: leaf for name, leaf in named.items() if name.startswith("generator/")}
  embeddings = {name: leaf for name, leaf in named.items() if name.startswith("bert/embeddings/")}
  discriminator = {
    name: leaf
    for name, leaf in named.items()
    if name not in generator and name not in embeddings and not name.startswith("bert/pooler/")
  }
  return generator, discriminator, embeddings


@pytest.mark.slow
def test_no_gradient_flows_through_the_sampling(electra_model, electra_configs):
  """The RTD term trains the discriminator and the embeddings, never the generator; the MLM term the generator and
  the embeddings, never the discriminator."""
  model, params = electra_model
  batch, _ = _batch(electra_configs[0])
  loss = electra.make_loss(rtd_weight=50.0, temperature=1.0)

  @jax.jit
  def grads(params):  # d(rtd_loss, mlm_loss) / d params, each on its own: one backward pass per row.
    metrics = lambda p: loss.value(p, batch, model, jax.random.key(3))[1]  # noqa: E731
    return jax.jacrev(lambda p: jnp.stack([metrics(p)["rtd_loss"], metrics(p)["mlm_loss"]]))(params)

  jacobian = grads(params)
  rtd_generator, rtd_discriminator, rtd_embeddings = _split(jax.tree.map(lambda x: x[0], jacobian))
  mlm_generator, mlm_discriminator, mlm_embeddings = _split(jax.tree.map(lambda x: x[1], jacobian))
  assert len(rtd_discriminator) > 15 and len(rtd_generator) > 15
  for name, leaf in {**rtd_generator, **mlm_discriminator}.items():
    np.testing.assert_array_equal(leaf, 0, err_msg=name)
  for name, leaf in {**rtd_discriminator, **mlm_generator, **rtd_embeddings, **mlm_embeddings}.items():
    assert np.abs(leaf).max() > 0, name


def _generate(model, params, batch):
  inputs = {name: batch[name] for name in ("input_ids", "input_mask", "segment_ids", "masked_lm_positions")}
  return jax.jit(lambda p: model.apply({"params": p}, **inputs, method=ElectraForPretraining.generate))(params)


def test_the_discriminator_labels_the_sampled_replacements_of_the_original_tokens(electra_model, electra_configs):
  model, params = electra_model
  batch, true_ids = _batch(electra_configs[0])
  selected = np.zeros(true_ids.shape, bool)
  for row, (positions, weights) in enumerate(
    zip(batch["masked_lm_positions"], batch["masked_lm_weights"], strict=True)
  ):
    selected[row, positions[weights > 0]] = True
  real = batch["input_mask"] > 0
  key = jax.random.key(5)
  logits = _generate(model, params, batch)
  original, corrupted, labels = map(np.asarray, electra.replaced_tokens(key, logits, batch, 1.0))
  np.testing.assert_array_equal(original, true_ids)  # [MASK] and kept tokens restored; nothing else changed.
  samples = np.asarray(jax.random.categorical(key, logits))  # The same key: the same samples.
  expected = true_ids.copy()
  for row in range(true_ids.shape[0]):
    for slot, position in enumerate(batch["masked_lm_positions"][row]):
      if batch["masked_lm_weights"][row, slot]:
        expected[row, position] = samples[row, slot]
  np.testing.assert_array_equal(corrupted, expected)  # The padded slot (position 0) wrote nothing: [CLS] stays.
  np.testing.assert_array_equal(labels, (expected != true_ids) & real)
  assert labels.sum() > 0 and not labels[~selected].any()

  # A generator certain of the original token (every selected token is id 7, with a huge output bias on it)
  # replaces nothing: every label is "original".
  batch = dict(batch, masked_lm_ids=np.where(batch["masked_lm_weights"] > 0, 7, 0).astype(np.int32))
  certain = dict(params, generator=dict(params["generator"], mlm_output_bias=np.eye(101, dtype=np.float32)[7] * 1e4))
  original, corrupted, labels = electra.replaced_tokens(key, _generate(model, certain, batch), batch, 1.0)
  np.testing.assert_array_equal(corrupted, original)
  assert not np.asarray(labels).any()
  np.testing.assert_array_equal(np.asarray(original)[selected], 7)


def test_the_loss_is_the_masked_lm_loss_plus_50_times_the_replaced_token_loss(electra_model, electra_configs):
  model, params = electra_model
  batch, _ = _batch(electra_configs[0])
  loss, metrics = jax.jit(lambda p: electra.make_loss(50.0, 1.0).value(p, batch, model))(params)
  metrics = jax.device_get(metrics)
  assert metrics["mlm_count"] == batch["masked_lm_weights"].sum() and metrics["rtd_count"] == batch["input_mask"].sum()
  expected = metrics["mlm_loss"] / (metrics["mlm_count"] + 1e-5) + 50 * metrics["rtd_loss"] / metrics["rtd_count"]
  np.testing.assert_allclose(loss, expected, rtol=1e-6)
  # Evaluation samples with a fixed key: the labels it scored are those of replaced_tokens with that key.
  key = jax.random.fold_in(jax.random.key(0), electra._SAMPLING)
  _, _, labels = electra.replaced_tokens(key, _generate(model, params, batch), batch, 1.0)
  assert metrics["rtd_replaced"] == np.asarray(labels).sum() > 0
  assert 0 <= metrics["rtd_accuracy"] <= metrics["rtd_count"]


@pytest.mark.slow  # As RoBERTa's, ALBERT's and ModernBERT's files; the weights' import is checked fast above.
def test_electra_files_load_and_export_as_transformers_reads_them(electra_configs, tmp_path):
  """A discriminator directory alone, and one with its generator in `generator/` (as our export writes them)."""
  discriminator, generator = electra_configs
  hf_discriminator, hf_generator = _hf_pair(discriminator, generator)
  loaded = check_hf_round_trip(hf_discriminator, discriminator, tmp_path / "discriminator")
  assert set(loaded.params) == {"bert", "rtd_dense", "rtd_prediction"} and loaded.source.generator is None

  source, exported = tmp_path / "pair", tmp_path / "exported"
  write_hf_directory(hf_discriminator, source, discriminator.vocab_size)
  write_hf_directory(hf_generator, source / "generator", discriminator.vocab_size)
  (source / "vocab.txt").unlink()  # A SentencePiece model instead, trained on mixed-case text.
  shutil.copy(train_mixed_case_sentencepiece(tmp_path / "sentencepiece"), source / "tokenizer.model")
  loaded = pretrained.load(str(source))
  assert (loaded.config, loaded.source.generator) == (discriminator, generator)
  expected = _electra_params(hf_discriminator, hf_generator, discriminator, generator)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(loaded.params["generator"]), expected["generator"])
  export.export(str(source), str(exported), format="huggingface")
  for reference, directory in ((hf_discriminator, exported), (hf_generator, exported / "generator")):
    again, info = type(reference).from_pretrained(directory, output_loading_info=True)
    assert info == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": [], "error_msgs": []}
    for name, value in reference.state_dict().items():
      np.testing.assert_array_equal(again.state_dict()[name].numpy(), value.numpy(), err_msg=name)
    check_transformers_encodes_as_bert_jax(directory, loaded.tokenizer, mixed_case_lines(300, seed=4))
  assert "generator_lm_head.weight" not in load_safetensors(str(exported / "generator" / "model.safetensors"))

  with torch.no_grad():
    hf_generator.electra.embeddings.token_type_embeddings.weight.add_(1.0)
  write_hf_directory(hf_generator, source / "generator", discriminator.vocab_size)
  with pytest.raises(ValueError, match=r"generator's embeddings/token_type_embeddings/embedding differ"):
    pretrained.load(str(source))


def test_the_electra_objective_and_model_type_go_together():
  config = electra_small.get_config()
  assert jobs.check(config, "pretrain").model.model_type == "electra"
  for key, value in (("objective", "bert"), ("model.model_type", "bert")):
    changed = copy.deepcopy(config)
    changed.update_from_flattened_dict({key: value})
    with pytest.raises(
      ValueError, match=r"ELECTRA trains a discriminator of model_type 'electra'.*set both or neither"
    ):
      jobs.check(changed, "pretrain")


def test_a_generator_size_that_does_not_fit_is_refused_naming_the_fraction(electra_configs):
  discriminator = electra_configs[0]
  with pytest.raises(ValueError, match=r"electra.generator_layers_fraction=0.1 of model.num_layers=2 rounds to 0"):
    generator_config(discriminator, 0.25, 0.1)
  wide = dataclasses.replace(discriminator, hidden_size=516)
  with pytest.raises(ValueError, match=r"generator_hidden_fraction=0.25 gives a generator hidden size of 129, which"):
    generator_config(wide, 0.25, 1.0)


@pytest.fixture(scope="module")
def electra_run(wordpiece_run, tmp_path_factory):
  """A 2-step ELECTRA run (discriminator H32, E16; generator H8) on `wordpiece_run`'s prepared corpus, packed rows,
  FSDP over the 8 devices: (workdir, config, final state)."""
  _, bert_config, _ = wordpiece_run
  config = copy.deepcopy(bert_config)
  config.objective = "electra"
  config.model.update(model_type="electra", embedding_size=16, num_layers=1)
  config.data.update(instances="doc_sentences", mask_token_fraction=0.85, random_token_fraction=0.0)
  config.update(eval_steps=0)
  workdir = str(tmp_path_factory.mktemp("electra") / "run")
  return workdir, config, jobs.run(config, workdir, "pretrain")


@pytest.mark.slow
def test_an_electra_run_hands_its_discriminator_to_load_export_and_fine_tuning(electra_run, tmp_path):
  workdir, config, state = electra_run
  assert int(state.step) == 2
  loaded = pretrained.load(workdir)
  assert loaded.config.model_type == "electra" and loaded.source.generator.hidden_size == 8
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(loaded.params), jax.device_get(state.params))

  bundle = pretrained.load(export.export(workdir, str(tmp_path / "bundle")))  # The generator's config travels too.
  assert bundle.source.generator == loaded.source.generator
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(bundle.params), jax.device_get(state.params))
  exported = tmp_path / "hf"
  export.export(workdir, str(exported), format="huggingface")
  for cls, directory in (
    (transformers.ElectraForPreTraining, exported),
    (transformers.ElectraForMaskedLM, exported / "generator"),
  ):
    _, info = cls.from_pretrained(directory, output_loading_info=True)
    assert info == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": [], "error_msgs": []}

  data = tmp_path / "SST-2"
  write_sst2(data, train_rows=16)
  finetuning = glue.get_config()
  finetuning.finetune.update(task="sst2", data_dir=str(data), max_seq_length=16, num_epochs=1.0, eval_batch_size=24)
  finetuning.update(init_from=workdir, batch_size=8, log_every_steps=1)
  summary = jobs.run(finetuning, str(tmp_path / "sst2"), "finetune")
  assert summary["final"]["dev"][0]["accuracy"] >= 0


def test_flops_count_both_models_as_xla_does(electra_configs):
  """The model FLOPs of a forward pass (a third of a train step's: the generator with its head at the masked
  positions, the discriminator with its head at every token) are XLA's count of the compiled forward within 10%
  (XLA also counts norms, softmaxes, GELUs and the pooler: at ELECTRA-Small's widths, 5% more)."""
  batch, seq, predictions = 4, 32, 5
  sizes = dict(vocab_size=2000, hidden_size=256, intermediate_size=1024, embedding_size=64)
  discriminator = dataclasses.replace(electra_configs[0], **sizes)
  generator = generator_config(discriminator, 0.25, 1.0)
  model = ElectraForPretraining(discriminator, generator)
  params = jax.eval_shape(lambda: model.init(jax.random.key(0), *model.dummy_inputs())["params"])
  ids = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
  positions = jax.ShapeDtypeStruct((batch, predictions), jnp.int32)
  lowered = jax.jit(lambda p, *inputs: model.apply({"params": p}, *inputs)).lower(params, ids, ids, ids, positions)
  xla = lowered.compile().cost_analysis()["flops"]
  ours = flops.electra_flops_per_step(discriminator, generator, batch, seq, predictions) / 3
  assert ours == pytest.approx(xla, rel=0.1), (ours, xla)
