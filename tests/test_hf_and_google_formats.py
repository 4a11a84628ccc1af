"""The two outside formats both ways: a Hugging Face export loads in transformers and computes what bert_jax does;
Google's TF1 checkpoints (written here as google-research/bert wrote them) and transformers' other layouts load and
export as transformers reads them; a byte-level BPE travels as RoBERTa's files; pretraining starts from a Google
checkpoint with a fresh optimizer and refuses one that does not fit."""

import dataclasses
import json
import os
import pathlib
import re
import shutil
import types

import jax
import numpy as np
import pytest
import torch
import transformers

from bert_jax import jobs
from bert_jax.data import corpus, prepare, shards
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.handoff import export, formats, hf_names, pretrained
from bert_jax.handoff.hf_configs import hf_config
from bert_jax.handoff.hf_format import load_safetensors, params_from_hf, save_safetensors
from bert_jax.model.encoder import BertForPretraining, encoder_intermediates
from bert_jax.train import init_from
from tests.helpers import assert_params_equal
from tests.test_albert import check_transformers_encodes_as_bert_jax, mixed_case_lines, train_mixed_case_sentencepiece
from tests.test_encoder import _inputs, _reference, _reference_outputs
from tests.test_tokenizer import train_bpe

_equal = jax.tree.map


def test_the_hugging_face_export_loads_in_transformers_and_computes_what_bert_jax_does(
  wordpiece_run, exports, tmp_path
):
  _, _, params = wordpiece_run
  hf_dir = pathlib.Path(exports["huggingface"])
  assert sorted(os.listdir(hf_dir)) == [
    "config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer_config.json",
    "vocab.txt",
  ]
  reference, info = transformers.BertForPreTraining.from_pretrained(
    hf_dir, output_loading_info=True, attn_implementation="eager"
  )
  assert info == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": [], "error_msgs": []}
  assert transformers.AutoModel.from_pretrained(hf_dir, output_loading_info=True)[1]["missing_keys"] == []
  reference.save_pretrained(tmp_path / "resaved")  # What transformers itself writes: the same tensors.
  ours, theirs = (load_safetensors(str(d / "model.safetensors")) for d in (hf_dir, tmp_path / "resaved"))
  assert sorted(ours) == sorted(theirs)
  _equal(np.testing.assert_array_equal, ours, theirs)
  text = "w3 w17 . W5 w99"
  assert transformers.AutoTokenizer.from_pretrained(hf_dir)(text)["input_ids"] == [
    2,
    *pretrained.load(str(hf_dir)).tokenizer.encode(text),
    3,
  ]

  # Logits, every layer's hidden states and attention probabilities, in both layer layouts.
  inputs = _inputs(types.SimpleNamespace(vocab_size=101), batch=3, seq=24, predictions=6)
  expected = _reference_outputs(reference.eval(), inputs, attentions=True)
  for scan_layers in (False, True):
    loaded = pretrained.load(str(hf_dir), scan_layers=scan_layers)
    outputs, state = BertForPretraining(loaded.config).apply(
      {"params": loaded.params}, *inputs, mutable=["intermediates"]
    )
    collected = encoder_intermediates(state["intermediates"]["bert"], loaded.config)
    mlm = np.take_along_axis(expected.prediction_logits.numpy(), inputs[3][:, :, None], axis=1)
    np.testing.assert_allclose(outputs["mlm_logits"], mlm, atol=1e-5, rtol=0)
    np.testing.assert_allclose(outputs["nsp_logits"], expected.seq_relationship_logits.numpy(), atol=1e-5, rtol=0)
    np.testing.assert_allclose(collected["hidden_states"], np.stack(expected.hidden_states), atol=1e-5, rtol=0)
    np.testing.assert_allclose(collected["attention_probs"], np.stack(expected.attentions), atol=1e-5, rtol=0)
  # bert_jax -> Hugging Face -> bert_jax: bitwise the same parameters.
  assert_params_equal(pretrained.load(str(hf_dir)).params, params)


# The test's own TF1 writer, as google-research/bert's checkpoints were made: graph variables named by these rules
# (applied in order to the Hugging Face names), saved by tf.compat.v1's Saver.
_GOOGLE_RULES = [
  (r"^cls\.predictions\.bias$", "cls.predictions.output_bias"),
  (r"^cls\.seq_relationship\.weight$", "cls.seq_relationship.output_weights"),
  (r"^cls\.seq_relationship\.bias$", "cls.seq_relationship.output_bias"),
  (r"LayerNorm\.weight$", "LayerNorm.gamma"),
  (r"LayerNorm\.bias$", "LayerNorm.beta"),
  (r"_embeddings\.weight$", "_embeddings"),
  (r"\.weight$", ".kernel"),
  (r"\.layer\.(\d+)\.", r".layer_\1."),
]


def _write_google_bert(tensors: dict, config: dict, vocab: list[str], directory) -> None:
  import tensorflow as tf

  directory.mkdir()
  graph = tf.Graph()
  with graph.as_default():
    variables = []
    for name, value in tensors.items():
      for pattern, replacement in _GOOGLE_RULES:
        name = re.sub(pattern, replacement, name)
      value = value.T if name.endswith(".kernel") else value
      variables.append(tf.compat.v1.Variable(value, name=name.replace(".", "/")))
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      tf.compat.v1.train.Saver().save(session, str(directory / "bert_model.ckpt"), write_meta_graph=False)
  (directory / "bert_config.json").write_text(json.dumps(config))
  (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")


def _from_google(directory, seed: int) -> dict:
  """What `transformers`' own TF1 loader reads from a Google BERT directory, into a model of other weights."""
  config = transformers.BertConfig.from_json_file(str(directory / "bert_config.json"))
  torch.manual_seed(seed)
  model = transformers.load_tf_weights_in_bert(
    transformers.BertForPreTraining(config), config, str(directory / "bert_model.ckpt")
  )
  return {name: value.numpy() for name, value in model.state_dict().items()}


def test_google_bert_checkpoints_load_and_export_both_ways_as_transformers_reads_them(small_model_config, tmp_path):
  reference = _reference(small_model_config)
  everything = {name: value.numpy() for name, value in reference.state_dict().items()}
  tied = hf_names.names(small_model_config, "bert.").tied
  tensors = {name: value for name, value in everything.items() if name not in tied and "position_ids" not in name}
  bert_config = hf_config(small_model_config)
  del bert_config["model_type"], bert_config["architectures"], bert_config["layer_norm_eps"]
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *[f"w{i}" for i in range(96)]]
  google = tmp_path / "google"
  _write_google_bert(tensors, bert_config, vocab, google)
  _equal(np.testing.assert_array_equal, _from_google(google, seed=1), everything)  # The test's writer is right.

  loaded = pretrained.load(str(google))
  assert loaded.source.format == "google" and loaded.tokenizer.lower_case  # No upper case in the vocabulary.
  assert_params_equal(loaded.params, params_from_hf(tensors, small_model_config))

  # Google TF1 -> bert_jax -> Hugging Face: bitwise the original tensors.
  export.export(str(google), str(tmp_path / "hf"), "huggingface")
  exported = load_safetensors(str(tmp_path / "hf" / "model.safetensors"))
  assert sorted(exported) == sorted(tensors)
  _equal(np.testing.assert_array_equal, exported, tensors)

  # transformers' other two layouts: a PyTorch pytorch_model.bin, and safetensors in shards with an index.
  for name, options in (("torch_bin", dict(safe_serialization=False)), ("sharded", dict(max_shard_size="40KB"))):
    reference.save_pretrained(tmp_path / name, **options)
    shutil.copy(google / "vocab.txt", tmp_path / name)
    assert_params_equal(pretrained.load(str(tmp_path / name)).params, loaded.params)
  assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()

  # An encoder without pretraining heads (a Hugging Face BertModel) makes a bundle that loads as it is.
  encoder_only = tmp_path / "encoder_only"
  encoder_only.mkdir()
  save_safetensors(
    {k.removeprefix("bert."): v for k, v in tensors.items() if k.startswith("bert.")},
    encoder_only / "model.safetensors",
  )
  (encoder_only / "config.json").write_text(json.dumps(bert_config))
  shutil.copy(google / "vocab.txt", encoder_only)
  export.export(str(encoder_only), str(tmp_path / "encoder_bundle"))
  headless = pretrained.load(str(tmp_path / "encoder_bundle"))
  assert set(headless.params) == {"bert"}
  assert_params_equal(headless.params["bert"], loaded.params["bert"])

  # bert_jax -> Google TF1: what transformers' loader reads is the original model, and bert_jax reads it back.
  export.export(str(google), str(tmp_path / "google_again"), "google")
  assert {"bert_config.json", "vocab.txt", "bert_model.ckpt.index"} <= set(os.listdir(tmp_path / "google_again"))
  _equal(np.testing.assert_array_equal, _from_google(tmp_path / "google_again", seed=2), everything)
  assert_params_equal(pretrained.load(str(tmp_path / "google_again")).params, loaded.params)


def test_a_byte_level_bpe_model_travels_as_roberta_files_and_as_one_tokenizer_json(small_model_config, tmp_path):
  """A Hugging Face directory with RoBERTa's vocab.json + merges.txt (or ALBERT's spiece.model) loads with its
  tokenizer; a bundle keeps it as one tokenizer.json; a Hugging Face export writes the pair for RobertaTokenizer,
  and a SentencePiece model's files for a transformers tokenizer that encodes as bert_jax does."""
  hf_dir = tmp_path / "hf"
  _reference(dataclasses.replace(small_model_config, vocab_size=400)).save_pretrained(hf_dir)
  vocab, merges = train_bpe(tmp_path / "bpe")
  for path in (vocab, merges):
    shutil.copy(path, hf_dir)
  source = formats.read_source(str(hf_dir))
  assert (source.tokenizer_kind, os.path.basename(source.tokenizer_file)) == ("bpe", "vocab.json")
  tokenizer = tokenizer_lib.load_tokenizer("bpe", vocab)
  formats.check_tokenizer(source, tokenizer.identity(), "init_from")  # Its hash: the canonical file's.

  bundle = pathlib.Path(export.export(str(hf_dir), str(tmp_path / "bundle")))
  assert export.verify_bundle(str(bundle))["tokenizer"]["filename"] == "tokenizer.json"
  loaded = pretrained.load(str(bundle))
  assert loaded.tokenizer.kind == "bpe" and loaded.tokenizer.identity()["sha256"] == tokenizer.identity()["sha256"]

  hf_again = pathlib.Path(export.export(str(bundle), str(tmp_path / "hf_again"), "huggingface"))
  assert sorted(os.listdir(hf_again)) == [
    "config.json",
    "merges.txt",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer_config.json",
    "vocab.json",
  ]
  line = "Héllo Wörld! The quick brown fox, 東京 😀, didn't it?"
  for reference in (transformers.AutoTokenizer.from_pretrained(hf_again), transformers.RobertaTokenizer(vocab, merges)):
    assert reference.encode(line, add_special_tokens=False) == tokenizer.encode(line)
  assert formats.read_source(str(hf_again)).tokenizer_kind == "bpe"

  for name in ("vocab.json", "merges.txt"):  # ALBERT's SentencePiece file name.
    (hf_dir / name).unlink()
  shutil.copy(train_mixed_case_sentencepiece(tmp_path / "sentencepiece"), hf_dir / "spiece.model")
  source = formats.read_source(str(hf_dir))
  assert (source.tokenizer_kind, os.path.basename(source.tokenizer_file)) == ("sentencepiece", "spiece.model")
  assert source.albert_preprocessing is None  # In a BERT directory, without a tokenizer_config.json: raw text.
  hf_sentencepiece = pathlib.Path(export.export(str(hf_dir), str(tmp_path / "hf_sentencepiece"), "huggingface"))
  assert sorted(os.listdir(hf_sentencepiece)) == [
    "config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "spm.model",
    "tokenizer_config.json",
  ]
  tokenizer = tokenizer_lib.load_tokenizer("sentencepiece", source.tokenizer_file)
  check_transformers_encodes_as_bert_jax(hf_sentencepiece, tokenizer, mixed_case_lines(300, seed=3))


@pytest.mark.slow
def test_pretraining_starts_from_a_google_checkpoint_with_a_fresh_optimizer_and_refuses_what_does_not_fit(
  wordpiece_run, exports, tmp_path, monkeypatch
):
  _, config, params = wordpiece_run
  config = config.copy_and_resolve_references()
  config.update(init_from=exports["google"], eval_steps=0)
  config.model.update(hidden_size=64)
  with pytest.raises(ValueError, match=r"init_from=.*google \(google at .*\) does not fit .*hidden_size: 32 vs 64"):
    jobs.run(config, str(tmp_path / "run"), "pretrain")
  config.model.update(hidden_size=32)
  config.tokenizer.path = str(tmp_path / "vocab.txt")
  (tmp_path / "vocab.txt").write_text(pathlib.Path(exports["google"], "vocab.txt").read_text().replace("w94", "w95"))
  with pytest.raises(ValueError, match=r"init_from=.*google \(.*\) was trained with tokenizer .*vocab.txt"):
    jobs.run(config, str(tmp_path / "run"), "pretrain")
  config.tokenizer.path = str(pathlib.Path(exports["google"], "vocab.txt"))  # The same bytes as the run's.
  broken = tmp_path / "broken_hf"  # Tensors that do not make the model: found before anything is written.
  shutil.copytree(exports["huggingface"], broken)
  tensors = load_safetensors(str(broken / "model.safetensors"))
  del tensors["bert.pooler.dense.weight"]
  save_safetensors(tensors, broken / "model.safetensors")
  config.init_from = str(broken)
  with pytest.raises(ValueError, match=r"broken_hf: The Hugging Face weights lack 1 tensor.*pooler.dense.weight"):
    jobs.run(config, str(tmp_path / "run"), "pretrain")
  assert not (tmp_path / "run").exists()  # All refused before anything was written.

  # Every source goes through `pretrained.load` (tested above for each); here the loop starts from one, describing
  # init_from once and loading the tokenizer once (it is checked against the source's, then tokenizes the corpus).
  config.init_from = exports["google"]
  config.update(num_train_steps=1)
  calls = {"describe": 0, "load_tokenizer": 0}

  def counted(name, function):
    def wrapper(*args, **kwargs):
      calls[name] += 1
      return function(*args, **kwargs)

    return wrapper

  monkeypatch.setattr(formats, "read_source", counted("describe", formats.read_source))
  load = counted("load_tokenizer", tokenizer_lib.load_tokenizer)
  for module in (init_from, corpus, pretrained, prepare, shards):
    monkeypatch.setattr(module, "load_tokenizer", load)
  state = jobs.run(config, str(tmp_path / "run"), "pretrain")
  assert calls == {"describe": 1, "load_tokenizer": 1}
  assert int(state.step) == 1 and int(state.opt_state[1][0].count) == 1  # A fresh optimizer's first step.
  assert_params_equal(state.params, params)  # Warmup: step 0's learning rate is 0, so the weights are the source's.
