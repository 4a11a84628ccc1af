"""ModernBERT (model_type "modernbert") against transformers' `ModernBertForMaskedLM` built from a config with random
weights: the sequence output, the MLM logits and every parameter's gradient, on padded rows longer than the local
window, in both layer layouts and under remat; packed rows, whose instances compute what they compute alone; and
the Hugging Face files both ways (config.json, weights, a byte-level BPE tokenizer.json trained on a few lines)."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.handoff import export, hf_configs, hf_format, pretrained
from bert_jax.model import param_layout
from bert_jax.model.bert_config import BertConfig, from_bert_json, to_bert_json
from bert_jax.model.encoder import BertForPretraining
from tests.helpers import config_of_hf
from tests.test_roberta import check_hf_round_trip

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SEQ, LENGTHS, POSITIONS = 24, (24, 17), ((1, 5, 11, 20), (0, 3, 9, 16))


def _hf_config(**overrides):
  values = dict(
    vocab_size=101,
    hidden_size=32,
    num_hidden_layers=4,  # Layers 0 and 3 global, 1 and 2 local.
    num_attention_heads=4,
    intermediate_size=48,
    max_position_embeddings=64,
    local_attention=8,  # 4 keys each side: rows of 24 tokens are longer than the window.
    global_attn_every_n_layers=3,
    # Bases far apart (ModernBERT's: 160,000 and 10,000), so that a layer at the other's base is told apart within a
    # 24-token row.
    global_rope_theta=1000.0,
    local_rope_theta=20.0,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    cls_token_id=1,
    sep_token_id=2,
    embedding_dropout=0.0,
    attention_dropout=0.0,
    mlp_dropout=0.0,
    reference_compile=False,
    initializer_range=0.2,  # 10x BERT's: attention far from uniform, so that positions and windows matter.
  )
  values.update(overrides)
  return transformers.ModernBertConfig(**values)


@pytest.fixture(scope="module")
def reference():
  """transformers' model, its inputs, outputs and gradients (of a fixed random weighting of the MLM logits at the
  masked positions and of the sequence output at real tokens)."""
  torch.manual_seed(0)
  hf_config = _hf_config()
  model = transformers.ModernBertForMaskedLM._from_config(hf_config, attn_implementation="eager").float().eval()
  rng = np.random.default_rng(0)
  ids = rng.integers(3, hf_config.vocab_size, (len(LENGTHS), SEQ))
  mask = (np.arange(SEQ)[None] < np.asarray(LENGTHS)[:, None]).astype(np.int64)
  ids = ids * mask
  positions = np.asarray(POSITIONS)
  logit_weights = rng.normal(size=(*positions.shape, hf_config.vocab_size)).astype(np.float32)
  sequence_weights = (rng.normal(size=(len(LENGTHS), SEQ, hf_config.hidden_size)) * mask[..., None]).astype(np.float32)

  out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
  logits = out.logits[torch.arange(len(LENGTHS))[:, None], torch.tensor(positions)]
  # The encoder's output after its final norm (the masked LM's `hidden_states` are before it).
  sequence = model.model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state
  loss = (logits * torch.tensor(logit_weights)).sum() + (sequence * torch.tensor(sequence_weights)).sum()
  loss.backward()
  weights = {name: value.detach().numpy() for name, value in model.state_dict().items()}
  grads = {name: value.grad.numpy() for name, value in model.named_parameters()}
  return dict(
    hf_config=hf_config,
    weights=weights,
    grads=grads,
    ids=ids,
    mask=mask,
    positions=positions,
    logit_weights=logit_weights,
    sequence_weights=sequence_weights,
    logits=logits.detach().numpy(),
    sequence=sequence.detach().numpy(),
  )


def _loss(model, params, reference):
  out = model.apply(
    {"params": params},
    jnp.asarray(reference["ids"], jnp.int32),
    jnp.asarray(reference["mask"], jnp.int32),
    jnp.zeros_like(jnp.asarray(reference["ids"], jnp.int32)),
    jnp.asarray(reference["positions"], jnp.int32),
  )
  loss = jnp.sum(out["mlm_logits"] * reference["logit_weights"]) + jnp.sum(
    out["sequence_output"] * reference["sequence_weights"]
  )
  return loss, out


@pytest.mark.parametrize(
  "scan_layers, remat",
  [
    (False, "none"),
    pytest.param(True, "none", marks=pytest.mark.slow),
    pytest.param(True, "full", marks=pytest.mark.slow),
    pytest.param(False, "save_dots", marks=pytest.mark.slow),
  ],
)
def test_modernbert_equals_transformers_outputs_and_every_gradient(reference, scan_layers, remat):
  config = config_of_hf(reference["hf_config"], scan_layers=scan_layers, remat=remat)
  params = jax.tree.map(jnp.asarray, hf_format.params_from_hf(reference["weights"], config))
  if scan_layers:
    params = param_layout.convert(params, scanned=True)
  model = BertForPretraining(config)
  (_, out), grads = jax.value_and_grad(lambda p: _loss(model, p, reference), has_aux=True)(params)
  assert "nsp_logits" not in out and out["pooled_output"] is None

  real = reference["mask"].astype(bool)
  np.testing.assert_allclose(out["sequence_output"][real], reference["sequence"][real], atol=2e-5, rtol=1e-5)
  np.testing.assert_allclose(out["mlm_logits"], reference["logits"], atol=5e-5, rtol=1e-5)

  grads = param_layout.convert(jax.device_get(grads), scanned=False) if scan_layers else jax.device_get(grads)
  expected = hf_format.params_from_hf(reference["grads"], config)
  flat, flat_expected = (jax.tree_util.tree_flatten_with_path(tree)[0] for tree in (grads, expected))
  assert [path for path, _ in flat] == [path for path, _ in flat_expected]  # Every parameter, none extra.
  for (path, value), (_, want) in zip(flat, flat_expected, strict=True):
    np.testing.assert_allclose(value, want, atol=5e-5, rtol=1e-4, err_msg=jax.tree_util.keystr(path))


def test_a_packed_row_computes_what_its_instances_compute_alone(reference):
  """Two instances in one row (instance numbers 1 and 2, positions restarting at the second): each token's output
  equals the output of its instance run alone, local and global layers, rotary positions and all."""
  config = config_of_hf(reference["hf_config"])
  params = jax.tree.map(jnp.asarray, hf_format.params_from_hf(reference["weights"], config))
  model = BertForPretraining(config)
  rng = np.random.default_rng(1)
  first, second = rng.integers(3, 101, 14), rng.integers(3, 101, 10)

  @jax.jit  # A program per length: under half the CPU time of running the model op by op (3.2 CPU-s against 8.3).
  def sequence_output(ids, mask, positions):
    out = model.apply(
      {"params": params}, ids, mask, jnp.zeros_like(ids), jnp.zeros((1, 1), jnp.int32), position_ids=positions
    )
    return out["sequence_output"][0]

  def run(ids, mask, positions):
    return np.asarray(sequence_output(*(jnp.asarray(x, jnp.int32)[None] for x in (ids, mask, positions))))

  packed = run(
    np.concatenate([first, second]), np.repeat([1, 2], [14, 10]), np.concatenate([np.arange(14), np.arange(10)])
  )
  np.testing.assert_allclose(packed[:14], run(first, np.ones(14), np.arange(14)), atol=2e-5, rtol=1e-5)
  np.testing.assert_allclose(packed[14:], run(second, np.ones(10), np.arange(10)), atol=2e-5, rtol=1e-5)


# In and out of the Hugging Face format: config.json both ways, a ModernBERT directory (weights and its byte-level BPE
# tokenizer.json) through pretrained.load and the export (its task models: tests/test_modernbert_heads.py).


def test_the_defaults_bert_jax_reads_are_transformers_modernbert_config_s():
  assert hf_configs.MODERNBERT_DEFAULTS == {
    name: value
    for name, value in transformers.ModernBertConfig().to_dict().items()
    if name in hf_configs.MODERNBERT_DEFAULTS
  }


def test_a_modernbert_config_json_reads_as_bert_jax_s_fields_and_writes_back_the_same():
  hf_config = _hf_config(
    initializer_range=0.05,
    norm_bias=True,
    attention_bias=True,
    mlp_bias=True,
    classifier_bias=True,
    classifier_activation="silu",
    classifier_pooling="mean",
    classifier_dropout=0.25,
  )
  fields = hf_config.to_dict()
  ours = hf_configs.config_from_hf(fields, "config.json")
  read = [getattr(ours, name) for name in ("model_type", "num_layers", "hidden_size", "num_heads", "intermediate_size")]
  assert read == ["modernbert", 4, 32, 4, 48]
  assert (ours.rope_theta, ours.local_rope_theta, ours.local_attention, ours.global_attention_every) == (1000, 20, 8, 3)
  assert (ours.layer_norm_eps, ours.initializer_range, ours.hidden_act) == (1e-5, 0.05, "gelu")
  assert ours.norm_bias and ours.linear_bias and (ours.hidden_dropout_prob, ours.attention_dropout_prob) == (0, 0)
  classifier = [getattr(ours, f"classifier_{name}") for name in ("activation", "bias", "pooling", "dropout")]
  assert classifier == ["silu", True, "mean", 0.25]
  written = hf_configs.hf_config(ours)
  assert written["architectures"] == ["ModernBertForMaskedLM"]
  assert {name: fields[name] for name in written if name != "architectures" and not name.endswith("_token_id")} == {
    name: value for name, value in written.items() if name != "architectures" and not name.endswith("_token_id")
  }
  assert hf_configs.config_from_hf(written, "written") == ours
  # Left out, a field is transformers' default; local_rope_theta null is the global base (bert_jax's 0).
  assert hf_configs.config_from_hf({"model_type": "modernbert"}, "config.json").num_layers == 22
  assert hf_configs.config_from_hf(dict(fields, local_rope_theta=None), "config.json").local_rope_theta == 0.0
  # bert_jax's local_attention 0 (every layer global) as transformers says it: no local layer.
  every_global = hf_configs.hf_config(dataclasses.replace(ours, local_attention=0))
  assert every_global["global_attn_every_n_layers"] == 1
  assert all(
    layer.attn.local_attention == (-1, -1)
    for layer in transformers.ModernBertModel(transformers.ModernBertConfig(**every_global)).layers
  )


@pytest.mark.parametrize(
  "overrides, message",
  [
    (dict(mlp_bias=True), "attention_bias=False and mlp_bias=True; bert_jax holds both as one, model.linear_bias"),
    (dict(classifier_activation="relu"), "classifier_activation='relu'; bert_jax has"),
    (dict(classifier_pooling="max"), "config.json: model.classifier_pooling='max' is not supported"),
    (dict(embedding_dropout=0.1), "embedding_dropout=0.1 and mlp_dropout=0.0; .*model.hidden_dropout_prob"),
    (dict(decoder_bias=False), "decoder_bias=False; bert_jax's masked LM decodes"),
    (dict(tie_word_embeddings=False), "tie_word_embeddings=False"),
    (dict(rope_scaling={"rope_type": "linear", "factor": 2.0}), "rope_scaling=.*'linear'.*unscaled"),
    (dict(hidden_activation="relu", classifier_activation="relu"), "hidden_activation='relu'; bert_jax has"),
    (dict(local_attention=0), "local_attention=0 with global_attn_every_n_layers=3"),
    (dict(architectures=["ModernBertForCausalLM"]), "architectures=\\['ModernBertForCausalLM'\\]; bert_jax reads"),
    (dict(num_attention_heads=5), "config.json: model.hidden_size=32 is not divisible by model.num_heads=5"),
  ],
)
def test_what_bert_jax_cannot_hold_is_refused_on_import_naming_the_field(overrides, message):
  with pytest.raises(ValueError, match=message):
    hf_configs.config_from_hf(dict(_hf_config().to_dict(), **overrides), "config.json")


def test_what_transformers_cannot_hold_is_refused_on_export_naming_the_field(small_model_config):
  ours = config_of_hf(_hf_config())
  for field, value, needs in (("norm", "rms_norm", "'layer_norm'"), ("layer_sharing", "all", "'none'")):
    with pytest.raises(ValueError, match=f"model.{field}={value!r}: transformers' ModernBERT has no such .*{needs}"):
      hf_configs.hf_config(dataclasses.replace(ours, **{field: value}))
  # The BERT families' files have no rotary positions, RMSNorm or bias switches.
  for field, value in (("rope_theta", 10000.0), ("norm", "rms_norm"), ("linear_bias", False)):
    with pytest.raises(ValueError, match=f"model.{field}={value!r}: transformers' BERT has no such setting"):
      hf_configs.hf_config(dataclasses.replace(small_model_config, **{field: value}))


def test_a_bundle_s_bert_config_json_keeps_every_modernbert_field():
  ours = config_of_hf(_hf_config(), norm="rms_norm", linear_bias=True)
  written = to_bert_json(ours)
  assert {"rope_theta", "local_rope_theta", "local_attention", "global_attention_every", "norm", "norm_bias"} <= set(
    written
  )
  assert from_bert_json(written, "bert_config.json") == ours
  assert "rope_theta" not in to_bert_json(BertConfig())  # A BERT's is the original format.


@pytest.fixture(scope="module")
def bpe_files():
  """A ModernBERT-style tokenizer as `tokenizers` saves it: a byte-level BPE trained on a few lines, BERT's special
  tokens added after its pieces (ids 400 to 404, as ModernBERT's follow its vocabulary), [CLS] x [SEP] around a text;
  one tokenizer.json, with the tokenizer_config.json that names transformers' class. Returns (files, special ids)."""
  from tokenizers import ByteLevelBPETokenizer, processors

  from tests.test_tokenizer import BPE_TEXT

  trainer = ByteLevelBPETokenizer()
  trainer.train_from_iterator(BPE_TEXT * 2, vocab_size=400, show_progress=False)
  specials = {"unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]"}
  specials["mask_token"] = "[MASK]"
  trainer.add_special_tokens(list(specials.values()))
  ids = {name: trainer.token_to_id(token) for name, token in specials.items()}
  trainer.post_processor = processors.TemplateProcessing(
    single="[CLS] $A [SEP]",
    pair="[CLS] $A [SEP] $B [SEP]",
    special_tokens=[("[CLS]", ids["cls_token"]), ("[SEP]", ids["sep_token"])],
  )
  files = {
    "tokenizer.json": trainer._tokenizer.to_str().encode(),
    "tokenizer_config.json": json.dumps(dict(specials, tokenizer_class="PreTrainedTokenizerFast")).encode(),
  }
  return files, ids


def _masked_lm(bpe_files, seed: int = 0, **overrides):
  """transformers' ModernBertForMaskedLM of `_hf_config` (with `overrides`) with random weights, its table wider than
  the tokenizer's 405 ids (as ModernBERT's 50,368 rows hold 50,285 ids) and its special ids the tokenizer's."""
  _, ids = bpe_files
  hf_config = _hf_config(
    vocab_size=416,
    pad_token_id=ids["pad_token"],
    cls_token_id=ids["cls_token"],
    bos_token_id=ids["cls_token"],
    sep_token_id=ids["sep_token"],
    eos_token_id=ids["sep_token"],
    **overrides,
  )
  torch.manual_seed(seed)
  return transformers.ModernBertForMaskedLM(hf_config).float().eval()


@pytest.mark.slow
def test_modernbert_files_load_and_export_as_transformers_reads_them(bpe_files, tmp_path):
  files, ids = bpe_files
  reference = _masked_lm(bpe_files)
  config = config_of_hf(reference.config, initializer_range=reference.config.initializer_range)
  loaded = check_hf_round_trip(reference, config, tmp_path / "mlm", files)
  assert set(loaded.params) == {"bert", "mlm_transform", "mlm_layer_norm", "mlm_output_bias"}  # No pooler, no NSP.
  assert "pooler" not in loaded.params["bert"]
  tokenizer = loaded.tokenizer
  assert (loaded.source.tokenizer_kind, tokenizer.vocab_size) == ("bpe", 405)
  assert (tokenizer.pad_id, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id) == tuple(
    ids[name] for name in ("pad_token", "cls_token", "sep_token", "mask_token")
  )
  exported = tmp_path / "mlm" / "exported"
  written = json.loads((exported / "config.json").read_text())
  assert (written["pad_token_id"], written["cls_token_id"], written["sep_token_id"]) == (
    tokenizer.pad_id,
    tokenizer.cls_id,
    tokenizer.sep_id,
  )

  # transformers' model of the exported files computes what bert_jax computes, on padded rows longer than the local
  # window, whose layers differ in span and rotary base.
  again = transformers.ModernBertForMaskedLM.from_pretrained(exported, attn_implementation="eager").eval()
  rng = np.random.default_rng(0)
  mask = (np.arange(SEQ)[None] < np.asarray(LENGTHS)[:, None]).astype(np.int64)
  input_ids = np.where(mask > 0, rng.integers(0, tokenizer.vocab_size, (len(LENGTHS), SEQ)), tokenizer.pad_id)
  with torch.no_grad():
    logits = again(input_ids=torch.tensor(input_ids), attention_mask=torch.tensor(mask)).logits.numpy()
  ours = pretrained.load(str(exported))
  positions = np.asarray(POSITIONS)
  out = BertForPretraining(ours.config).apply(
    {"params": ours.params}, *(jnp.asarray(x, jnp.int32) for x in (input_ids, mask, np.zeros_like(mask), positions))
  )
  expected = np.take_along_axis(logits, positions[:, :, None], axis=1)
  np.testing.assert_allclose(out["mlm_logits"], expected, atol=5e-5, rtol=1e-5)

  # The tokenizer beside the files, and the source's own tokenizer.json, give bert_jax's ids through AutoTokenizer.
  from tests.test_tokenizer import BPE_TEXT, TEXT

  for directory in (tmp_path / "mlm" / "source", exported):
    auto = transformers.AutoTokenizer.from_pretrained(directory)
    for line in TEXT[:4] + BPE_TEXT[-3:]:
      assert auto(line)["input_ids"] == [tokenizer.cls_id, *tokenizer.encode(line), tokenizer.sep_id], line

  # The bare encoder (ModernBertModel: no prefix, no head) both ways too.
  torch.manual_seed(1)
  encoder = check_hf_round_trip(transformers.ModernBertModel(reference.config), config, tmp_path / "encoder", files)
  assert set(encoder.params) == {"bert"}

  # A bundle keeps every ModernBERT field and the tokenizer as it was.
  bundle = pretrained.load(export.export(str(exported), str(tmp_path / "bundle")))
  assert bundle.config == ours.config and bundle.tokenizer.identity()["sha256"] == tokenizer.identity()["sha256"]
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(bundle.params), jax.device_get(ours.params))
