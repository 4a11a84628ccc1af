"""The tf.data pretraining pipeline against BERT's recipe, on a corpus the test generates (>100k tokens)."""

import json
import random
import shutil

import numpy as np
import pytest
import tensorflow as tf

from bert_jax.data import pipeline, prepare, sources
from bert_jax.tokenizer import load_tokenizer

SEQ, PREDICTIONS, BATCH = 128, 20, 128
WORDS_PER_SHARD = 400  # Shard s uses words s*400 .. s*400+399: tokens tell which shard an example came from.
NUM_SHARDS = 4


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, data_config):
  root = tmp_path_factory.mktemp("corpus")
  words = [f"w{i}" for i in range(WORDS_PER_SHARD * NUM_SHARDS)]
  (root / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *words]) + "\n")
  rng = np.random.default_rng(0)
  for shard in range(NUM_SHARDS):
    documents = []
    for _ in range(80):  # Documents of 15-60 sentences, as encyclopedia articles.
      sentences = [
        " ".join(f"w{shard * WORDS_PER_SHARD + w}" for w in rng.integers(0, WORDS_PER_SHARD, rng.integers(4, 16)))
        + " ."
        for _ in range(rng.integers(15, 60))
      ]
      documents.append("\n".join(sentences))
    (root / f"part-{shard}.txt").write_text("\n\n".join(documents) + "\n")
  tokenizer_args = dict(kind="wordpiece", path=str(root / "vocab.txt"))
  inputs = data_config(input_pattern=str(root / "part-*.txt"), input_format="bert")
  manifest = prepare.prepare(inputs, tokenizer_args, str(root / "prepared"), 1)
  assert manifest["tokens"] > 100_000
  return str(root / "prepared"), manifest, load_tokenizer(**tokenizer_args)


def _dataset(corpus, seed=0, **overrides):
  prepared, manifest, tokenizer = corpus
  args = dict(
    seed=seed,
    batch_size=BATCH,
    max_seq_length=SEQ,
    max_predictions_per_seq=PREDICTIONS,
    masked_lm_prob=0.15,
    short_seq_prob=0.1,
    whole_word_masking=False,
    shuffle_buffer=1000,
  )
  return pipeline.pretraining_dataset(prepared, manifest, tokenizer, **(args | overrides))


def _batches(dataset, n):
  iterator = dataset.as_numpy_iterator()
  return [next(iterator) for _ in range(n)]


@pytest.fixture(scope="module")
def many(corpus):
  return _batches(_dataset(corpus), 40)  # 5,120 instances.


def _reference_labels(documents, max_seq_length, short_seq_prob, rng):
  """Label of each instance, by the loop of `create_instances_from_document` in google-research/bert."""
  labels = []
  for document in documents:
    target = max_seq_length - 3
    if rng.random() < short_seq_prob:
      target = rng.randint(2, max_seq_length - 3)
    chunk, length, i = [], 0, 0
    while i < len(document):
      chunk.append(document[i])
      length += document[i]
      if i == len(document) - 1 or length >= target:
        a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
        is_random = len(chunk) == 1 or rng.random() < 0.5
        if is_random:
          i -= len(chunk) - a_end
        labels.append(int(is_random))
        chunk, length = [], 0
      i += 1
  return labels


def test_next_sentence_labels_match_the_original_recipe(corpus, many):
  prepared, manifest, _ = corpus
  documents = [
    [int(n) for n in np.asarray(doc[1])]
    for shard in manifest["shards"]
    for doc in pipeline.tf.data.TFRecordDataset(f"{prepared}/{shard['file']}").map(pipeline._parse)
  ]
  reference = np.mean(_reference_labels(documents * 5, SEQ, 0.1, random.Random(0)))
  ours = np.mean(np.concatenate([b["next_sentence_labels"] for b in many]))
  # The recipe is a coin flip, plus label 1 for every one-sentence chunk (short targets, document ends):
  # above 50% by an amount that depends on the corpus. Ours must match it.
  assert abs(ours - reference) < 0.02, (ours, reference)
  assert 0.5 <= reference < 0.56


def test_next_sentence_coin_flip_is_fair():
  # Long documents, no short targets: one-sentence chunks (always label 1) are negligible, the coin shows.
  lengths = tf.fill([1000], 10)
  tokens = tf.range(6, 10_006, dtype=tf.int32)
  instances = tf.function(
    lambda seed: pipeline.document_instances(
      tokens, lengths, tokens, lengths, seed, max_seq_length=64, short_seq_prob=0.0, special=(2, 3)
    )
  )
  labels = []
  for doc in range(40):
    out = instances(tf.constant([7, doc], tf.int64))
    labels.append(out["next_sentence_labels"].numpy())
    assert (out["input_mask"].numpy().sum(1) <= 64).all()
  labels = np.concatenate(labels)
  assert len(labels) > 5000
  assert abs(labels.mean() - 0.5) < 0.02, labels.mean()


def test_pairs_follow_berts_recipe(many):
  for batch in many:
    ids, mask, segments = batch["input_ids"], batch["input_mask"], batch["segment_ids"]
    lengths = mask.sum(1)
    assert ids.shape[1] == SEQ and (lengths <= SEQ).all()
    assert (ids[:, 0] == 2).all()  # [CLS]
    for row in range(len(ids)):
      n = lengths[row]
      real_ids = batch["masked_lm_ids"][row][batch["masked_lm_weights"][row] > 0]
      original = ids[row, :n].copy()
      original[batch["masked_lm_positions"][row][: len(real_ids)]] = real_ids
      seps = np.flatnonzero(original == 3)
      assert len(seps) == 2 and seps[1] == n - 1  # [CLS] A [SEP] B [SEP]
      assert (segments[row, : seps[0] + 1] == 0).all() and (segments[row, seps[0] + 1 : n] == 1).all()
      assert seps[0] >= 2 and seps[1] - seps[0] >= 2  # Both segments non-empty.
      assert (ids[row, n:] == 0).all() and (segments[row, n:] == 0).all()
  lengths = np.concatenate([b["input_mask"].sum(1) for b in many])
  assert np.mean(lengths >= SEQ - 8) > 0.5  # Most are full; short targets and document ends make the rest.
  assert np.mean(lengths < SEQ // 2) > 0.02


def test_masks_follow_berts_recipe(many):
  selected = sum(b["masked_lm_weights"].sum() for b in many)
  tokens = sum(b["input_mask"].sum() for b in many)
  assert tokens > 100_000
  assert abs(selected / tokens - 0.15) < 0.005
  now = np.concatenate(
    [np.take_along_axis(b["input_ids"], b["masked_lm_positions"], 1)[b["masked_lm_weights"] > 0] for b in many]
  )
  before = np.concatenate([b["masked_lm_ids"][b["masked_lm_weights"] > 0] for b in many])
  assert not np.isin(before, [0, 2, 3, 4]).any()
  assert abs(np.mean(now == 4) - 0.8) < 0.015
  assert abs(np.mean(now == before) - 0.1) < 0.015


def test_same_seed_same_batches_other_seed_others(corpus, many):
  again = _batches(_dataset(corpus), 3)
  for a, b in zip(again, many[:3], strict=True):
    for name in a:
      np.testing.assert_array_equal(a[name], b[name])
  other = _batches(_dataset(corpus, seed=1), 1)[0]
  assert not np.array_equal(other["input_ids"], many[0]["input_ids"])


def test_resuming_by_position_continues_the_same_stream(corpus, many):
  resumed = _batches(_dataset(corpus).skip(7), 2)
  for a, b in zip(resumed, many[7:9], strict=True):
    for name in a:
      np.testing.assert_array_equal(a[name], b[name])


def test_two_hosts_read_disjoint_shards_covering_the_corpus(corpus):
  prepared, manifest, tokenizer = corpus
  hosts = [pipeline.host_files(prepared, manifest, i, 2) for i in range(2)]
  assert {s[1] for s in hosts[0]}.isdisjoint({s[1] for s in hosts[1]})
  assert sorted(s[1] for h in hosts for s in h) == sorted(f"{prepared}/{s['file']}" for s in manifest["shards"])
  for index, files in enumerate(hosts):
    batch = _batches(_dataset(corpus, process_index=index, process_count=2), 1)[0]
    # Segment A always comes from this host's documents (B may come from any shard's, as random next).
    segment_a = batch["input_ids"][(batch["input_ids"] > 5) & (batch["segment_ids"] == 0)]
    shard_of_token = (segment_a - 6) // WORDS_PER_SHARD
    # (A random replacement token may come from anywhere.)
    assert np.mean(np.isin(shard_of_token, [s[0] for s in files])) > 0.98


def test_fewer_files_than_hosts_is_an_error(corpus):
  prepared, manifest, _ = corpus
  with pytest.raises(ValueError, match=r"has 4 shard file\(s\) for 5 hosts"):
    pipeline.host_files(prepared, manifest, 0, 5)


def test_a_truncated_shard_is_named_never_skipped(corpus, tmp_path):
  prepared, manifest, tokenizer = corpus
  broken = tmp_path / "prepared"
  shutil.copytree(prepared, broken)
  victim = broken / manifest["shards"][2]["file"]
  victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
  dataset = _dataset((str(broken), manifest, tokenizer))
  files = [path for _, path, _ in pipeline.host_files(str(broken), manifest, 0, 1)]
  source = sources.PipelineSource(dataset, files, BATCH, 0)
  with pytest.raises(ValueError, match=rf"Corrupt or truncated shard {victim}"):
    for _ in range(100):
      next(source)


def test_without_next_sentence_prediction_sequences_are_full_sentences(corpus):
  batch = _batches(_dataset(corpus, next_sentence_prediction=False), 1)[0]
  assert (batch["next_sentence_labels"] == 0).all() and (batch["segment_ids"] == 0).all()
  lengths = batch["input_mask"].sum(1)
  assert (lengths <= SEQ).all() and np.mean(lengths >= SEQ - 8) > 0.5
  for row in range(BATCH):
    original = batch["input_ids"][row].copy()
    weights = batch["masked_lm_weights"][row] > 0
    original[batch["masked_lm_positions"][row][weights]] = batch["masked_lm_ids"][row][weights]
    assert np.flatnonzero(original == 3).tolist() == [lengths[row] - 1]  # One [SEP], at the end.


def test_a_saved_pipeline_state_resumes_the_stream_exactly(corpus, tmp_path, many):
  prepared, manifest, _ = corpus
  files = [path for _, path, _ in pipeline.host_files(prepared, manifest, 0, 1)]
  first = sources.PipelineSource(_dataset(corpus), files, BATCH, 0)
  for _ in range(5):
    next(first)
  first.save_state(str(tmp_path / "state"))
  assert json.loads((tmp_path / "state" / "COMPLETE").read_text()) == dict(position=5 * BATCH, hosts=1, fingerprint="")
  restored = sources.PipelineSource(_dataset(corpus), files, BATCH, 5 * BATCH, str(tmp_path / "state"))
  replayed = sources.PipelineSource(_dataset(corpus), files, BATCH, 5 * BATCH, str(tmp_path / "missing"))
  for expected in many[5:7]:
    for source in (restored, replayed):
      batch = next(source)
      for name in expected:
        np.testing.assert_array_equal(batch[name], expected[name])
  # A state saved with another host count or other data settings is not used: the stream is replayed.
  for hosts, fingerprint in ((1, "other settings"), (2, "")):
    other = sources.PipelineSource(
      _dataset(corpus), files, BATCH, 5 * BATCH, str(tmp_path / "state"), process_count=hosts, fingerprint=fingerprint
    )
    np.testing.assert_array_equal(next(other)["input_ids"], many[5]["input_ids"])
  # A damaged state (garbage in the iterator's files, or a marker that is not JSON) is reported and replayed.
  for damaged in ("iterator", "COMPLETE"):
    copy = tmp_path / f"damaged_{damaged}"
    shutil.copytree(tmp_path / "state", copy)
    for path in copy.iterdir():
      if path.name.startswith(damaged):
        path.write_bytes(b"garbage")
    other = sources.PipelineSource(_dataset(corpus), files, BATCH, 5 * BATCH, str(copy))
    np.testing.assert_array_equal(next(other)["input_ids"], many[5]["input_ids"])


def test_random_next_sentences_come_from_another_document_even_one_per_shard(tmp_path, corpus, data_config):
  _, _, tokenizer = corpus
  for shard in range(3):  # One document per file, hence per shard: the partner must come from elsewhere.
    words = " ".join(f"w{shard * WORDS_PER_SHARD + i}" for i in range(8))
    (tmp_path / f"doc-{shard}.txt").write_text("\n".join(f"{words} ." for _ in range(60)) + "\n")
  inputs = data_config(input_pattern=str(tmp_path / "doc-*.txt"), input_format="bert")
  manifest = prepare.prepare(inputs, dict(kind="wordpiece", path=tokenizer.path), str(tmp_path / "out"), 1)
  assert [s["documents"] for s in manifest["shards"]] == [1, 1, 1]
  batch = _batches(_dataset((str(tmp_path / "out"), manifest, tokenizer)), 1)[0]
  assert (batch["next_sentence_labels"] == 1).sum() > 20
  for row in np.flatnonzero(batch["next_sentence_labels"] == 1):
    ids, segments = batch["input_ids"][row], batch["segment_ids"][row].copy()
    segments[batch["masked_lm_positions"][row][batch["masked_lm_weights"][row] > 0]] = -1  # Masked: skip.
    shard_a = set(((ids[(segments == 0) & (ids > 5)] - 6) // WORDS_PER_SHARD).tolist())
    shard_b = set(((ids[(segments == 1) & (ids > 5)] - 6) // WORDS_PER_SHARD).tolist())
    assert len(shard_a) == 1 and len(shard_b) == 1 and shard_a != shard_b, (shard_a, shard_b)
