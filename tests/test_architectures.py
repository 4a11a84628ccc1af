"""The model's parts by name (model/architectures.py, model/parts.py): each family resolves to its composition, an
unknown name is refused naming the key, the value and the names there are, and a new composition (a new entry in
the architectures table, with parts registered in the part tables) is all a new architecture takes."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import flops
from bert_jax.handoff.hf_configs import hf_config
from bert_jax.model import architectures, attention, feed_forward, layers, param_layout, parts, pretraining_heads
from bert_jax.model.architectures import Architecture, Part
from bert_jax.model.attention_patterns import Span, global_attention
from bert_jax.model.bert_config import BertConfig
from bert_jax.model.electra import ElectraForPretraining
from bert_jax.model.embeddings import AbsoluteEmbeddings
from bert_jax.model.encoder import BertForPretraining, BertModel, encoder_intermediates, init_params
from bert_jax.model.heads import task_model
from bert_jax.model.post_norm import PostNormLayer


def _inputs(config: BertConfig, batch: int = 2, seq: int = 10):
  rng = np.random.default_rng(0)
  input_ids = jnp.asarray(rng.integers(0, config.vocab_size, (batch, seq)), jnp.int32)
  input_mask = jnp.ones((batch, seq), jnp.int32).at[1, 7:].set(0)
  segment_ids = jnp.zeros((batch, seq), jnp.int32)
  positions = jnp.asarray(rng.integers(0, seq, (batch, 3)), jnp.int32)
  return input_ids, input_mask, segment_ids, positions


def _register(monkeypatch, name: str, architecture: Architecture) -> None:
  monkeypatch.setitem(architectures.ARCHITECTURES, name, architecture)


@pytest.mark.parametrize(
  "model_type, name, head",
  [
    ("bert", "BERT", "bert"),
    ("roberta", "RoBERTa", "bert"),
    ("albert", "ALBERT", "bert"),
    ("electra", "ELECTRA", "electra"),
  ],
)
def test_each_family_resolves_to_its_composition(model_type, name, head):
  config = BertConfig(model_type=model_type)
  assert config.architecture == Architecture(
    name=name,
    embeddings="absolute",
    layer="post_norm",
    feed_forward="dense",
    attention_pattern="global",
    pretraining_head=head,
  )
  found = parts.resolve(config)
  assert found.embeddings is AbsoluteEmbeddings and found.layer is PostNormLayer
  assert found.feed_forward is feed_forward.DENSE and found.attention_pattern is global_attention
  assert found.pretraining_head is {"bert": pretraining_heads.BERT, "electra": pretraining_heads.ELECTRA}[head]
  assert found.attention_pattern(config) == (Span(),) * config.num_layers


def test_every_registered_architecture_composes_parts_that_exist():
  for model_type in architectures.ARCHITECTURES:
    token = architectures.architecture(model_type).part("embeddings").name == "token"
    rotary = {"rope_theta": 160000.0} if token else {}
    parts.resolve(BertConfig(model_type=model_type, **rotary))


def test_the_names_table_knows_which_heads_have_a_sentence_head():
  assert architectures.WITH_SENTENCE_HEAD == tuple(
    name for name, heads in parts.PRETRAINING_HEADS.items() if heads.sentence is not None
  )


def test_an_unknown_task_head_is_refused_where_the_task_model_is_made(monkeypatch, small_model_config):
  _register(monkeypatch, "headless", dataclasses.replace(Architecture(), task_head="nope"))
  config = dataclasses.replace(small_model_config, model_type="headless")
  with pytest.raises(ValueError, match=r"model.model_type='headless' composes task_head='nope', which is not a task_h"):
    task_model(config, "classification", 2)


def test_an_argument_a_part_does_not_take_is_refused_naming_the_ones_it_does(monkeypatch, small_model_config):
  _register(monkeypatch, "misargued", Architecture(layer=Part("post_norm", first_attention_norm=False)))
  config = dataclasses.replace(small_model_config, model_type="misargued")
  with pytest.raises(ValueError, match=r"gives layer='post_norm' the arguments \('first_attention_norm',\), which it "):
    parts.resolve(config)
  _register(monkeypatch, "misargued", Architecture(pretraining_head=Part("bert", untied=True)))
  with pytest.raises(ValueError, match=r"the arguments \('untied',\), which it does not take; it takes \(.*'tied'"):
    parts.resolve(config)


def test_a_part_is_a_name_or_a_part_with_arguments():
  modernbert = architectures.architecture("modernbert")
  assert modernbert.part("layer") == Part("pre_norm", first_attention_norm=False)
  assert modernbert.part("embeddings") == Part("token") and modernbert.embeddings == "token"
  assert repr(Part("mlm", transform=False, tied=False)) == "Part('mlm', tied=False, transform=False)"
  assert hash(Part("mlm", tied=False)) == hash(Part("mlm", tied=False))


def test_an_unknown_family_is_refused_naming_the_families():
  with pytest.raises(
    ValueError,
    match=r"model.model_type='gpt2' is not supported; expected one of \('bert', 'roberta', 'albert', 'electra', "
    r"'modernbert'\)",
  ):
    BertConfig(model_type="gpt2")


@pytest.mark.parametrize("role", list(parts.TABLES))
def test_an_unknown_part_is_refused_naming_the_role_the_name_and_the_parts(monkeypatch, small_model_config, role):
  _register(monkeypatch, "misnamed", dataclasses.replace(Architecture(), **{role: "nope"}))
  config = dataclasses.replace(small_model_config, model_type="misnamed")  # The table of names takes it ...
  allowed = tuple(parts.TABLES[role])
  message = rf"model.model_type='misnamed' composes {role}='nope', which is not a {role} part; expected one of "
  with pytest.raises(ValueError, match=message + rf"\({', '.join(repr(name) for name in allowed)},?\)"):
    init_params(BertForPretraining(config), jax.random.key(0))  # ... the model, built from its parts, does not.


def test_electras_model_refuses_a_composition_without_its_heads(small_model_config):
  with pytest.raises(ValueError, match=r"pretraining_head='bert', which has no discriminator head"):
    init_params(ElectraForPretraining(small_model_config), jax.random.key(0))


@pytest.mark.slow
def test_bert_under_a_new_name_is_bert(monkeypatch, small_model_config):
  """One entry in the architectures table: BERT's composition, here with ALBERT's activation, under a new name builds
  the same tree and computes the same numbers as the "bert" family with that activation; Hugging Face files, whose
  names are per family, are refused for it."""
  _register(monkeypatch, "bert_gelu_new", architectures.ARCHITECTURES["bert"])
  bert = dataclasses.replace(small_model_config, hidden_act="gelu_new")
  renamed = dataclasses.replace(bert, model_type="bert_gelu_new")
  params = nn.meta.unbox(init_params(BertForPretraining(renamed), jax.random.key(0)))
  assert jax.tree.structure(params) == jax.tree.structure(
    nn.meta.unbox(init_params(BertForPretraining(bert), jax.random.key(0)))
  )
  inputs = _inputs(renamed)
  outputs = BertForPretraining(renamed).apply({"params": params}, *inputs)
  jax.tree.map(np.testing.assert_array_equal, outputs, BertForPretraining(bert).apply({"params": params}, *inputs))
  with pytest.raises(ValueError, match=r"model.model_type='bert_gelu_new' has no Hugging Face config.json"):
    hf_config(renamed)


def _gated_apply(config, modules, x, deterministic):
  del deterministic
  gate = layers.ACTIVATIONS[config.hidden_act](modules["gate"](x))
  return modules["output"](gate * modules["intermediate"](x))


# A feed-forward part of a test's own: a GLU (GeGLU with "gelu"), as a new architecture's parts module would add it.
_GATED = feed_forward.FeedForward(
  sublayers=(
    ("gate", lambda config, name: layers.dense(config, config.intermediate_size, ("embed", "mlp"), name=name)),
    *feed_forward.DENSE.sublayers,
  ),
  apply=_gated_apply,
  flops_per_token=lambda config: 3 * 2 * config.hidden_size * config.intermediate_size,
)


@pytest.mark.parametrize("layer_sharing", ["none", "ffn"])
def test_a_new_part_and_one_architecture_entry_build_train_and_count(monkeypatch, small_model_config, layer_sharing):
  """A feed-forward registered in parts.FEED_FORWARDS and a composition naming it: every layer holds the new part's
  sub-modules (shared across layers by `layer_sharing="ffn"`, as the layer part groups them), a gradient reaches
  them, and the model FLOPs count the part's own."""
  monkeypatch.setitem(parts.FEED_FORWARDS, "gated", _GATED)
  _register(monkeypatch, "gated_bert", Architecture(feed_forward="gated"))
  config = dataclasses.replace(small_model_config, model_type="gated_bert", layer_sharing=layer_sharing)
  model = BertForPretraining(config)
  params = nn.meta.unbox(init_params(model, jax.random.key(0)))
  sublayers = {"attention", "attention_layer_norm", "gate", "intermediate", "output", "output_layer_norm"}
  if layer_sharing == "none":
    assert set(params["bert"]["layer_1"]) == sublayers
  else:
    shared = {"gate", "intermediate", "output", "output_layer_norm"}
    assert set(params["bert"]["layer_1"]) == sublayers - shared
    assert {f"shared_{name}" for name in shared} <= set(params["bert"])
  inputs = _inputs(config)

  def loss(p):
    outputs = model.apply({"params": p}, *inputs, deterministic=False, rngs={"dropout": jax.random.key(1)})
    return jnp.mean(outputs["mlm_logits"] ** 2) + jnp.mean(outputs["nsp_logits"] ** 2)

  value, grads = jax.jit(jax.value_and_grad(loss))(params)
  gate = grads["bert"]["layer_0"]["gate"] if layer_sharing == "none" else grads["bert"]["shared_gate"]
  assert np.isfinite(value) and np.abs(gate["kernel"]).max() > 0
  batch, seq, predictions = 4, 16, 3
  extra = flops.train_flops_per_step(config, batch, seq, predictions) - flops.train_flops_per_step(
    small_model_config, batch, seq, predictions
  )
  assert extra == 3 * config.num_layers * batch * seq * 2 * config.hidden_size * config.intermediate_size


@dataclasses.dataclass(frozen=True)
class _Window:
  """A span of a test's own: the keys within `radius` positions of the query, in its instance."""

  radius: int
  rope_theta: float = 0.0

  def mask(self, input_mask):
    seq = input_mask.shape[-1]
    distance = jnp.abs(jnp.arange(seq)[:, None] - jnp.arange(seq)[None])
    return attention.attention_mask(input_mask) & (distance <= self.radius)

  def splash_mask(self, seq):
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    return splash.LocalMask((seq, seq), (self.radius, self.radius), offset=0)

  def keys_per_query(self, seq):
    return min(seq, 2 * self.radius + 1)


def test_an_attention_pattern_gives_each_layer_its_span(monkeypatch, small_model_config):
  """A pattern registered in parts.ATTENTION_PATTERNS: global attention in layer 0, a window of one position either
  side in layer 1; a scan over both layers computes the same (each layer's span chosen by a traced index), and one
  module shared by both (`layer_sharing="all"`) cannot hold two spans and is refused."""
  alternating = lambda config: tuple(_Window(1) if i % 2 else Span() for i in range(config.num_layers))
  monkeypatch.setitem(parts.ATTENTION_PATTERNS, "alternating", alternating)
  _register(monkeypatch, "windowed_bert", Architecture(attention_pattern="alternating"))
  config = dataclasses.replace(small_model_config, model_type="windowed_bert")
  model = BertModel(config)
  params = nn.meta.unbox(init_params(model, jax.random.key(0)))
  input_ids, input_mask, segment_ids, _ = _inputs(config)
  _, state = model.apply({"params": params}, input_ids, input_mask, segment_ids, mutable=["intermediates"])
  probs = np.asarray(encoder_intermediates(state["intermediates"], config)["attention_probs"])  # [layers, b, h, q, k]
  far = np.abs(np.arange(10)[:, None] - np.arange(10)[None]) > 1  # Row 0 has no padding: every query is real.
  assert np.all(probs[1, 0][..., far] == 0) and np.all(probs[0, 0][..., far] > 0)
  scanned = dataclasses.replace(config, scan_layers=True)
  _, state = BertModel(scanned).apply(
    {"params": param_layout.convert(params, scanned=True)},
    input_ids,
    input_mask,
    segment_ids,
    mutable=["intermediates"],
  )
  np.testing.assert_allclose(
    encoder_intermediates(state["intermediates"], scanned)["attention_probs"], probs, atol=1e-6
  )
  with pytest.raises(ValueError, match=r"pattern 'alternating', whose layers differ, and model.layer_sharing='all'"):
    init_params(BertModel(dataclasses.replace(config, layer_sharing="all")), jax.random.key(0))


@pytest.mark.parametrize(
  "model_type, name",
  [
    ("bert", "BERT"),
    ("roberta", "RoBERTa"),
    ("albert", "ALBERT"),
    ("electra", "ELECTRA"),
    ("modernbert", "ModernBERT"),
  ],
)
def test_a_run_header_and_a_dry_run_name_the_family_they_train(model_type, name):
  """The run header's model row and the dry run's (both `BertConfig.title`) name the family, not "BERT" for all."""
  from bert_jax import progress

  extra = dict(rope_theta=10_000.0) if model_type == "modernbert" else {}
  config = BertConfig(model_type=model_type, vocab_size=99, num_layers=2, hidden_size=32, num_heads=2, **extra)
  assert progress.model_row(config, 1234).startswith(f"{name} L2 H32 A2 (feed-forward ")
  assert config.title == f"{name} L2 H32 A2"
