"""Corpus preparation (data/prepare.py, text.py, shards.py, manifest.py): documents, counts, determinism, re-runs,
bad input, a damaged corpus."""

import json
import os
import sys
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from etils import epath

from bert_jax import paths
from bert_jax.data import prepare, shards
from bert_jax.data.manifest import check_shards, count_records, read_manifest
from bert_jax.data.text import split_sentences
from bert_jax.data.tokenizer import load_tokenizer, train_sentencepiece
from tests.test_tokenizer import train_bpe

BERT_FORMAT = (
  "The first document has a sentence.\nIt has a second sentence too.\n\n"
  "\n\n"  # More blank lines: still one boundary.
  "Another document starts here.\nCaf\xe9 in Latin-1 is not UTF-8.\nThe end.\n"
)
ONE_DOCUMENT = "A whole book in one file. It has sentences! Does it?\nYes, lines wrap\nacross paragraphs.\n\nNew one."


@pytest.fixture(scope="module")
def tokenizer_args(tmp_path_factory):
  directory = tmp_path_factory.mktemp("tokenizer")
  corpus = directory / "corpus.txt"
  corpus.write_text((BERT_FORMAT + ONE_DOCUMENT) * 30, encoding="utf-8")
  return dict(kind="sentencepiece", path=train_sentencepiece([str(corpus)], str(directory / "sp"), vocab_size=60))


def _inputs(tmp_path):
  (tmp_path / "in").mkdir()
  (tmp_path / "in" / "a.txt").write_bytes(BERT_FORMAT.encode("utf-8").replace("Caf\xe9".encode(), b"Caf\xe9"))
  (tmp_path / "in" / "b.txt").write_text("Only one document.\nWith two lines.\n", encoding="utf-8")
  return str(tmp_path / "in" / "*.txt")


def _records(path):
  out = []
  for record in tf.data.TFRecordDataset(path):
    features = tf.train.Example.FromString(record.numpy()).features.feature
    out.append((list(features["token_ids"].int64_list.value), list(features["sentence_lengths"].int64_list.value)))
  return out


def test_bert_format_files_become_shards_of_documents_with_counts(tmp_path, tokenizer_args, data_config):
  manifest = prepare.prepare(data_config(input_pattern=_inputs(tmp_path)), tokenizer_args, str(tmp_path / "out"), 1)
  assert [s["file"] for s in manifest["shards"]] == [
    "documents-00000-of-00002.tfrecord",
    "documents-00001-of-00002.tfrecord",
  ]
  assert manifest["documents"] == 3 and manifest["empty_documents"] == 0
  assert manifest["sentences"] == 2 + 3 + 2 and manifest["replaced_bytes"] == 1
  tokenizer = load_tokenizer(**tokenizer_args)
  assert manifest["tokenizer"] == tokenizer.identity()
  documents = _records(str(tmp_path / "out" / "documents-00000-of-00002.tfrecord"))
  ids, lengths = documents[0]
  assert sum(lengths) == len(ids) and len(lengths) == 2
  assert ids[: lengths[0]] == tokenizer.encode("The first document has a sentence.")
  on_disk = json.loads((tmp_path / "out" / "manifest.json").read_text())
  assert on_disk == json.loads(json.dumps(manifest))


def test_a_byte_level_bpe_corpus_holds_each_document_s_running_text(tmp_path, data_config):
  """RoBERTa's BPE encodes a sentence's first word after a space ("Ġ") unless it begins the document."""
  tokenizer_args = dict(kind="bpe", path=train_bpe(tmp_path / "bpe")[0])
  manifest = prepare.prepare(data_config(input_pattern=_inputs(tmp_path)), tokenizer_args, str(tmp_path / "out"), 1)
  tokenizer = load_tokenizer(**tokenizer_args)
  assert manifest["tokenizer"] == tokenizer.identity() and manifest["sentences"] == 7
  records = [record for shard in sorted((tmp_path / "out").glob("*.tfrecord")) for record in _records(str(shard))]
  documents = [
    ["The first document has a sentence.", "It has a second sentence too."],
    ["Another document starts here.", "Caf\ufffd in Latin-1 is not UTF-8.", "The end."],
    ["Only one document.", "With two lines."],
  ]
  expected = {tuple(tokenizer.encode(" ".join(document))): len(document) for document in documents}
  assert {tuple(ids): len(lengths) for ids, lengths in records} == expected
  first = next(lengths for ids, lengths in records if tokenizer.decode(ids).startswith("The first"))
  assert first == [len(tokenizer.encode(documents[0][0])), len(tokenizer.encode(" " + documents[0][1]))]


@pytest.mark.slow
def test_preparation_is_deterministic_and_a_rerun_skips_finished_shards(
  tmp_path, tokenizer_args, data_config, gcs_bucket
):
  config = data_config(input_pattern=_inputs(tmp_path))
  prepare.prepare(config, tokenizer_args, str(tmp_path / "one"), 2)  # Two worker processes.
  # The same from and to gs:// (one worker): the same bytes.
  paths.copy_tree(tmp_path / "in", f"{gcs_bucket}/prepare_in")
  two = epath.Path(f"{gcs_bucket}/prepare_out")
  prepare.prepare(data_config(input_pattern=f"{gcs_bucket}/prepare_in/*.txt"), tokenizer_args, str(two), 1)
  assert read_manifest(str(two))["documents"] == 3
  for name in ("documents-00000-of-00002.tfrecord", "documents-00001-of-00002.tfrecord"):
    assert (tmp_path / "one" / name).read_bytes() == (two / name).read_bytes()
  shard = tmp_path / "one" / "documents-00001-of-00002.tfrecord"
  os.utime(shard, (1, 1))
  (tmp_path / "one" / "documents-00000-of-00002.tfrecord").unlink()  # As if killed while writing shard 0.
  manifest = prepare.prepare(config, tokenizer_args, str(tmp_path / "one"), 1)
  assert shard.stat().st_mtime == 1  # Not rewritten.
  assert manifest["documents"] == 3
  # Another cut, on purpose: a new corpus beside the old one, which is removed once the new manifest commits.
  config.update(max_document_bytes=2048, prepare_overwrite=True)
  manifest = prepare.prepare(config, tokenizer_args, str(tmp_path / "one"), 1)
  assert not shard.exists() and manifest["shards"][1]["file"].startswith("corpus-")
  assert (tmp_path / "one" / manifest["shards"][1]["file"]).read_bytes() == (two / shard.name).read_bytes()


def test_one_document_per_file_is_split_into_sentences(tmp_path, tokenizer_args, data_config):
  (tmp_path / "book.txt").write_text(ONE_DOCUMENT, encoding="utf-8")
  (tmp_path / "empty.txt").write_text("\n  \n", encoding="utf-8")
  (tmp_path / "note.txt").write_text("A note.", encoding="utf-8")
  config = data_config(input_pattern=str(tmp_path / "*.txt"), input_format="document")
  manifest = prepare.prepare(config, tokenizer_args, str(tmp_path / "out"), 1)
  assert manifest["documents"] == 2 and manifest["empty_documents"] == 1
  assert split_sentences("A whole book. It has sentences! Does it?\nYes.") == [
    "A whole book.",
    "It has sentences!",
    "Does it?",
    "Yes.",
  ]
  assert manifest["sentences"] == 5 + 1


def test_tfds_text_dataset_by_name_split_and_feature(tmp_path, tokenizer_args, data_config):
  """A TFDS source is built once, before the workers, which only read (download=False); the manifest records its
  full name, version and split, and the settings that change what is written."""
  config = data_config(tfds_name="imdb_reviews", tfds_split="train", tfds_feature="text", num_shards=3)
  built, loads = [], []
  # Patched inside mock_data and undone before it ends, so that mock_data restores the real methods (the monkeypatch
  # fixture, undone after, would put mock_data's stubs back for every later test in this process).
  with tfds.testing.mock_data(num_examples=9):
    load = tfds.load
    with (
      mock.patch.object(tfds.core.DatasetBuilder, "download_and_prepare", lambda self, **kw: built.append(self.name)),
      mock.patch.object(
        tfds, "load", lambda *args, **kwargs: loads.append(kwargs["download"]) or load(*args, **kwargs)
      ),
    ):
      manifest = prepare.prepare(config, tokenizer_args, str(tmp_path / "out"), 1)
  # Read only: 3 slices by the shard writer, and 3 by the check that the input is large enough (18 distinct training
  # documents, which the mock's 9 texts, the same in every slice, never reach: the check reads to the end).
  assert built == ["imdb_reviews"] and loads == [False] * (3 + 3)
  assert len(manifest["shards"]) == 3
  assert manifest["input"]["tfds"] == dict(name="imdb_reviews/plain_text/1.0.0", version="1.0.0", split="train")
  settings = dict(tfds_feature="text", num_shards=3, eval_fraction=0.01, eval_min_documents=16)
  assert manifest["input"]["settings"] == settings
  # The mock serves num_examples to every load, whatever the slice: 3 slices, 9 documents each.
  assert manifest["documents"] + manifest["eval_documents"] + manifest["empty_documents"] == 3 * 9


def test_bad_inputs_are_named(tmp_path, tokenizer_args, data_config):
  with pytest.raises(ValueError, match=r"data.input_pattern='/nowhere/\*.txt' matches no file"):
    prepare.prepare(data_config(input_pattern="/nowhere/*.txt"), tokenizer_args, str(tmp_path / "out"), 1)
  inputs = _inputs(tmp_path)
  with pytest.raises(ValueError, match=r"data.input_format='csv'"):
    prepare.prepare(data_config(input_pattern=inputs, input_format="csv"), tokenizer_args, str(tmp_path / "out"), 1)
  prepare.prepare(data_config(input_pattern=inputs), tokenizer_args, str(tmp_path / "ok"), 1)
  other = tmp_path / "other.txt"
  other.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nword\n", encoding="utf-8")
  with pytest.raises(ValueError, match=r"was prepared with tokenizer .*sentencepiece.* but the config's tokenizer"):
    read_manifest(str(tmp_path / "ok"), load_tokenizer("wordpiece", str(other)))
  with pytest.raises(FileNotFoundError, match="No manifest.json in"):
    read_manifest(str(tmp_path / "nothing"))
  assert np.isfinite(read_manifest(str(tmp_path / "ok"))["tokens"])


def _files(directory) -> dict:
  return {path.relative_to(directory): path.read_bytes() for path in sorted(directory.rglob("*")) if path.is_file()}


def test_a_rerun_into_a_corpus_prepared_from_something_else_is_refused_naming_each_difference(
  tmp_path, tokenizer_args, data_config, monkeypatch
):
  """The manifest records the input files (name, size, SHA-256), the settings that change the output and the
  tokenizer. The same preparation again keeps the corpus (a run's settings, data.max_seq_length among them, are not
  preparation's: one corpus serves them all); another input, setting or tokenizer is refused before anything is
  written, naming each difference; data.prepare_overwrite replaces the corpus, the old one readable until the new
  manifest commits. A manifest from before inputs were recorded still reads, and a re-run into it is refused."""
  out, inputs = tmp_path / "out", _inputs(tmp_path)
  first = prepare.prepare(data_config(input_pattern=inputs), tokenizer_args, str(out), 1)
  b = first["input"]["files"][1]
  assert b == dict(path=str(tmp_path / "in" / "b.txt"), **paths.fingerprint(tmp_path / "in" / "b.txt"))
  assert first["input"]["settings"]["max_document_bytes"] == 4 << 20
  before = _files(out)
  assert prepare.prepare(data_config(input_pattern=inputs, max_seq_length=512), tokenizer_args, str(out), 1) == first
  assert _files(out) == before
  shard, kept = (out / entry["file"] for entry in first["shards"])
  os.utime(kept, (1, 1))
  for damage in (shard.unlink, lambda: shard.write_bytes(shard.read_bytes()[:-1])):  # The same preparation writes
    damage()  # a lost or cut shard again, and only that one.
    assert prepare.prepare(data_config(input_pattern=inputs), tokenizer_args, str(out), 1) == first
    assert _files(out) == before and kept.stat().st_mtime == 1

  (tmp_path / "in" / "b.txt").write_text("Only one document.\nWith two lines, changed.\n", encoding="utf-8")
  now = paths.fingerprint(tmp_path / "in" / "b.txt")
  changed = (
    rf"{out} holds a corpus prepared from something else: input {tmp_path}/in/b.txt changed: {b['bytes']} bytes "
    rf"sha256 {b['sha256'][:12]}\.\. when prepared, {now['bytes']} bytes sha256 {now['sha256'][:12]}\.\. now"
  )
  with pytest.raises(ValueError, match=changed + r"; data.max_document_bytes 4194304 when prepared, 2048 now\. "):
    prepare.prepare(data_config(input_pattern=inputs, max_document_bytes=2048), tokenizer_args, str(out), 1)
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nword\n", encoding="utf-8")
  with pytest.raises(ValueError, match=r"tokenizer kind sentencepiece, sha256 \w+\.\. when prepared, kind wordpiece"):
    prepare.prepare(data_config(input_pattern=inputs), dict(kind="wordpiece", path=str(vocab)), str(out), 1)
  assert _files(out) == before

  # Replaced on purpose; a crash before the new manifest commits leaves the old corpus whole and readable.
  config = data_config(input_pattern=inputs, prepare_overwrite=True)
  with monkeypatch.context() as patch:
    patch.setattr(prepare, "write_manifest", lambda *args: sys.exit("killed before the commit"))
    with pytest.raises(SystemExit):
      prepare.prepare(config, tokenizer_args, str(out), 1)
  check_shards(str(out), read_manifest(str(out)), verify_hashes=True)
  assert read_manifest(str(out)) == first
  replaced = prepare.prepare(config, tokenizer_args, str(out), 1)
  assert replaced["input"]["files"][1]["sha256"] == now["sha256"] and replaced["sentences"] == first["sentences"]
  assert {path.parts[0] for path in _files(out)} == {"manifest.json", replaced["shards"][0]["file"].split("/")[0]}
  check_shards(str(out), replaced, verify_hashes=True)
  assert prepare.prepare(data_config(input_pattern=inputs), tokenizer_args, str(out), 1) == replaced

  older = {key: value for key, value in replaced.items() if key != "input"}  # As an older bert_jax wrote it.
  (out / "manifest.json").write_text(json.dumps(older))
  assert read_manifest(str(out))["documents"] == 3
  with pytest.raises(ValueError, match="its manifest records no input .* set data.prepare_overwrite=True to replace"):
    prepare.prepare(data_config(input_pattern=inputs), tokenizer_args, str(out), 1)


@pytest.mark.parametrize(
  "text, counts",
  [
    ("", r"0 document\(s\), 0 sentence\(s\), 0 token\(s\)"),
    ("\n  \n\n", r"0 document\(s\), 0 sentence\(s\), 0 token\(s\)"),
    ("Only one sentence.\n", r"1 document\(s\), 1 sentence\(s\), \d+ token\(s\)"),
    ("One document.\nOf two sentences.\n", r"1 document\(s\), 2 sentence\(s\), \d+ token\(s\)"),
  ],
  ids=["0 bytes", "blank lines", "one sentence", "one document"],
)
def test_too_little_text_is_refused_with_its_counts_before_anything_is_written(
  tmp_path, tokenizer_args, data_config, text, counts
):
  (tmp_path / "corpus.txt").write_text(text, encoding="utf-8")
  config = data_config(input_pattern=str(tmp_path / "corpus.txt"))
  expected = rf"corpus.txt' holds too little text to pretrain on: {counts} .* needs at least 2 documents"
  with pytest.raises(ValueError, match=expected):
    prepare.prepare(config, tokenizer_args, str(tmp_path / "out"), 1)
  assert not (tmp_path / "out").exists()


def test_copies_of_one_text_are_refused_before_anything_is_written_and_copies_of_two_lose_only_a_tenth(
  tmp_path, tokenizer_args, data_config
):
  """60 copies of one document were prepared with rc 0 and all 60 held out (copies share a place, and the hold-out
  minimum took every document at the lowest place): refused now, naming the counts, as no random next sentence comes
  from another document. 30 copies each of two: the minimum holds out a tenth (6, the lowest place by position) and
  both texts stay in training."""
  one, two = "The same document.\nWith two lines.\n\n", "Another document here.\nAlso two lines.\n\n"
  (tmp_path / "copies.txt").write_text(one * 60, encoding="utf-8")
  config = data_config(input_pattern=str(tmp_path / "copies.txt"))
  expected = (
    r"copies.txt' holds too little text to pretrain on: 60 document\(s\), 120 sentence\(s\), \d+ token\(s\) .*, "
    r"(6|60) of the documents held out for evaluation .*, (54|0) left for training, (1|0) of them distinct; the "
    r"training split needs at least 2 documents, distinct"
  )
  with pytest.raises(ValueError, match=expected):
    prepare.prepare(config, tokenizer_args, str(tmp_path / "out"), 1)
  assert not (tmp_path / "out").exists()

  (tmp_path / "two.txt").write_text((one + two) * 30, encoding="utf-8")
  config = data_config(input_pattern=str(tmp_path / "two.txt"), prepare_unit_bytes=1024)  # Several shards.
  manifest = prepare.prepare(config, tokenizer_args, str(tmp_path / "two"), 1)
  assert len(manifest["shards"]) > 1
  assert (manifest["documents"], manifest["eval_documents"]) == (54, 6)
  texts = {tuple(ids) for shard in manifest["shards"] for ids, _ in _records(tmp_path / "two" / shard["file"])}
  assert len(texts) == 2


def test_a_corpus_too_small_to_pretrain_on_is_refused_before_the_run_starts(
  tmp_path, tokenizer_args, data_config, monkeypatch
):
  """One prepared by an older bert_jax (which wrote one document): refused when the corpus is opened, which
  pretraining does before it takes the workdir's lease or writes anything."""
  from bert_jax.data.corpus import Corpus
  from bert_jax.model.bert_config import BertConfig
  from configs import tiny

  (tmp_path / "corpus.txt").write_text("One document.\nOf two sentences.\n", encoding="utf-8")
  monkeypatch.setattr(shards, "check_enough_documents", lambda *args: None)
  prepare.prepare(data_config(input_pattern=str(tmp_path / "corpus.txt")), tokenizer_args, str(tmp_path / "out"), 1)
  config = tiny.get_config()
  config.data.update(embedded_corpus="", prepared_dir=str(tmp_path / "out"))
  config.tokenizer.update(kind="sentencepiece", path=tokenizer_args["path"])
  model = BertConfig(vocab_size=64, hidden_size=8, num_layers=1, num_heads=1, intermediate_size=8)
  with pytest.raises(ValueError, match=r"out holds 1 training document\(s\); pretraining needs at least 2"):
    Corpus(config, str(tmp_path / "run"), model)
  assert not (tmp_path / "run").exists()


def test_a_damaged_corpus_is_named_before_training(tmp_path, tokenizer_args, data_config):
  """Each shard's size, records and SHA-256 are in the manifest; opening the corpus checks sizes (and with
  data.verify_shard_hashes, records and hashes): a shard cut at a record boundary, a changed byte, a missing shard
  and a garbage manifest each name their file."""
  import hashlib
  import shutil

  from bert_jax.data.corpus import Corpus
  from bert_jax.model.bert_config import BertConfig
  from configs import tiny

  prepared = tmp_path / "out"
  manifest = prepare.prepare(data_config(input_pattern=_inputs(tmp_path)), tokenizer_args, str(prepared), 1)
  for shard in manifest["shards"]:
    path = prepared / shard["file"]
    assert shard["bytes"] == os.path.getsize(path) and shard["records"] == shard["documents"] == len(_records(path))
    assert shard["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()

  config = tiny.get_config()
  config.data.update(embedded_corpus="", prepared_dir=str(prepared))
  config.tokenizer.update(kind="sentencepiece", path=tokenizer_args["path"])
  model = BertConfig(vocab_size=64, hidden_size=8, num_layers=1, num_heads=1, intermediate_size=8)
  Corpus(config, str(tmp_path / "run"), model)  # Whole: opens.

  def damaged(name, damage, verify=False):
    copy = tmp_path / name
    shutil.copytree(prepared, copy)
    damage(copy)
    config.data.update(prepared_dir=str(copy), verify_shard_hashes=verify)
    return config

  first = manifest["shards"][0]["file"]  # Two documents: cut after the first record.
  one_record = 16 + int.from_bytes((prepared / first).read_bytes()[:8], "little")
  cut = damaged("cut", lambda d: (d / first).write_bytes((prepared / first).read_bytes()[:one_record]))
  with pytest.raises(ValueError, match=rf"cut/{first} has {one_record} bytes; manifest.json recorded"):
    Corpus(cut, str(tmp_path / "run"), model)

  def flip(directory):
    data = bytearray((directory / first).read_bytes())
    data[20] ^= 1
    (directory / first).write_bytes(bytes(data))

  Corpus(damaged("flipped", flip), str(tmp_path / "run"), model)  # Same size: the cheap check cannot see it ...
  with pytest.raises(ValueError, match=rf"flipped_verified/{first}: sha256"):  # ... the hashes can.
    Corpus(damaged("flipped_verified", flip, verify=True), str(tmp_path / "run"), model)
  missing = damaged("missing", lambda d: (d / first).unlink())
  with pytest.raises(FileNotFoundError, match=rf"missing/{first}, a shard listed in"):
    Corpus(missing, str(tmp_path / "run"), model)
  for name, text in (("garbage", "{not json"), ("no_shards", '{"tokenizer": {}}')):
    bad = damaged(name, lambda d, text=text: (d / "manifest.json").write_text(text))
    with pytest.raises(ValueError, match=rf"{name}/manifest.json is not a manifest"):
      Corpus(bad, str(tmp_path / "run"), model)
  with pytest.raises(ValueError, match="ends inside record 1"):
    count_records(_cut_inside(tmp_path, prepared / first))


def _cut_inside(tmp_path, path) -> str:
  inside = tmp_path / "inside.tfrecord"
  data = path.read_bytes()
  inside.write_bytes(data[: len(data) - 3])
  return str(inside)


def _sentences_and_documents(directory) -> tuple[list, list]:
  """All shards in order: (every sentence's ids, every document's (ids, sentence lengths))."""
  documents = [d for path in sorted(directory.glob("*.tfrecord")) for d in _records(str(path))]
  sentences = []
  for ids, lengths in documents:
    sentences += np.split(np.array(ids), np.cumsum(lengths)[:-1])
  return [s.tolist() for s in sentences], documents


@pytest.mark.slow
def test_one_large_file_is_split_by_bytes_into_units_losing_and_repeating_nothing(
  tmp_path, tokenizer_args, data_config, monkeypatch
):
  """A file cut into units of data.prepare_unit_bytes (at blank lines each unit's worker finds itself) gives the
  same documents, in the same order, as the file in one unit; the document format the same sentences. Memory is
  bounded: the tokenizer is called on about a megabyte at a time, and no document outgrows max_document_bytes, even
  in a file with no blank line at all; a line longer than half a unit is refused, naming the file and offset."""
  import random

  rng = random.Random(0)
  words = "the cat sat on a mat and it was warm . Café naïve über".split()
  paragraphs = [
    "\n".join(" ".join(rng.choices(words, k=rng.randint(1, 30))) for _ in range(rng.randint(1, 12))) for _ in range(400)
  ]
  (tmp_path / "big.txt").write_text("\n\n".join(paragraphs) + "\n", encoding="utf-8")
  calls = []
  original = shards.load_tokenizer

  def spying_load(**args):
    tokenizer = original(**args)
    encode_batch = tokenizer.encode_batch
    tokenizer.encode_batch = lambda texts: calls.append(sum(map(len, texts))) or encode_batch(texts)
    return tokenizer

  monkeypatch.setattr(shards, "load_tokenizer", spying_load)
  monkeypatch.setattr(shards, "TOKENIZER_BATCH_BYTES", 4096)
  size = (tmp_path / "big.txt").stat().st_size
  for input_format in ("bert", "document"):
    whole, parts = tmp_path / f"{input_format}_whole", tmp_path / f"{input_format}_parts"
    config = dict(input_pattern=str(tmp_path / "big.txt"), input_format=input_format, max_document_bytes=3000)
    config.update(eval_fraction=0.0, eval_min_documents=0)  # Every document in the training shards.
    one = prepare.prepare(data_config(**config, prepare_unit_bytes=1 << 30), tokenizer_args, str(whole), 1)
    # Two spawned workers for one format (each starts TensorFlow: ~6 CPU-seconds); the other's units in-process.
    workers = 2 if input_format == "bert" else 1
    many = prepare.prepare(data_config(**config, prepare_unit_bytes=7001), tokenizer_args, str(parts), workers)
    assert len(one["shards"]) == 1 and len(many["shards"]) == -(-size // 7001)
    assert many["text_bytes"] == one["text_bytes"] == size
    sentences_one, documents_one = _sentences_and_documents(whole)
    sentences_many, documents_many = _sentences_and_documents(parts)
    assert sentences_many == sentences_one and many["sentences"] == one["sentences"]
    if input_format == "bert":  # Paragraphs are documents, all shorter than max_document_bytes: unchanged.
      assert documents_many == documents_one and one["documents"] == len(paragraphs)
  # In-process calls only (the two-worker run spies nothing): a batch ends after 4096 bytes, with at most one more
  # document, itself ended after max_document_bytes (3000) with at most one more paragraph.
  assert calls and max(calls) < 4096 + 2 * 3000

  # No blank line in 60 kB: documents are cut at max_document_bytes (at a line), units still split the file.
  (tmp_path / "flat.txt").write_text("\n".join(paragraphs).replace("\n\n", "\n") + "\n", encoding="utf-8")
  config = data_config(input_pattern=str(tmp_path / "flat.txt"), prepare_unit_bytes=20_000, max_document_bytes=2000)
  manifest = prepare.prepare(config, tokenizer_args, str(tmp_path / "flat"), 1)
  assert len(manifest["shards"]) > 1 and manifest["documents"] > 20
  tokenizer = original(**tokenizer_args)
  longest = max(len(tokenizer.decode(ids)) for ids, _ in _sentences_and_documents(tmp_path / "flat")[1])
  assert longest < 2000 + 400  # max_document_bytes and one line (of at most 30 words), of a 60 kB file.

  (tmp_path / "long_line.txt").write_text("word " * 3000, encoding="utf-8")
  config = data_config(input_pattern=str(tmp_path / "long_line.txt"), prepare_unit_bytes=8192)
  with pytest.raises(ValueError, match=r"long_line.txt has a line of more than 4096 bytes \(read from byte \d+\)"):
    prepare.prepare(config, tokenizer_args, str(tmp_path / "long"), 1)


def _module_imports(module: str) -> set[str]:
  """The bert_jax modules `module` imports when it is imported (its module-level imports, not those in functions)."""
  import ast

  def source(name):  # The file of a bert_jax module or package, or None (a name imported from a module).
    path = epath.Path(__file__).parent.parent / name.replace(".", "/")
    return next((p for p in (path.with_suffix(".py"), path / "__init__.py") if p.exists()), None)

  found = set()
  for node in ast.parse(source(module).read_text()).body:
    if isinstance(node, ast.Import):
      found |= {alias.name for alias in node.names}
    elif isinstance(node, ast.ImportFrom) and node.level == 0:
      found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
  return {name for name in found if name.startswith("bert_jax") and source(name)}


def test_a_run_reads_its_prepared_corpus_without_importing_preparation():
  """The run-time path reads the manifest through data/manifest.py; preparation (prepare, its text reading and
  shard writing) is imported only where it runs: --mode=prepare, or the embedded corpus on first use."""
  seen, todo = set(), ["bert_jax.data.corpus", "bert_jax.train.loop", "bert_jax.train.pretraining"]
  while todo:
    module = todo.pop()
    if module not in seen:
      seen.add(module)
      todo += _module_imports(module)
  assert "bert_jax.data.manifest" in seen
  assert not seen & {"bert_jax.data.prepare", "bert_jax.data.shards", "bert_jax.data.text"}
