"""The hand-off: `pretrained.load` from every source, the export bundle, and the two outside formats both ways."""

import dataclasses
import errno
import gc
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time
import types

import helpers
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import torch
import transformers
from etils import epath

from bert_jax import jobs, sharding
from bert_jax.data import corpus, prepare, shards
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.handoff import export, formats, hf_names, pretrained
from bert_jax.handoff.hf_configs import hf_config
from bert_jax.handoff.hf_format import load_safetensors, params_from_hf, save_safetensors
from bert_jax.model import param_layout
from bert_jax.model.bert_config import to_bert_json
from bert_jax.model.encoder import BertForPretraining, encoder_intermediates
from bert_jax.train import init_from, pretraining
from bert_jax.workdir import checkpoints, reading
from tests.test_albert import check_transformers_encodes_as_bert_jax, mixed_case_lines, train_mixed_case_sentencepiece
from tests.test_encoder import _inputs, _reference, _reference_outputs
from tests.test_tokenizer import train_bpe

_equal = jax.tree.map


def _assert_params_equal(actual, expected):
  assert jax.tree.structure(actual) == jax.tree.structure(expected)
  _equal(np.testing.assert_array_equal, jax.device_get(actual), expected)


@pytest.fixture
def workdir_copy(wordpiece_run, tmp_path):
  workdir, _, _ = wordpiece_run
  shutil.copytree(workdir, tmp_path / "run")
  return tmp_path / "run"


def test_load_reads_only_the_params_onto_any_mesh_in_either_layout(wordpiece_run, workdir_copy):
  _, config, params = wordpiece_run
  step_dir = workdir_copy / "checkpoints" / "2"
  # The optimizer moments are never read: gone, or garbage, the load does not notice.
  shutil.rmtree(step_dir / "optimizer")
  (step_dir / "optimizer").mkdir()
  (step_dir / "optimizer" / "_METADATA").write_bytes(b"\0garbage")

  loaded = pretrained.load(str(workdir_copy))  # One device, unrolled.
  assert loaded.source.format == "workdir" and loaded.source.step == 2
  assert loaded.config.hidden_size == 32 and not loaded.config.scan_layers
  assert set(loaded.params) == {"bert", "mlm_transform", "mlm_layer_norm", "mlm_output_bias", "nsp"}
  _assert_params_equal(loaded.params, params)
  assert (
    loaded.tokenizer.vocab_size == 101
    and loaded.config.vocab_size == 104
    and loaded.tokenizer.encode("w3 w7 .") == [9, 13, 5]
  )
  # The tokenizer file travels inside the checkpoint step.
  assert loaded.tokenizer.path == str(step_dir / "tokenizer" / "vocab.txt")

  # Saved under FSDP 8; loaded on DP 4 x TP 2 of the 8 devices, from the step directory, bitwise.
  mesh = sharding.make_mesh(dict(data=4, fsdp=1, tensor=2))
  on_mesh = pretrained.load(str(step_dir), mesh=mesh, rules=config.logical_axis_rules)
  query = on_mesh.params["bert"]["layer_0"]["attention"]["query"]["kernel"]
  assert query.sharding.mesh.shape == mesh.shape and query.sharding.spec == jax.sharding.PartitionSpec(
    "fsdp", "tensor", None
  )
  _assert_params_equal(on_mesh.params, params)

  scanned = pretrained.load(str(workdir_copy), scan_layers=True, mesh=mesh, rules=config.logical_axis_rules)
  assert scanned.config.scan_layers and helpers.is_scanned(scanned.params)
  _assert_params_equal(param_layout.convert(jax.device_get(scanned.params), scanned=False), params)


def test_a_source_that_does_not_fit_is_refused_with_its_path(wordpiece_run, workdir_copy, small_model_config, tmp_path):
  with pytest.raises(FileNotFoundError, match=r"/nowhere does not exist"):
    pretrained.load(str(tmp_path / "nowhere"))
  # A step Orbax has not committed (a save killed half-way) is never read.
  partial = workdir_copy / "checkpoints" / "4.orbax-checkpoint-tmp-1234"
  shutil.copytree(workdir_copy / "checkpoints" / "2", partial)
  with pytest.raises(ValueError, match=r"4.orbax-checkpoint-tmp-1234 is an uncommitted checkpoint"):
    pretrained.load(str(partial))
  assert pretrained.load(str(workdir_copy)).source.step == 2  # Nor chosen as the newest.
  (tmp_path / "other").mkdir()
  (tmp_path / "other" / "notes.txt").write_text("hi")
  with pytest.raises(ValueError, match=r"other is not a bert_jax workdir.*notes.txt"):
    pretrained.load(str(tmp_path / "other"))
  # Metadata that cannot be what it claims: named with its file.
  (tmp_path / "bad_bundle").mkdir()
  (tmp_path / "bad_bundle" / "manifest.json").write_text(json.dumps({"format": formats.BUNDLE_FORMAT}))
  (tmp_path / "bad_bundle" / "bert_config.json").write_text(json.dumps(to_bert_json(wordpiece_run[1].model)))
  with pytest.raises(ValueError, match=r"bad_bundle/manifest.json records no file hashes"):
    pretrained.load(str(tmp_path / "bad_bundle"))
  (tmp_path / "bad_hf").mkdir()
  (tmp_path / "bad_hf" / "model.safetensors").write_bytes(b"")
  (tmp_path / "bad_hf" / "config.json").write_text(
    json.dumps(dict(to_bert_json(small_model_config), num_attention_heads=5))
  )
  with pytest.raises(
    ValueError, match=r"bad_hf/config.json: model.hidden_size=32 is not divisible by model.num_heads=5"
  ):
    pretrained.load(str(tmp_path / "bad_hf"))
  # A tokenizer file that is not the one the checkpoint recorded.
  vocab = workdir_copy / "checkpoints" / "2" / "tokenizer" / "vocab.txt"
  vocab.write_text(vocab.read_text().replace("w94", "w95"))
  with pytest.raises(ValueError, match=r"/checkpoints/2/tokenizer does not match its checksum"):
    pretrained.load(str(workdir_copy))


def test_the_bundle_is_complete_on_its_own_verified_and_never_overwritten_unasked(
  wordpiece_run, workdir_copy, tmp_path, monkeypatch
):
  _, _, params = wordpiece_run
  bundle = tmp_path / "bundle"
  export.export(str(workdir_copy), str(bundle))
  assert sorted(os.listdir(bundle)) == ["bert_config.json", "manifest.json", "params", "vocab.txt"]
  assert not [name for name in os.listdir(tmp_path) if name.startswith(".bundle")]  # No staging left behind.
  manifest = export.verify_bundle(str(bundle))
  assert manifest["source"] == {"path": str(workdir_copy / "checkpoints" / "2"), "format": "workdir", "step": 2}
  assert manifest["history"]["examples_seen"] == 16 and manifest["history"]["token_positions_seen"] == 16 * 32
  assert manifest["history"]["eval"]["step"] == 2 and manifest["history"]["train"]["step"] == 2
  assert manifest["parameters"] == sum(x.size for x in jax.tree.leaves(params))
  assert manifest["tokenizer"]["kind"] == "wordpiece" and manifest["tokenizer"]["lower_case"] is True
  assert {"bert_jax", "jax", "flax", "orbax-checkpoint"} <= set(manifest["versions"])
  assert "vocab.txt" in manifest["files"] and any(name.startswith("params/") for name in manifest["files"])
  assert json.loads((bundle / "bert_config.json").read_text())["num_hidden_layers"] == 2

  shutil.rmtree(workdir_copy)  # The bundle needs nothing else.
  loaded = pretrained.load(str(bundle))
  assert loaded.source.format == "bundle" and loaded.tokenizer.encode("w3 w7 .") == [9, 13, 5]
  _assert_params_equal(loaded.params, params)

  export.export(str(bundle), str(tmp_path / "again"))
  with pytest.raises(FileExistsError, match=r"again exists and is not empty; set export.overwrite=True"):
    export.export(str(bundle), str(tmp_path / "again"))
  for target in (bundle, tmp_path):  # The source itself, or a directory holding it, is never replaced.
    with pytest.raises(ValueError, match=rf"export.dir={target} overlaps the source"):
      export.export(str(bundle), str(target), overwrite=True)
  (tmp_path / "notes").mkdir()
  (tmp_path / "notes" / "mine.txt").write_text("mine")
  with pytest.raises(ValueError, match=r"notes is not an export .*refusing to replace it"):
    export.export(str(bundle), str(tmp_path / "notes"), overwrite=True)
  assert (tmp_path / "notes" / "mine.txt").read_text() == "mine"
  monkeypatch.chdir(tmp_path)  # Relative paths, as people type them.
  export.export("again", "bundle", overwrite=True)
  assert json.loads((bundle / "manifest.json").read_text())["source"]["path"] == str(tmp_path / "again")  # Replaced.
  _assert_params_equal(pretrained.load("bundle").params, params)

  data_file = next(p for p in sorted((bundle / "params").rglob("*")) if p.is_file() and p.stat().st_size > 1000)
  content = bytearray(data_file.read_bytes())
  content[len(content) // 2] ^= 1
  data_file.write_bytes(bytes(content))
  with pytest.raises(ValueError, match=rf"does not match its manifest.*{data_file.name}: changed"):
    export.verify_bundle(str(bundle))
  (bundle / "manifest.json").unlink()  # What a reader sees of a bundle still being written on GCS.
  with pytest.raises(ValueError, match=r"bundle is an incomplete export bundle: it has no manifest.json"):
    pretrained.load(str(bundle))


@pytest.mark.slow
def test_checkpoints_written_with_one_state_item_still_resume_and_load(wordpiece_run, tmp_path):
  workdir, config, params = wordpiece_run
  legacy = tmp_path / "legacy"
  with checkpoints.read_only_manager(workdir) as manager:
    position = reading.read_data_position(manager, 2)
    saved_config = reading.read_config(manager, 2)
  run = pretraining.make_run(config)
  abstract, shardings = run.abstract, run.shardings
  with checkpoints.read_only_manager(workdir) as manager:
    state, _ = reading.restore(manager, 2, abstract, shardings)
  with ocp.CheckpointManager(legacy / "checkpoints") as manager:  # The layout before params had an item.
    manager.save(
      2,
      args=ocp.args.Composite(
        state=ocp.args.StandardSave(state.replace(guard=None)),  # Nor had the state a step guard then.
        data=ocp.args.JsonSave(position),
        config=ocp.args.JsonSave(saved_config),
      ),
    )
  loaded = pretrained.load(str(legacy))  # Its tokenizer from the recorded path, checked by hash.
  _assert_params_equal(loaded.params, params)
  resumed = jobs.run(config, str(legacy), "pretrain")  # Step 2 of 2: restores, trains nothing.
  assert int(resumed.step) == 2
  _assert_params_equal(resumed.opt_state, jax.device_get(state.opt_state))


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
  _assert_params_equal(pretrained.load(str(hf_dir)).params, params)


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
  _assert_params_equal(loaded.params, params_from_hf(tensors, small_model_config))

  # Google TF1 -> bert_jax -> Hugging Face: bitwise the original tensors.
  export.export(str(google), str(tmp_path / "hf"), "huggingface")
  exported = load_safetensors(str(tmp_path / "hf" / "model.safetensors"))
  assert sorted(exported) == sorted(tensors)
  _equal(np.testing.assert_array_equal, exported, tensors)

  # transformers' other two layouts: a PyTorch pytorch_model.bin, and safetensors in shards with an index.
  for name, options in (("torch_bin", dict(safe_serialization=False)), ("sharded", dict(max_shard_size="40KB"))):
    reference.save_pretrained(tmp_path / name, **options)
    shutil.copy(google / "vocab.txt", tmp_path / name)
    _assert_params_equal(pretrained.load(str(tmp_path / name)).params, loaded.params)
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
  _assert_params_equal(headless.params["bert"], loaded.params["bert"])

  # bert_jax -> Google TF1: what transformers' loader reads is the original model, and bert_jax reads it back.
  export.export(str(google), str(tmp_path / "google_again"), "google")
  assert {"bert_config.json", "vocab.txt", "bert_model.ckpt.index"} <= set(os.listdir(tmp_path / "google_again"))
  _equal(np.testing.assert_array_equal, _from_google(tmp_path / "google_again", seed=2), everything)
  _assert_params_equal(pretrained.load(str(tmp_path / "google_again")).params, loaded.params)


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
  calls = {"read_source": 0, "load_tokenizer": 0}

  def counted(name, function):
    def wrapper(*args, **kwargs):
      calls[name] += 1
      return function(*args, **kwargs)

    return wrapper

  monkeypatch.setattr(formats, "read_source", counted("read_source", formats.read_source))
  load = counted("load_tokenizer", tokenizer_lib.load_tokenizer)
  for module in (init_from, corpus, pretrained, prepare, shards):
    monkeypatch.setattr(module, "load_tokenizer", load)
  state = jobs.run(config, str(tmp_path / "run"), "pretrain")
  assert calls == {"read_source": 1, "load_tokenizer": 1}
  assert int(state.step) == 1 and int(state.opt_state[1][0].count) == 1  # A fresh optimizer's first step.
  _assert_params_equal(state.params, params)  # Warmup: step 0's learning rate is 0, so the weights are the source's.


def test_a_vocabulary_larger_than_the_embedding_table_is_refused(exports, tmp_path):
  hf_dir = tmp_path / "hf"
  shutil.copytree(exports["huggingface"], hf_dir)
  with open(hf_dir / "vocab.txt", "a") as f:
    f.write("".join(f"extra{i}\n" for i in range(10)))
  with pytest.raises(ValueError, match=r"vocab.txt has 111 ids but the model in .*/hf has vocab_size=104"):
    pretrained.load(str(hf_dir))


def _flip_a_byte(path: pathlib.Path) -> None:
  content = bytearray(path.read_bytes())
  content[len(content) // 2] ^= 1
  path.write_bytes(bytes(content))


def _rehash(bundle: pathlib.Path, name: str) -> None:
  """Records the present SHA-256 of `name` in the bundle's manifest: damage that the hashes do not catch."""
  manifest = json.loads((bundle / "manifest.json").read_text())
  manifest["files"][name] = tokenizer_lib.file_sha256(bundle / name)
  (bundle / "manifest.json").write_text(json.dumps(manifest))


def test_a_flipped_bit_in_a_bundle_is_refused_by_every_read_naming_the_file(exports, tmp_path, monkeypatch):
  bundle = tmp_path / "bundle"
  shutil.copytree(exports["bundle"], bundle)
  hashed = []
  monkeypatch.setattr(formats, "file_sha256", lambda path: hashed.append(str(path)) or tokenizer_lib.file_sha256(path))
  pretrained.load(str(bundle))
  manifest = json.loads((bundle / "manifest.json").read_text())
  assert sorted(hashed) == sorted(str(bundle / name) for name in manifest["files"] if name != "vocab.txt")  # Once.
  data_file = next(p for p in sorted((bundle / "params").rglob("*")) if p.is_file() and p.stat().st_size > 1000)
  _flip_a_byte(data_file)
  name = str(data_file.relative_to(bundle))
  with pytest.raises(ValueError, match=rf"Bundle {bundle} does not match its manifest: \['{name}: changed'\]"):
    pretrained.load(str(bundle))
  with pytest.raises(ValueError, match=rf"{name}: changed"):  # --mode=export's path: nothing is written.
    export.export(str(bundle), str(tmp_path / "hf"), "huggingface")
  assert not (tmp_path / "hf").exists() and os.listdir(tmp_path) == ["bundle"]


def test_a_loaded_config_out_of_range_or_a_non_finite_weight_is_refused_naming_the_file(exports, tmp_path):
  hf_dir, bundle = tmp_path / "hf", tmp_path / "bundle"
  shutil.copytree(exports["huggingface"], hf_dir)
  shutil.copytree(exports["bundle"], bundle)
  for config_file in (hf_dir / "config.json", bundle / "bert_config.json"):
    fields = json.loads(config_file.read_text())
    config_file.write_text(json.dumps(dict(fields, layer_norm_eps=-1.0)))
    _rehash(bundle, "bert_config.json")
    with pytest.raises(ValueError, match=rf"{config_file}: model.layer_norm_eps=-1.0 must be positive"):
      pretrained.load(str(config_file.parent))
    config_file.write_text(json.dumps(dict(fields, initializer_range=0)))
    _rehash(bundle, "bert_config.json")
    with pytest.raises(ValueError, match=rf"{config_file}: model.initializer_range=0 must be positive"):
      pretrained.load(str(config_file.parent))
    config_file.write_text(json.dumps(dict(fields, vocab_size=10**12)))  # JAX's OverflowError, naming nothing.
    _rehash(bundle, "bert_config.json")
    with pytest.raises(ValueError, match=rf"{config_file}: model.vocab_size=1000000000000 must be in \[1, 16777216\]"):
      pretrained.load(str(config_file.parent))
    config_file.write_text(json.dumps(fields))
  tensors = load_safetensors(hf_dir / "model.safetensors")
  tensors["bert.encoder.layer.1.output.dense.weight"][3, 5] = np.nan
  save_safetensors(tensors, hf_dir / "model.safetensors")
  with pytest.raises(
    ValueError, match=r"hf/model.safetensors: tensors \['bert.encoder.layer.1.output.dense.weight'\] hold NaN or inf"
  ):
    pretrained.load(str(hf_dir))


def test_a_damaged_file_is_refused_naming_its_path_not_with_a_bare_library_error(exports, tmp_path, monkeypatch):
  # A damaged OCDBT index met by Orbax's reads of every array at once left dozens of "Event loop is closed" from their
  # callbacks after the error (pytest's unraisable-exception warning at the end of the session).
  unraisable = []
  monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
  hf_dir, bundle = tmp_path / "hf", tmp_path / "bundle"
  shutil.copytree(exports["huggingface"], hf_dir)
  weights = hf_dir / "model.safetensors"
  weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
  with pytest.raises(ValueError, match=rf"{weights} is not a readable safetensors file \(truncated or damaged\?\)"):
    pretrained.load(str(hf_dir))
  for name in ("params/_METADATA", "params/manifest.ocdbt"):  # Damage that the manifest's hashes do not catch.
    shutil.rmtree(bundle, ignore_errors=True)
    shutil.copytree(exports["bundle"], bundle)
    (bundle / name).write_bytes((bundle / name).read_bytes()[:40])
    _rehash(bundle, name)
    with pytest.raises(ValueError, match=rf"{bundle}/params cannot be restored as this bundle's parameters"):
      pretrained.load(str(bundle))
  gc.collect()  # What is left of the failed reads goes now, while the hook listens.
  assert not unraisable, [str(u.exc_value) for u in unraisable]


def test_an_overwrite_replaces_only_what_an_export_wrote_and_follows_symlinks(exports, tmp_path):
  for fmt in export.FORMATS:  # Each format's own files are replaced; a file of the user's is refused, and kept.
    target = tmp_path / fmt
    shutil.copytree(exports[fmt], target)
    (target / "README.md").write_text("mine")
    with pytest.raises(ValueError, match=rf"{target} holds \['README.md'\], which no {fmt} export writes"):
      export.export(exports["bundle"], str(target), fmt, overwrite=True)
    assert (target / "README.md").read_text() == "mine"
    (target / "README.md").unlink()
    export.export(exports["bundle"], str(target), fmt, overwrite=True)
  real = tmp_path / "huggingface"
  (tmp_path / "link").symlink_to(real)
  export.export(exports["bundle"], str(tmp_path / "link"), "huggingface", overwrite=True)
  assert (tmp_path / "link").is_symlink() and sorted(os.listdir(tmp_path)) == [
    "bundle",
    "google",
    "huggingface",
    "link",
  ]
  assert pretrained.load(str(tmp_path / "link")).source.format == "huggingface"
  source = tmp_path / "bundle"
  (tmp_path / "inside").symlink_to(source / "export")  # A target that lands inside the source through a symlink.
  with pytest.raises(ValueError, match=rf"export.dir={source / 'export'} overlaps the source {source}"):
    export.export(str(source), str(tmp_path / "inside"), "huggingface")
  assert not (source / "export").exists()


def _partials(target: pathlib.Path) -> list[pathlib.Path]:
  return sorted(target.parent.glob(f".{target.name}.partial-*"))


def _fill_the_disk_at(monkeypatch, name: str) -> None:
  """Writing a file `name` (local or gs://) writes half of it, then fails as a full disk fails a write to an open
  file: ENOSPC, no file named."""
  real_write = epath.Path.write_bytes

  def full_disk(path, data):
    if path.name != name:
      return real_write(path, data)
    with path.open("wb") as f:
      f.write(data[: len(data) // 2])
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  monkeypatch.setattr(epath.Path, "write_bytes", full_disk)


def test_a_full_disk_during_a_hugging_face_export_is_one_line_naming_the_file_and_leaves_nothing(
  exports, tmp_path, monkeypatch
):
  _fill_the_disk_at(monkeypatch, "model.safetensors")
  partial = rf"{tmp_path}/\.hf\.partial-[0-9a-f]{{8}}"
  target = tmp_path / "hf"
  with pytest.raises(export.ExportError) as raised:
    export.export(exports["bundle"], str(target), "huggingface")
  assert re.fullmatch(
    rf"Export to {target} failed writing {partial}/export/model\.safetensors: No space left on device \(ENOSPC\); "
    rf"nothing was written there; the partial files in {partial} are removed\.",
    str(raised.value),
  ), str(raised.value)
  assert raised.value.exit_code == 1 and os.listdir(tmp_path) == []
  # Replacing an export: the one in place stays whole.
  shutil.copytree(exports["huggingface"], target)
  before = {name: (target / name).read_bytes() for name in os.listdir(target)}
  with pytest.raises(
    export.ExportError, match=r"No space left on device \(ENOSPC\); it still holds the export it held"
  ):
    export.export(exports["bundle"], str(target), "huggingface", overwrite=True)
  assert {name: (target / name).read_bytes() for name in os.listdir(target)} == before
  assert os.listdir(tmp_path) == ["hf"]


_PAUSED_EXPORT = """
import os, pathlib, sys, time
from absl import app
from bert_jax import main
from bert_jax.handoff import hf_format

def paused(tensors, path):  # Half the file written, then a pause for the test to signal this process.
  pathlib.Path(path).write_bytes(b"half")
  pathlib.Path(os.environ["READY"]).touch()
  time.sleep(300)

hf_format.save_safetensors = paused
sys.argv = ["bert_jax.main", *sys.argv[1:]]
app.run(main.main)
"""


@pytest.mark.slow
def test_an_export_killed_stopped_or_refused_a_write_says_so_in_one_line_and_leaves_no_partial_files(
  exports, tmp_path, gcs_bucket, monkeypatch
):
  """SIGKILL leaves a partial directory, which the next export to the target removes (its process is gone); SIGTERM
  and a refused write end `--mode=export` with one line (exit 143, 1) and remove their own. An old partial directory
  nobody has touched for an hour goes; a live export's (its lease's heartbeat is fresh) stays. On gs://, written in
  place, a failed write removes what it wrote."""
  target = tmp_path / "hf"
  flags = ["--config=configs/tiny.py", f"--workdir={tmp_path / 'unused'}", "--mode=export"]
  flags += [f"--config.export.source={exports['bundle']}", f"--config.export.dir={target}"]
  flags += ["--config.export.format=huggingface"]
  environment = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
  environment.pop("XLA_FLAGS", None)
  root = pathlib.Path(__file__).resolve().parents[1]

  def paused(ready: pathlib.Path) -> subprocess.Popen:
    process = subprocess.Popen(
      [sys.executable, "-c", _PAUSED_EXPORT, *flags],
      cwd=root,
      env=dict(environment, READY=str(ready)),
      stderr=subprocess.PIPE,
      stdout=subprocess.DEVNULL,
      text=True,
    )
    deadline = time.monotonic() + 120
    while not ready.exists():
      assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()[-3000:]
      time.sleep(0.2)
    return process

  killed = paused(tmp_path / "ready_killed")
  killed.kill()
  killed.communicate(timeout=60)
  (dead,) = _partials(target)
  assert (dead / "export" / "model.safetensors").read_bytes() == b"half" and (dead / "LEASE").exists()
  # A live export's, on another machine sharing the storage; and one from before partial directories had a LEASE.
  live, old = tmp_path / ".hf.partial-0000aaaa", tmp_path / ".hf.partial-0000bbbb"
  live.mkdir()
  now = time.time()
  holder = dict(host="another-host", pid=1, run_id="x", start_time=now, heartbeat_time=now, process="b/n/1/7")
  (live / "LEASE").write_text(json.dumps(holder))
  (old / "export").mkdir(parents=True)
  for path in (old / "export", old):
    os.utime(path, (now - 3600, now - 3600))

  stopped = paused(tmp_path / "ready_stopped")
  stopped.send_signal(signal.SIGTERM)
  log = stopped.communicate(timeout=60)[1]
  assert stopped.returncode == 143, log[-3000:]
  assert re.fullmatch(
    rf"Export to {target} stopped by SIGTERM; nothing was written there; the partial files in "
    rf"{tmp_path}/\.hf\.partial-[0-9a-f]{{8}} are removed\.",
    log.strip().splitlines()[-1],
  ), log[-3000:]
  assert "Traceback" not in log and f"Removed {dead}" in log and f"Removed {old}" in log, log[-3000:]
  assert _partials(target) == [live] and not target.exists()

  # The weights' file is 90 kB; the disk refuses files over 40 kB (EFBIG, as a full disk refuses with ENOSPC).
  small_files = "import os, resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (40_000, 40_000)); "
  small_files += "os.execv(sys.executable, [sys.executable, '-m', 'bert_jax.main', *sys.argv[1:]])"
  command = [sys.executable, "-c", small_files, *flags]
  refused = subprocess.run(command, cwd=root, env=environment, capture_output=True, text=True)
  assert refused.returncode == 1, refused.stderr[-3000:]
  assert re.fullmatch(
    rf"Export to {target} failed writing {tmp_path}/\.hf\.partial-[0-9a-f]{{8}}/export/model\.safetensors: File too "
    rf"large \(EFBIG\); nothing was written there; the partial files in {tmp_path}/\.hf\.partial-[0-9a-f]{{8}} are "
    r"removed\.",
    refused.stderr.strip().splitlines()[-1],
  ), refused.stderr[-3000:]
  assert "Traceback" not in refused.stderr and _partials(target) == [live] and not target.exists()

  export.export(exports["bundle"], str(target), "huggingface")
  assert _partials(target) == [live] and pretrained.load(str(target)).source.format == "huggingface"

  on_gcs = f"{gcs_bucket}/hf"
  _fill_the_disk_at(monkeypatch, "model.safetensors")
  with pytest.raises(export.ExportError) as raised:
    export.export(exports["bundle"], on_gcs, "huggingface")
  assert str(raised.value) == (
    f"Export to {on_gcs} failed writing {on_gcs}/model.safetensors: No space left on device (ENOSPC); it holds no "
    f"export (the partial files in {on_gcs} are removed)."
  )
  assert not epath.Path(on_gcs).exists()
