"""sentence-transformers directories both ways (handoff/sentence_transformers.py): the export that
`SentenceTransformer(path)` loads and whose embeddings of a padded batch are bert_jax's (BERT and ModernBERT, CLS and
mean pooling, normalised or not), read back as a source with the settings it was written with, in either layout, from
gs://, and as a features source; the modules, poolings and similarities bert_jax does not compute, refused by name
before any parameter is read."""

import dataclasses
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import jobs
from bert_jax.handoff import export, pretrained
from bert_jax.model.encoder import BertModel
from bert_jax.model.sentence_embedding import Settings, sentence_embeddings
from configs import default
from tests.test_modernbert import _hf_config as modernbert_hf_config
from tests.test_modernbert import bpe_files  # noqa: F401 (the fixture)
from tests.test_roberta import write_hf_directory

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
sentence_transformers = pytest.importorskip("sentence_transformers")

BERT_TEXTS = ["w1 w2 w3 w4 w5 w6 w7", "w8", "w9 w10 w11"]  # Three lengths: a padded batch.


def _bert_source(directory):
  """A tiny transformers BertModel (random weights) beside an uncased WordPiece vocabulary of 40 pieces."""
  torch.manual_seed(0)
  config = transformers.BertConfig(
    vocab_size=40,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=32,
    max_position_embeddings=32,
  )
  write_hf_directory(transformers.BertModel(config).eval(), directory, config.vocab_size)
  return BERT_TEXTS


def _modernbert_source(directory, tokenizer_files):
  """A tiny transformers ModernBertModel (random weights, 2 layers) beside a byte-level BPE tokenizer.json."""
  from tests.test_tokenizer import BPE_TEXT

  files, ids = tokenizer_files
  torch.manual_seed(0)
  config = modernbert_hf_config(
    vocab_size=416,
    num_hidden_layers=2,
    pad_token_id=ids["pad_token"],
    cls_token_id=ids["cls_token"],
    bos_token_id=ids["cls_token"],
    sep_token_id=ids["sep_token"],
    eos_token_id=ids["sep_token"],
  )
  write_hf_directory(transformers.ModernBertModel(config).eval(), directory, config.vocab_size, files)
  return [BPE_TEXT[0][:60], BPE_TEXT[1][:12], BPE_TEXT[2][:30]]


def _embedding(**values):
  """`config.embedding` with `values` set."""
  embedding = default.get_config().embedding
  embedding.update(values)
  return embedding


def _ours(loaded, texts, pooling, normalized):
  """bert_jax's embeddings of `texts` ([CLS] ids [SEP], padded to the longest) and the token rows."""
  tokenizer = loaded.tokenizer
  rows = [[tokenizer.cls_id, *tokenizer.encode(text), tokenizer.sep_id] for text in texts]
  length = max(map(len, rows))
  ids = np.array([row + [tokenizer.pad_id] * (length - len(row)) for row in rows], np.int32)
  mask = np.array([[1] * len(row) + [0] * (length - len(row)) for row in rows], np.int32)
  batch = dict(input_ids=jnp.asarray(ids), input_mask=jnp.asarray(mask), segment_ids=jnp.zeros_like(ids))
  encoder = BertModel(loaded.config)
  return np.asarray(sentence_embeddings(encoder, loaded.params["bert"], batch, pooling, normalized)), ids


@pytest.mark.parametrize(
  "family, pooling, normalized",
  [("bert", "cls", True), ("bert", "mean", False), ("modernbert", "cls", False), ("modernbert", "mean", True)],
)
def test_the_export_embeds_in_sentence_transformers_as_in_bert_jax(family, pooling, normalized, bpe_files, tmp_path):  # noqa: F811
  source = tmp_path / "source"
  texts = _bert_source(source) if family == "bert" else _modernbert_source(source, bpe_files)
  embedding = _embedding(pooling=pooling, normalize=normalized, query_prompt="query: ", document_prompt="")
  exported = export.export(str(source), str(tmp_path / "st"), "sentence-transformers", embedding=embedding)

  model = sentence_transformers.SentenceTransformer(exported, device="cpu")  # As a user loads it (SDPA attention).
  theirs = model.encode(texts, batch_size=len(texts), convert_to_numpy=True)
  loaded = pretrained.load(exported)
  ours, ids = _ours(loaded, texts, pooling, normalized)
  np.testing.assert_array_equal(model.tokenize(texts)["input_ids"].numpy(), ids)  # The same padded token rows.
  assert len(set((ids != loaded.tokenizer.pad_id).sum(1))) == len(texts)
  np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)
  if normalized:
    np.testing.assert_allclose(np.linalg.norm(theirs, axis=1), 1.0, rtol=1e-6)

  # Read back: the settings it was written with, the longest input the model's positions.
  assert loaded.source.format == "sentence-transformers"
  assert loaded.embedding == Settings(pooling, normalized, "query: ", "", loaded.config.max_sequence_length)
  assert model.prompts["query"] == "query: " and model.similarity_fn_name == ("cosine" if normalized else "dot")
  assert model.max_seq_length == loaded.config.max_sequence_length
  assert not (tmp_path / "st" / "README.md").exists()


@pytest.fixture(scope="module")
def st_dir(tmp_path_factory):
  """A sentence-transformers export of a tiny BERT (mean pooling, normalised), to copy and break."""
  tmp = tmp_path_factory.mktemp("st")
  _bert_source(tmp / "source")
  return export.export(str(tmp / "source"), str(tmp / "st"), "sentence-transformers", embedding=_embedding())


def _broken(st_dir, tmp_path, edit):
  """A copy of `st_dir` with `edit(directory)` applied."""
  copy = tmp_path / "broken"
  shutil.copytree(st_dir, copy)
  edit(copy)
  return str(copy)


def _edit_json(path, change):
  path.write_text(json.dumps(change(json.loads(path.read_text()))))


def _add_dense(directory):
  dense = {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
  _edit_json(directory / "modules.json", lambda modules: [*modules[:2], dense, *modules[2:]])


@pytest.mark.parametrize(
  "edit, message",
  [
    (_add_dense, r"module 2 \('sentence_transformers.models.Dense'\) is not supported"),
    (
      lambda d: _edit_json(d / "1_Pooling" / "config.json", lambda c: dict(c, pooling_mode="max")),
      r"pools by \['max'\]; bert_jax computes exactly one of \('cls', 'mean'\)",
    ),
    (
      lambda d: _edit_json(
        d / "1_Pooling" / "config.json",
        lambda c: dict(c, pooling_mode_mean_tokens=False, pooling_mode_weightedmean_tokens=True),
      ),
      r"pools by \['weightedmean'\]",
    ),
    (
      lambda d: _edit_json(d / "modules.json", lambda m: [m[0], dict(m[1], path="1_Missing"), *m[2:]]),
      r"module 1 .*Pooling.*: its path '1_Missing' is not a folder",
    ),
    (
      lambda d: _edit_json(d / "modules.json", lambda m: [m[0], {k: v for k, v in m[1].items() if k != "path"}]),
      r"module 1 .* has no 'path'",
    ),
    (
      lambda d: _edit_json(d / "config_sentence_transformers.json", lambda c: dict(c, similarity_fn_name="euclidean")),
      r"similarity_fn_name='euclidean' is not supported",
    ),
    (
      lambda d: _edit_json(d / "modules.json", lambda m: [dict(m[0], type="my_package.CustomEncoder"), *m[1:]]),
      r"module 0 \('my_package.CustomEncoder'\) is not supported",
    ),
  ],
  ids=["dense", "max", "weightedmean", "missing_path", "no_path", "euclidean", "custom"],
)
def test_what_bert_jax_does_not_compute_is_refused_by_name(st_dir, tmp_path, edit, message, monkeypatch):
  broken = _broken(st_dir, tmp_path, edit)
  read = []
  monkeypatch.setattr(pretrained, "_read_params", lambda *args: read.append(args))
  with pytest.raises((ValueError, FileNotFoundError), match=message):
    pretrained.load(broken)
  assert not read  # Refused from the metadata, before any parameter is read.


def test_a_sentence_transformers_source_takes_its_settings_and_what_the_config_sets(st_dir, tmp_path):
  # Prompts under sentence-transformers' other names, a default prompt, the older max_seq_length.
  def edit(directory):
    _edit_json(
      directory / "config_sentence_transformers.json",
      lambda c: dict(c, prompts={"query": "q: ", "passage": "p: ", "classification": "c: "}),
    )
    _edit_json(directory / "sentence_bert_config.json", lambda c: dict(c, max_seq_length=12))

  loaded = pretrained.load(_broken(st_dir, tmp_path, edit))
  assert loaded.embedding == Settings("mean", True, "q: ", "p: ", 12)
  # Re-exported with config.embedding's cls pooling: the rest as the source recorded it.
  again = export.export(
    loaded.source.info["directory"],
    str(tmp_path / "again"),
    "sentence-transformers",
    embedding=_embedding(pooling="cls"),
  )
  assert pretrained.load(again).embedding == Settings("cls", True, "q: ", "p: ", 12)
  # A Hugging Face export records nothing: None, and config.embedding's keys or the defaults apply.
  plain = export.export(loaded.source.info["directory"], str(tmp_path / "hf"), "huggingface")
  assert pretrained.load(plain).embedding is None


def test_a_bad_pooling_is_refused_when_the_export_is_checked(tmp_path):
  config = default.get_config()
  config.export.update(dir=str(tmp_path / "st"), format="sentence-transformers")
  config.embedding.pooling = "max"
  with pytest.raises(ValueError, match=r"embedding.pooling='max'; expected one of \('cls', 'mean'\)"):
    jobs.run(config, str(tmp_path / "workdir"), "export")
  assert not (tmp_path / "st").exists()


def test_a_transformer_module_in_its_own_folder_loads_as_in_the_directory_itself(st_dir, tmp_path):
  """The older layout: the Hugging Face model in `0_Transformer/`, which modules.json names."""

  def move(directory):
    (directory / "0_Transformer").mkdir()
    for path in list(directory.iterdir()):
      if path.is_file() and path.name not in ("modules.json", "config_sentence_transformers.json"):
        path.rename(directory / "0_Transformer" / path.name)
    _edit_json(directory / "modules.json", lambda m: [dict(m[0], path="0_Transformer"), *m[1:]])

  moved = pretrained.load(_broken(st_dir, tmp_path, move))
  root = pretrained.load(st_dir)
  assert moved.source.path == str(tmp_path / "broken" / "0_Transformer") and moved.embedding == root.embedding
  assert moved.config == root.config
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(moved.params), jax.device_get(root.params))
  model = sentence_transformers.SentenceTransformer(str(tmp_path / "broken"), device="cpu")
  np.testing.assert_allclose(model.encode(BERT_TEXTS), _ours(moved, BERT_TEXTS, "mean", True)[0], atol=1e-5, rtol=0)


def test_a_sentence_transformers_directory_is_a_features_source(st_dir, small_config, tmp_path):
  (tmp_path / "lines.txt").write_text("w1 w2 w3\nw4\n")
  small_config.features.update(
    source=st_dir,
    input_pattern=str(tmp_path / "lines.txt"),
    output_dir=str(tmp_path / "features"),
    layers=(-1,),
    max_seq_length=16,
    doc_stride=8,
    batch_size=8,
  )
  manifest = jobs.run(small_config, str(tmp_path / "unused"), "features")
  shard = np.load(tmp_path / "features" / manifest["shards"][0])
  loaded = pretrained.load(st_dir)
  ids = [*loaded.tokenizer.encode("w1 w2 w3"), *loaded.tokenizer.encode("w4")]
  np.testing.assert_array_equal(shard["token_ids"], ids)
  assert shard["token_vectors"].shape == (4, 1, loaded.config.hidden_size)


def test_an_export_to_gcs_loads_back_with_its_settings(st_dir, gcs_bucket):
  on_gcs = export.export(st_dir, f"{gcs_bucket}/st", "sentence-transformers", embedding=_embedding(pooling="cls"))
  loaded, local = pretrained.load(on_gcs), pretrained.load(st_dir)
  assert loaded.source.format == "sentence-transformers"
  assert loaded.embedding == dataclasses.replace(local.embedding, pooling="cls")
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(loaded.params), jax.device_get(local.params))
