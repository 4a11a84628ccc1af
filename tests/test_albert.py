"""ALBERT (`model_type="albert"`: factorised embeddings, `gelu_new`, shared layers) against transformers' PyTorch
`AlbertForPreTraining`, random weights, no download; the partial sharing modes, which have no reference, by
construction; and ALBERT's SentencePiece preprocessing against transformers' `AlbertTokenizer`, with the helpers
that check a SentencePiece export against `AutoTokenizer` (test_pretrained.py and test_electra.py use them too)."""

import dataclasses
import json
import os
import random
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from bert_jax import flops
from bert_jax.data.tokenizer import load_tokenizer, train_sentencepiece
from bert_jax.handoff import export, formats, hf_configs, pretrained
from bert_jax.handoff.hf_format import params_from_hf
from bert_jax.model.encoder import BertForPretraining, encoder_intermediates
from tests.test_encoder import _inputs, _reference, _reference_outputs
from tests.test_roberta import check_fine_tunes, check_hf_round_trip

_WORDS = (
  "the quick brown fox jumps over lazy dog Paris London café naïve résumé Zürich São Paulo Ångström year "
  "1,000 2024 3.14 don't isn't hello world"
).split()
# Punctuation, ALBERT's rewritten quotes, pieces that end in a digit and a comma, characters a small vocabulary lacks.
_MARKS = [*",.;:!?()-\"'", "''", "``", "9,", "12,5", "東京", "😀"]


def mixed_case_lines(count: int, seed: int) -> list[str]:
  """`count` lines of words in lower, upper and title case, accented ones, digits, punctuation, and spaces: runs of
  them, tabs, no-break spaces, leading and trailing ones."""
  rng = random.Random(seed)
  lines = []
  for _ in range(count):
    words = []
    for _ in range(rng.randint(3, 14)):
      word = rng.choice(_WORDS)
      words.append(rng.choice((word, word.upper(), word.capitalize())))
      if rng.random() < 0.25:
        words.append(rng.choice(_MARKS))
    text = "".join(word + rng.choice((" ", " ", "  ", "\t", " \u00a0")) for word in words).rstrip()
    lines.append(rng.choice(("", " ")) + text + rng.choice(("", "", "  ")))
  return lines


def train_mixed_case_sentencepiece(directory, vocab_size: int = 100, albert_names: bool = False) -> str:
  """A SentencePiece model trained on mixed-case lines by bert_jax (BERT's special names), or as ALBERT's
  `spiece.model` names them (`<pad>`, `<unk>`, then [CLS], [SEP], [MASK]); returns its path."""
  os.makedirs(directory, exist_ok=True)
  corpus = os.path.join(directory, "mixed_case.txt")
  with open(corpus, "w") as f:
    f.write("\n".join(mixed_case_lines(2000, seed=1)) + "\n")
  if not albert_names:
    return train_sentencepiece([corpus], os.path.join(directory, "mixed_case"), vocab_size)
  import sentencepiece as spm

  prefix = os.path.join(directory, "spiece")
  spm.SentencePieceTrainer.train(
    input=corpus,
    model_prefix=prefix,
    vocab_size=vocab_size,
    pad_id=0,
    pad_piece="<pad>",
    unk_id=1,
    unk_piece="<unk>",
    bos_id=-1,
    eos_id=-1,
    control_symbols=["[CLS]", "[SEP]", "[MASK]"],
    minloglevel=2,
  )
  return prefix + ".model"


def check_transformers_encodes_as_bert_jax(directory, tokenizer, lines: list[str]) -> None:
  """transformers' `AutoTokenizer` of `directory`, fast and slow, gives [CLS] + `tokenizer`'s ids + [SEP] for every
  line."""
  expected = [[tokenizer.cls_id, *tokenizer.encode(line), tokenizer.sep_id] for line in lines]
  for use_fast in (True, False):
    reference = transformers.AutoTokenizer.from_pretrained(directory, use_fast=use_fast)
    actual = reference(lines)["input_ids"]
    wrong = [(line, ids, want) for line, ids, want in zip(lines, actual, expected, strict=True) if ids != want]
    assert not wrong, (type(reference).__name__, len(wrong), wrong[0])


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
  # Shared layers, factorised embeddings, and ALBERT's spiece.model, whose preprocessing the fine-tuned run records.
  exported = tmp_path / "pretraining" / "exported"
  for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
    (exported / name).unlink()
  shutil.copy(train_mixed_case_sentencepiece(tmp_path / "albert", albert_names=True), exported / "spiece.model")
  check_fine_tunes(str(exported), tmp_path)
  recorded = pretrained.load(str(tmp_path / "sst2")).tokenizer.identity()["albert_preprocessing"]
  assert recorded == {"do_lower_case": True, "remove_space": True, "keep_accents": False}
  two_groups = dict(hf_configs.hf_config(albert_config), num_hidden_groups=2)
  with pytest.raises(ValueError, match=r"num_hidden_groups=2 and inner_group_num=1 for num_hidden_layers=3"):
    hf_configs.config_from_hf(two_groups, "config.json")


def test_an_albert_whose_embedding_size_is_its_hidden_size_is_read_and_exported_with_the_identity_projection(
  albert_config, tmp_path
):
  """bert_jax's ALBERT has no projection when embedding_size equals hidden_size; transformers' AlbertModel always has
  one (`embedding_hidden_mapping_in`). The export writes it as the identity (before: "The params lack
  bert/embeddings_project/kernel ... are the layers scanned?"), transformers' logits are bert_jax's, and a file whose
  projection is the identity reads back; any other projection is refused by name."""
  config = dataclasses.replace(albert_config, embedding_size=0)
  reference = _reference(config, cls=transformers.AlbertForPreTraining)
  mapping = reference.albert.encoder.embedding_hidden_mapping_in
  with torch.no_grad():
    mapping.weight.copy_(torch.eye(config.hidden_size))
    mapping.bias.zero_()
  loaded = check_hf_round_trip(reference, config, tmp_path)
  assert "embeddings_project" not in loaded.params["bert"]
  exported = transformers.AlbertForPreTraining.from_pretrained(tmp_path / "exported").eval()
  assert exported.config.embedding_size == config.hidden_size
  input_ids, input_mask, segment_ids, positions = inputs = _inputs(config)
  theirs = _reference_outputs(exported, inputs)
  ours = jax.jit(lambda p, *x: BertForPretraining(config).apply({"params": p}, *x))(
    loaded.params, input_ids, input_mask, segment_ids, positions
  )
  expected_mlm = np.take_along_axis(theirs.prediction_logits.numpy(), positions[:, :, None], axis=1)
  np.testing.assert_allclose(ours["mlm_logits"], expected_mlm, atol=1e-5, rtol=0)
  np.testing.assert_allclose(ours["nsp_logits"], theirs.sop_logits.numpy(), atol=1e-5, rtol=0)
  tensors = {name: value.numpy() for name, value in reference.state_dict().items()}
  tensors["albert.encoder.embedding_hidden_mapping_in.bias"][0] = 0.5
  with pytest.raises(ValueError, match=r"tensor albert.encoder.embedding_hidden_mapping_in is not the identity; "):
    params_from_hf(tensors, config)


@pytest.mark.slow
def test_albert_s_text_preprocessing_is_read_applied_and_exported_as_transformers_applies_it(albert_config, tmp_path):
  """A raw SentencePiece model (bert_jax's) in an ALBERT exports as a tokenizer that transformers' AutoTokenizer
  encodes with as bert_jax does (it lower-cased before: "The" was id 7, not 48); a hub ALBERT's preprocessing flags
  (its tokenizer_config.json, or AlbertTokenizer's defaults without one) are applied as AlbertTokenizer applies them,
  and travel with a bundle and a Hugging Face export."""
  lines = mixed_case_lines(300, seed=2)
  ours = tmp_path / "ours"
  _reference(albert_config, cls=transformers.AlbertForPreTraining).save_pretrained(ours)
  shutil.copy(train_mixed_case_sentencepiece(tmp_path / "raw"), ours / "tokenizer.model")
  tokenizer = load_tokenizer("sentencepiece", str(ours / "tokenizer.model"))
  assert tokenizer.encode("The") != tokenizer.encode("the")  # A cased model: lower-casing changes the ids.
  assert formats.read_source(str(ours)).albert_preprocessing is None  # No tokenizer_config.json beside our file: raw.
  exported = tmp_path / "ours_hf"
  export.export(str(ours), str(exported), "huggingface")
  assert json.loads((exported / "tokenizer_config.json").read_text())["tokenizer_class"] == "DebertaV2Tokenizer"
  check_transformers_encodes_as_bert_jax(exported, tokenizer, lines)
  read_back = formats.read_source(str(exported))
  assert (read_back.tokenizer_file, read_back.albert_preprocessing) == (str(exported / "spm.model"), None)

  # A hub ALBERT: ALBERT's spiece.model, no tokenizer_config.json (AlbertTokenizer's defaults), then one.
  hub = tmp_path / "hub"
  shutil.copytree(ours, hub)
  (hub / "tokenizer.model").unlink()
  spiece = str(hub / "spiece.model")
  shutil.copy(train_mixed_case_sentencepiece(tmp_path / "albert", albert_names=True), spiece)

  def check_encodes_as_albert_tokenizer(tokenizer, flags):
    assert tokenizer.identity()["albert_preprocessing"] == flags
    reference = transformers.AlbertTokenizer(spiece, **flags)
    assert [tokenizer.encode(line) for line in lines] == [
      reference.encode(line, add_special_tokens=False) for line in lines
    ]

  defaults = {"do_lower_case": True, "remove_space": True, "keep_accents": False}
  tokenizer = pretrained.load(str(hub)).tokenizer
  check_encodes_as_albert_tokenizer(tokenizer, defaults)
  # The flags travel: a bundle records them; a Hugging Face export names them for AlbertTokenizer.
  bundle = pretrained.load(export.export(str(hub), str(tmp_path / "bundle")))
  assert bundle.tokenizer.identity() == dict(tokenizer.identity(), path=bundle.tokenizer.path)
  again = tmp_path / "hub_hf"
  export.export(bundle.source.path, str(again), "huggingface")
  special = dict(pad_token="<pad>", unk_token="<unk>", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
  settings = json.loads((again / "tokenizer_config.json").read_text())
  assert settings == {"tokenizer_class": "AlbertTokenizer", **defaults, **special}
  slow = transformers.AutoTokenizer.from_pretrained(again, use_fast=False)  # The fast one is not ALBERT's own.
  assert [slow.encode(line) for line in lines] == [[2, *tokenizer.encode(line), 3] for line in lines]
  assert formats.read_source(str(again)).albert_preprocessing == defaults

  flags = {"do_lower_case": False, "remove_space": True, "keep_accents": True}
  (hub / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "AlbertTokenizer", **flags}))
  check_encodes_as_albert_tokenizer(pretrained.load(str(hub)).tokenizer, flags)
  # A run whose config names the same file, raw, is not the source's tokenizer.
  with pytest.raises(ValueError, match=r"cannot ask for ALBERT's preprocessing; fine-tuning from the source takes"):
    formats.check_tokenizer(
      formats.read_source(str(hub)), load_tokenizer("sentencepiece", spiece).identity(), "init_from"
    )
  # A class that encodes otherwise is refused, naming the file.
  (hub / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "T5Tokenizer"}))
  with pytest.raises(ValueError, match=rf"{hub / 'tokenizer_config.json'}: tokenizer_class 'T5Tokenizer' encodes"):
    formats.read_source(str(hub))


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
