"""A NeoBERT-shaped encoder (Le Breton et al. 2025) composed of the parts there are, with their arguments: token
embeddings without a norm, every layer pre-normed with RMSNorm, SwiGLU, global attention with rotary positions, and
an untied linear masked-LM decoder. It is a config plus one entry in the table of architectures, registered here: no
package file knows it, and it builds, trains, counts its FLOPs and exports to a bundle."""

import copy
import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import flops, jobs
from bert_jax.handoff import export, pretrained
from bert_jax.model import architectures, param_layout
from bert_jax.model.architectures import Architecture, Part
from bert_jax.model.bert_config import BertConfig
from bert_jax.model.encoder import BertForPretraining, init_params
from bert_jax.model.feed_forward import GLU
from bert_jax.model.heads import task_model
from bert_jax.model.layers import layer_norm
from bert_jax.train import pretraining

NEOBERT = Architecture(
  name="NeoBERT",
  embeddings=Part("token", norm=False),
  layer="pre_norm",
  feed_forward="glu",
  attention_pattern="global",
  pretraining_head=Part("mlm", tied=False, transform=False),
  pooler="none",
  task_head="prediction",
)
# NeoBERT's numbers: RMSNorm, SwiGLU, no biases but the decoder's, rotary positions.
SETTINGS = dict(model_type="neobert", norm="rms_norm", hidden_act="silu", linear_bias=False, rope_theta=10000.0)


@pytest.fixture
def neobert(monkeypatch):
  monkeypatch.setitem(architectures.ARCHITECTURES, "neobert", NEOBERT)


def _config(small_model_config: BertConfig, **changes) -> BertConfig:
  return dataclasses.replace(small_model_config, **SETTINGS, **changes)


def _inputs(config: BertConfig, batch: int = 2, seq: int = 10):
  rng = np.random.default_rng(0)
  input_ids = jnp.asarray(rng.integers(0, config.vocab_size, (batch, seq)), jnp.int32)
  input_mask = jnp.ones((batch, seq), jnp.int32).at[1, 7:].set(0)
  positions = jnp.asarray(rng.integers(0, seq, (batch, 3)), jnp.int32)
  return input_ids, input_mask, jnp.zeros_like(input_ids), positions


def test_neobert_is_its_parts_with_their_arguments(neobert, small_model_config):
  """The tree holds what NeoBERT has and nothing else: the word table alone, a norm before the attention and the
  feed-forward of every layer (layer 0 included: a scan stacks all of them), RMSNorm scales without biases, a final
  norm, the decoder [hidden, vocab] of its own with the output bias; no transform, pooler or sentence head. The
  gradient reaches the decoder, and the word table only through the inputs."""
  config = _config(small_model_config)
  model = BertForPretraining(config)
  params = jax.jit(lambda key: nn.meta.unbox(init_params(model, key)))(jax.random.key(0))
  assert set(params) == {"bert", "mlm_decoder", "mlm_output_bias"}
  assert set(params["bert"]) == {"embeddings", "layer_0", "layer_1", "final_norm"}
  assert set(params["bert"]["embeddings"]) == {"word_embeddings"}
  for layer in ("layer_0", "layer_1"):
    assert set(params["bert"][layer]) == {"attention_norm", "attention", "feed_forward_norm", "intermediate", "output"}
    assert set(params["bert"][layer]["attention_norm"]) == {"scale"}
    assert params["bert"][layer]["intermediate"]["kernel"].shape == (32, 2, 48)  # SwiGLU's input and gate.
    assert "bias" not in params["bert"][layer]["attention"]["query"]
  assert params["mlm_decoder"]["kernel"].shape == (config.hidden_size, config.vocab_size)
  scanned = dataclasses.replace(config, scan_layers=True)
  scanned_params = jax.eval_shape(lambda: nn.meta.unbox(init_params(BertForPretraining(scanned), jax.random.key(0))))
  assert set(scanned_params["bert"]) == {"embeddings", "layers", "final_norm"}  # No layer kept apart.
  assert jax.tree.structure(scanned_params) == jax.tree.structure(param_layout.convert(params, scanned=True))

  inputs = _inputs(config)

  def loss(p):
    outputs = model.apply({"params": p}, *inputs)
    return jnp.sum(outputs["mlm_logits"] ** 2), outputs

  grads, outputs = jax.jit(jax.grad(loss, has_aux=True))(params)
  assert np.abs(grads["mlm_decoder"]["kernel"]).max() > 0
  assert "nsp_logits" not in outputs and outputs["pooled_output"] is None
  # Untied and without a transform: the logits are the encoder's output at the masked positions through the head's
  # own decoder, whatever the word table holds.
  hidden = outputs["sequence_output"][jnp.arange(2)[:, None], inputs[3]]
  expected = hidden @ params["mlm_decoder"]["kernel"] + params["mlm_output_bias"]
  np.testing.assert_allclose(outputs["mlm_logits"], expected, rtol=1e-5, atol=1e-5)
  # The fine-tuning heads are the composition's too (ModernBERT's prediction heads, pooled by `classifier_pooling`).
  classifier = task_model(config, "classification", 3)
  logits = jax.jit(lambda key: classifier.apply({"params": init_params(classifier, key)}, *inputs[:3]))(
    jax.random.key(1)
  )["logits"]
  assert logits.shape == (2, 3) and np.isfinite(logits).all()


def test_neobert_counts_what_it_computes(neobert, small_model_config):
  """The FLOPs follow the composition: the encoder, the decoder from the hidden width at each prediction (an untied
  decoder counted as a tied one is), no transform, pooler or sentence head."""
  config = _config(small_model_config)
  batch, seq, predictions = 4, 16, 3
  hidden, layers, tokens = config.hidden_size, config.num_layers, batch * seq
  per_layer = 2 * tokens * 4 * hidden * hidden + tokens * 2 * 3 * hidden * config.intermediate_size
  attention = 2 * 2 * batch * seq * seq * hidden
  decoder = 2 * batch * predictions * hidden * config.vocab_size
  expected = 3 * (layers * (per_layer + attention) + decoder)
  assert flops.train_flops_per_step(config, batch, seq, predictions) == expected
  tied = Part("mlm", transform=False)
  with pytest.MonkeyPatch.context() as patch:
    patch.setitem(architectures.ARCHITECTURES, "neobert", dataclasses.replace(NEOBERT, pretraining_head=tied))
    assert flops.train_flops_per_step(config, batch, seq, predictions) == expected


@pytest.mark.slow
def test_neobert_trains_and_exports_to_a_bundle(neobert, wordpiece_run, tmp_path):
  """Through the pretraining job (its train step, its loop, its checkpoint) on `wordpiece_run`'s corpus: the loss is
  finite, every parameter moved; the bundle holds the trained parameters, the config and the tokenizer, and loads back
  as NeoBERT."""
  config = copy.deepcopy(wordpiece_run[1])
  config.model.update(**SETTINGS)
  config.data.instances = "doc_sentences"  # No sentence head: a masked LM alone.
  config.update(num_train_steps=3, checkpoint_every_steps=3, eval_steps=0)
  workdir = str(tmp_path / "run")
  state = jobs.run(config, workdir, "pretrain")
  trained = jax.device_get(state.params)
  fresh = jax.device_get(pretraining.make_run(config).init_state(config.seed).params)
  moved = jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))), trained, fresh)
  assert all(jax.tree.leaves(moved)), moved

  bundle = pretrained.load(export.export(workdir, str(tmp_path / "bundle")))
  assert bundle.config.model_type == "neobert" and bundle.config.architecture == NEOBERT
  assert (bundle.config.norm, bundle.config.hidden_act, bundle.config.linear_bias) == ("rms_norm", "silu", False)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(bundle.params), trained)
  assert np.isfinite(bundle.source.history["train"]["loss"])


class _FeedForward(nn.Module):
  """The "glu" feed-forward alone, its sublayers made as a layer makes them."""

  config: BertConfig

  @nn.compact
  def __call__(self, x):
    modules = {name: make(self.config, name) for name, make in GLU.sublayers}
    return GLU.apply(self.config, modules, x, True)


def test_rms_norm_and_swiglu_equal_their_references(neobert, small_model_config):
  """NeoBERT's two settings against reference implementations: `norm="rms_norm"` is torch's `nn.RMSNorm` and
  transformers' `LlamaRMSNorm` (x / sqrt(mean(x^2) + eps) * scale, no mean subtracted, no bias); the "glu"
  feed-forward with `hidden_act="silu"` is transformers' `LlamaMLP` (down(silu(gate(x)) * up(x)), no biases), our
  `intermediate`'s first half being its gate_proj and the second its up_proj."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from transformers.models.llama import modeling_llama as llama

  config = _config(small_model_config, layer_norm_eps=1e-5)
  hidden, intermediate = config.hidden_size, config.intermediate_size
  rng = np.random.default_rng(0)
  x = (rng.normal(size=(2, 5, hidden)) * 3 + 1).astype(np.float32)  # Not centred: a LayerNorm would differ.

  norm = layer_norm(config, "norm")
  scale = rng.normal(size=(hidden,)).astype(np.float32)
  ours = np.asarray(norm.apply({"params": {"scale": scale}}, jnp.asarray(x)))
  references = [torch.nn.RMSNorm(hidden, eps=config.layer_norm_eps), llama.LlamaRMSNorm(hidden, config.layer_norm_eps)]
  for reference in references:
    with torch.no_grad():
      reference.weight.copy_(torch.from_numpy(scale))
      np.testing.assert_allclose(ours, reference(torch.from_numpy(x)).numpy(), rtol=1e-5, atol=1e-5)

  params = nn.unbox(_FeedForward(config).init(jax.random.key(0), jnp.asarray(x)))["params"]
  assert set(params) == {"intermediate", "output"} and "bias" not in params["output"]
  wi, wo = np.asarray(params["intermediate"]["kernel"]), np.asarray(params["output"]["kernel"])  # [h, 2, i], [i, h]
  ours = np.asarray(_FeedForward(config).apply({"params": params}, jnp.asarray(x)))
  reference = llama.LlamaMLP(
    transformers.LlamaConfig(hidden_size=hidden, intermediate_size=intermediate, hidden_act="silu", mlp_bias=False)
  )
  with torch.no_grad():
    reference.gate_proj.weight.copy_(torch.from_numpy(wi[:, 0].T.copy()))
    reference.up_proj.weight.copy_(torch.from_numpy(wi[:, 1].T.copy()))
    reference.down_proj.weight.copy_(torch.from_numpy(wo.T.copy()))
    np.testing.assert_allclose(ours, reference(torch.from_numpy(x)).numpy(), rtol=1e-5, atol=1e-5)
