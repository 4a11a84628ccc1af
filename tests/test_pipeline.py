"""The tf.data pretraining pipeline's rows against BERT's recipe, on a generated corpus of over 100k tokens
(conftest.py's `pipeline_corpus`): sentence pairs and their labels, masks, document sentences, sentence order, full
sentences, packed rows, and evaluation's held-out documents. The stream, its readers and its saved states:
tests/test_pipeline_state.py."""

import functools
import random

import numpy as np
import pytest
import tensorflow as tf

from bert_jax.data import full_sentences, packing, pipeline, prepare, readers
from tests.helpers import PIPELINE_BATCH as BATCH
from tests.helpers import PIPELINE_PREDICTIONS as PREDICTIONS
from tests.helpers import PIPELINE_SEQ as SEQ
from tests.helpers import PIPELINE_WORDS_PER_SHARD as WORDS_PER_SHARD
from tests.helpers import assert_same_batches, concat_batches, corpus_source, next_batches, unmasked_ids


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


@pytest.mark.slow
def test_next_sentence_labels_match_the_original_recipe(pipeline_corpus, pipeline_batches):
  prepared, manifest, _ = pipeline_corpus
  documents = [
    [int(n) for n in np.asarray(doc[1])]
    for shard in manifest["shards"]
    for doc in pipeline.tf.data.TFRecordDataset(f"{prepared}/{shard['file']}").map(pipeline._parse)
  ]
  reference = np.mean(_reference_labels(documents * 5, SEQ, 0.1, random.Random(0)))
  ours = np.mean(np.concatenate([b["next_sentence_labels"] for b in pipeline_batches]))
  # The recipe is a coin flip, plus label 1 for every one-sentence chunk (short targets, document ends):
  # above 50% by an amount that depends on the corpus. Ours must match it.
  assert abs(ours - reference) < 0.02, (ours, reference)
  assert 0.5 <= reference < 0.56


@pytest.mark.slow
def test_next_sentence_coin_flip_is_fair():
  # Long documents, no short targets: one-sentence chunks (always label 1) are negligible, the coin shows.
  lengths = tf.fill([1000], 10)
  tokens = tf.range(6, 10_006, dtype=tf.int32)
  instances = tf.function(
    lambda seed: pipeline.document_instances(
      tokens, lengths, tokens, lengths, seed, max_seq_length=64, short_seq_prob=0.0, special=(2, 3, 0)
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


def test_rows_are_padded_with_the_tokenizers_pad_id():
  """RoBERTa's <pad> is 1 and its <s> 0: every kind of row, packed or not, pads input_ids with the pad id (BERT's
  [PAD] is 0, so BERT's rows are what they were)."""
  tokens, lengths, special = tf.range(10, 110), tf.fill([20], 5), (0, 2, 1)  # [CLS]-like 0, [SEP]-like 2, pad 1.
  seed = tf.constant([1, 2], tf.int64)
  rows = [
    pipeline.document_instances(
      tokens, lengths, tokens, lengths, seed, max_seq_length=64, short_seq_prob=1.0, special=special, instances=kind
    )
    for kind in ("nsp", "sop", "doc_sentences")
  ]
  rows.append(
    full_sentences.document_rows(tf.zeros([62], tf.int32), 0, tokens, lengths, max_seq_length=64, special=special)[1]
  )
  no_predictions = tf.zeros([len(rows[0]["input_ids"]), 4], tf.int32)
  instances = dict(rows[0], masked_lm_positions=no_predictions, masked_lm_ids=no_predictions)
  instances["masked_lm_weights"] = tf.cast(no_predictions, tf.float32)
  rows.append(packing.pack_group(instances, max_seq_length=64, max_predictions=4, max_instances=4, pad_id=1))
  for row in rows:
    ids, mask = row["input_ids"].numpy(), row["input_mask"].numpy()
    assert (mask == 0).any() and (ids[mask == 0] == 1).all() and (ids[mask > 0] != 1).all()


def test_pairs_follow_berts_recipe(pipeline_batches):
  for batch in pipeline_batches:
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
  lengths = np.concatenate([b["input_mask"].sum(1) for b in pipeline_batches])
  assert np.mean(lengths >= SEQ - 8) > 0.5  # Most are full; short targets and document ends make the rest.
  assert np.mean(lengths < SEQ // 2) > 0.02


def test_masks_follow_berts_recipe(pipeline_batches):
  selected = sum(b["masked_lm_weights"].sum() for b in pipeline_batches)
  tokens = sum(b["input_mask"].sum() for b in pipeline_batches)
  assert tokens > 100_000
  assert abs(selected / tokens - 0.15) < 0.005
  now = np.concatenate(
    [
      np.take_along_axis(b["input_ids"], b["masked_lm_positions"], 1)[b["masked_lm_weights"] > 0]
      for b in pipeline_batches
    ]
  )
  before = np.concatenate([b["masked_lm_ids"][b["masked_lm_weights"] > 0] for b in pipeline_batches])
  assert not np.isin(before, [0, 2, 3, 4]).any()
  assert abs(np.mean(now == 4) - 0.8) < 0.015
  assert abs(np.mean(now == before) - 0.1) < 0.015


def test_doc_sentences_are_sentences_of_one_document_and_the_older_key_gives_them_too(pipeline_corpus, data_config):
  batch = next_batches(corpus_source(pipeline_corpus, data_config, instances="doc_sentences"), 1)[0]
  assert_same_batches(
    [batch], next_batches(corpus_source(pipeline_corpus, data_config, next_sentence_prediction=False), 1)
  )
  assert (batch["next_sentence_labels"] == 0).all() and (batch["segment_ids"] == 0).all()
  lengths = batch["input_mask"].sum(1)
  assert (lengths <= SEQ).all() and np.mean(lengths >= SEQ - 8) > 0.5
  for row in range(BATCH):
    original = batch["input_ids"][row].copy()
    weights = batch["masked_lm_weights"][row] > 0
    original[batch["masked_lm_positions"][row][weights]] = batch["masked_lm_ids"][row][weights]
    assert np.flatnonzero(original == 3).tolist() == [lengths[row] - 1]  # One [SEP], at the end.


def _sentences(tokens, lengths) -> list[tuple]:
  """A document's sentences (its token ids and sentence lengths as tensors), each a tuple of token ids."""
  ends = np.cumsum(lengths.numpy())
  return [tuple(sentence) for sentence in np.split(tokens.numpy(), ends[:-1])]


def _documents(corpus) -> list[list[tuple]]:
  """Every training document of the corpus, shard by shard, as its sentences."""
  prepared, manifest, _ = corpus
  return [
    _sentences(*document)
    for shard in manifest["shards"]
    for document in tf.data.TFRecordDataset(f"{prepared}/{shard['file']}").map(pipeline._parse)
  ]


def test_a_row_that_comes_back_in_a_later_epoch_is_masked_anew(pipeline_corpus, data_config):
  """Dynamic masking (RoBERTa's; every recipe here): the masks are drawn per epoch, never fixed at preparation."""
  rows_that_repeat_exactly = dict(instances="doc_sentences", short_seq_prob=0.0)
  source = corpus_source(pipeline_corpus, data_config, **rows_that_repeat_exactly)
  seen, repeats, changed = {}, 0, 0
  for batch in next_batches(source, 20):  # About 2.5 epochs.
    for row, ids in enumerate(unmasked_ids(batch)):
      if batch["input_mask"][row].sum() < 32:  # A document's last few tokens: too few to mask otherwise, surely.
        continue
      positions = frozenset(batch["masked_lm_positions"][row][batch["masked_lm_weights"][row] > 0].tolist())
      if ids.tobytes() in seen:
        repeats += 1
        changed += seen[ids.tobytes()] != positions
      seen[ids.tobytes()] = positions
  assert repeats > 500 and changed == repeats


def test_the_stream_is_the_same_in_a_process_that_set_tensorflows_global_seed(
  pipeline_corpus, data_config, pipeline_batches
):
  """A notebook's or a library's `tf.random.set_seed` (Keras, transformers and mteb call it) leaves the stream as it
  is, and the caller's global seed as it was: a step's rows depend on the run's seed alone. (CI's golden runs once
  differed in a test worker where mteb had seeded TensorFlow: the shuffle buffer's order had changed.)"""
  from tensorflow.python.eager import context

  tf.random.set_seed(1234)
  try:
    batches = next_batches(corpus_source(pipeline_corpus, data_config), 3)
    assert context.global_seed() == 1234
  finally:
    tf.random.set_seed(None)
  assert_same_batches(batches, pipeline_batches[:3])


@pytest.mark.slow
def test_sentence_order_pairs_are_consecutive_segments_of_one_document_swapped_half_the_time(
  pipeline_corpus, data_config
):
  """SOP: [CLS] A [SEP] B [SEP] with B the text that follows A in its document (label 0), or the two swapped (1)."""
  batches = next_batches(corpus_source(pipeline_corpus, data_config, instances="sop"), 40)
  labels = np.concatenate([b["next_sentence_labels"] for b in batches])
  assert len(labels) == 40 * BATCH and abs(labels.mean() - 0.5) < 0.02, labels.mean()
  # Where each token 3-gram occurs: (document, offset) in the documents' running text.
  texts = [sum(document, ()) for document in _documents(pipeline_corpus)]
  at = {}
  for d, text in enumerate(texts):
    for offset in range(len(text) - 2):
      at.setdefault(text[offset : offset + 3], []).append((d, offset))

  def in_one_document(tokens: tuple) -> bool:
    return any(texts[d][offset : offset + len(tokens)] == tokens for d, offset in at.get(tokens[:3], []))

  for batch in batches:
    ids, lengths = unmasked_ids(batch), batch["input_mask"].sum(1)
    for row, label in enumerate(batch["next_sentence_labels"]):
      n = lengths[row]
      seps = np.flatnonzero(ids[row, :n] == 3)
      assert ids[row, 0] == 2 and len(seps) == 2 and seps[1] == n - 1
      np.testing.assert_array_equal(batch["segment_ids"][row, :n], np.arange(n) > seps[0])
      first, second = tuple(ids[row, 1 : seps[0]]), tuple(ids[row, seps[0] + 1 : n - 1])
      assert first and second  # The corpus has no one-token sentence: every pair has two parts.
      assert in_one_document(second + first if label else first + second), (row, label)


@pytest.mark.slow
def test_full_sentences_rows_are_full_cross_documents_and_keep_every_sentence(pipeline_corpus, data_config):
  """One epoch of one reader, in stream order: every row is [CLS] whole sentences [SEP], a [SEP] between two
  documents; together the rows hold the epoch's sentences exactly once, in order (but the last partly filled row,
  which the next epoch fills)."""
  prepared, manifest, tokenizer = pipeline_corpus
  documents = pipeline._epoch_documents(
    tf.constant(0, tf.int64),
    units=tf.constant(readers.reader_units(manifest, 0, 1), tf.int64),
    paths=tf.constant([f"{prepared}/{s['file']}" for s in manifest["shards"]]),
    counts=tf.constant([s["documents"] for s in manifest["shards"]], tf.int64),
    seed=0,
  )
  sentences = []  # (document number in the stream, whether it is the document's first, its tokens)
  for d, (*_, document, _) in enumerate(documents):
    sentences += [(d, i == 0, tokens) for i, tokens in enumerate(_sentences(*document))]
  special = (tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id)
  stream = full_sentences.full_sentence_rows(documents, max_seq_length=SEQ, special=special)
  rows = {name: np.concatenate([out[3][name] for out in stream]) for name in ("input_ids", "input_mask")}
  lengths = rows["input_mask"].sum(1)
  assert (rows["input_ids"][:, 0] == 2).all() and (rows["input_ids"][np.arange(len(lengths)), lengths - 1] == 3).all()
  assert (rows["input_ids"] * (1 - rows["input_mask"]) == 0).all()  # [PAD] is 0 here.
  assert np.mean(lengths >= SEQ - 16) > 0.95, np.mean(lengths >= SEQ - 16)
  crossing, next_sentence = 0, 0
  for ids, n in zip(rows["input_ids"], lengths, strict=True):
    body = ids[1 : n - 1]
    pieces = np.split(body, np.flatnonzero(body == 3))
    crossing += len(pieces) > 1
    for p, piece in enumerate(pieces):
      piece = tuple(piece[1:] if p else piece)  # After the first, a piece starts at its [SEP].
      document, first, taken = sentences[next_sentence][0], sentences[next_sentence][1], ()
      assert first or not p, "an interior [SEP] is followed by a document's first sentence"
      while len(taken) < len(piece):
        assert sentences[next_sentence][0] == document, "a piece holds sentences of one document"
        taken += sentences[next_sentence][2]
        next_sentence += 1
      assert taken == piece, "a piece is whole consecutive sentences"
      if p < len(pieces) - 1:  # Before an interior [SEP]: the document's last sentence.
        assert next_sentence == len(sentences) or sentences[next_sentence][1]
  assert crossing > len(lengths) // 10  # Documents of 15-60 sentences: about one row in four crosses.
  left = sum(len(tokens) for _, _, tokens in sentences[next_sentence:])  # Carried into the next epoch's first row.
  assert 0 < left <= SEQ - 2


def test_full_sentences_cut_a_sentence_longer_than_a_row_and_drop_nothing():
  """Rows of 8 (room for 6): a 14-token sentence goes on from the 3 tokens before it, fills two rows and carries 5
  tokens; the next sentence does not fit after them and starts a row."""
  rows_of = tf.function(functools.partial(full_sentences.document_rows, max_seq_length=8, special=(2, 3, 0)))
  documents = [[[10] * 3, list(range(20, 34)), [40, 41]], [[50] * 4], [[60]]]
  state, ids = (tf.zeros([6], tf.int32), tf.constant(0)), []
  for sentences in documents:
    lengths = tf.constant([len(s) for s in sentences], tf.int32)
    state, rows = rows_of(*state, tf.constant(sum(sentences, []), tf.int32), lengths)
    lengths = rows["input_mask"].numpy().sum(1)
    ids += [row[:n].tolist() for row, n in zip(rows["input_ids"].numpy(), lengths, strict=True)]
  assert ids == [
    [2, 10, 10, 10, 20, 21, 22, 3],
    [2, *range(23, 29), 3],
    [2, *range(29, 34), 3],
    [2, 40, 41, 3],  # Document 2's 4 tokens do not fit after a [SEP]: they start the next row.
  ]
  assert state[0].numpy()[: int(state[1])].tolist() == [50, 50, 50, 50, 3, 60]  # A [SEP] between documents.


def test_random_next_sentences_come_from_another_document_even_one_per_shard(tmp_path, pipeline_corpus, data_config):
  _, _, tokenizer = pipeline_corpus
  for shard in range(3):  # One document per file, hence per shard: the partner must come from elsewhere.
    words = " ".join(f"w{shard * WORDS_PER_SHARD + i}" for i in range(8))
    (tmp_path / f"doc-{shard}.txt").write_text("\n".join(f"{words} ." for _ in range(60)) + "\n")
  inputs = data_config(input_pattern=str(tmp_path / "doc-*.txt"), input_format="bert")
  manifest = prepare.prepare(inputs, dict(kind="wordpiece", path=tokenizer.path), str(tmp_path / "out"), 1)
  assert [s["documents"] for s in manifest["shards"]] == [1, 1, 1]
  batch = next_batches(corpus_source((str(tmp_path / "out"), manifest, tokenizer), data_config, num_readers=1), 1)[0]
  assert (batch["next_sentence_labels"] == 1).sum() > 20
  for row in np.flatnonzero(batch["next_sentence_labels"] == 1):
    ids, segments = batch["input_ids"][row], batch["segment_ids"][row].copy()
    segments[batch["masked_lm_positions"][row][batch["masked_lm_weights"][row] > 0]] = -1  # Masked: skip.
    shard_a = set(((ids[(segments == 0) & (ids > 5)] - 6) // WORDS_PER_SHARD).tolist())
    shard_b = set(((ids[(segments == 1) & (ids > 5)] - 6) // WORDS_PER_SHARD).tolist())
    assert len(shard_a) == 1 and len(shard_b) == 1 and shard_a != shard_b, (shard_a, shard_b)


def _unpack(rows: dict) -> list[tuple]:
  """Every instance of packed rows as (tokens, segments, prediction positions, prediction ids, label)."""
  instances = []
  for r in range(len(rows["input_ids"])):
    for slot in np.flatnonzero(rows["next_sentence_weights"][r]):
      start = rows["cls_positions"][r, slot]
      mine = rows["input_mask"][r] == slot + 1
      length = int(mine.sum())
      assert mine[start : start + length].all() and rows["input_ids"][r, start] == 2  # Contiguous, [CLS] first.
      np.testing.assert_array_equal(rows["position_ids"][r, mine], np.arange(length))
      real = rows["masked_lm_weights"][r] > 0
      positions = rows["masked_lm_positions"][r, real]
      ours = (positions >= start) & (positions < start + length)
      instances.append(
        (
          tuple(rows["input_ids"][r, mine]),
          tuple(rows["segment_ids"][r, mine]),
          tuple(positions[ours] - start),
          tuple(rows["masked_lm_ids"][r, real][ours]),
          int(rows["next_sentence_labels"][r, slot]),
        )
      )
  return instances


def _instances(batch: dict) -> list[tuple]:
  """The instances of unpacked rows, as `_unpack` gives them."""
  instances = []
  for r in range(len(batch["input_ids"])):
    length = int(batch["input_mask"][r].sum())
    real = batch["masked_lm_weights"][r] > 0
    instances.append(
      (
        tuple(batch["input_ids"][r, :length]),
        tuple(batch["segment_ids"][r, :length]),
        tuple(batch["masked_lm_positions"][r, real]),
        tuple(batch["masked_lm_ids"][r, real]),
        int(batch["next_sentence_labels"][r]),
      )
    )
  return instances


@pytest.mark.slow
def test_packed_rows_hold_the_same_instances_within_limits_and_resume_exactly(
  pipeline_corpus, data_config, pipeline_batches, tmp_path
):
  """The packed stream is the unpacked stream's instances, group by group, each intact (own [CLS], positions from 0,
  its predictions and label), in rows within the token, prediction and instance limits; fuller rows; the same
  stream after a saved state is restored."""
  packing = dict(pack_instances=True, packing_group=64, max_instances_per_row=4, num_readers=1)
  source = corpus_source(pipeline_corpus, data_config, batch_size=8, **packing)
  rows = concat_batches([next(source) for _ in range(12)])
  assert rows["next_sentence_labels"].shape == (96, 4) and rows["cls_positions"].shape == (96, 4)
  assert (rows["input_mask"].max(1) <= 4).all() and (rows["masked_lm_weights"].sum(1) <= PREDICTIONS).all()
  instances = np.cumsum(rows["next_sentence_weights"].sum(1))
  first_group = int(np.searchsorted(instances, 64)) + 1  # The rows of the first 64 instances.
  assert instances[first_group - 1] == 64
  unpacked = _instances({name: value[:64] for name, value in pipeline_batches[0].items()})
  assert sorted(_unpack({name: value[:first_group] for name, value in rows.items()})) == sorted(unpacked)
  fill = (rows["input_mask"] > 0).mean()
  assert fill > (pipeline_batches[0]["input_mask"] > 0).mean() and fill > 0.95, fill

  # A restart restores the packer's place in the stream (or replays it): the same rows follow.
  saved = corpus_source(pipeline_corpus, data_config, batch_size=8, **packing)
  for _ in range(5):
    next(saved)
  saved.save_state(str(tmp_path / "state"))
  restored = corpus_source(
    pipeline_corpus, data_config, batch_size=8, start_example=40, state_dir=str(tmp_path / "state"), **packing
  )
  replayed = corpus_source(pipeline_corpus, data_config, batch_size=8, start_example=40, **packing)
  expected = {name: value[40:56] for name, value in rows.items()}
  for resumed in (restored, replayed):
    assert_same_batches([concat_batches([next(resumed), next(resumed)])], [expected])


def test_evaluation_reads_only_the_held_out_documents_and_training_never_sees_them(tmp_path, data_config):
  """Preparation sets documents aside by a hash of their tokens (data.eval_fraction, at least
  data.eval_min_documents); the training stream, partners for random next sentences included, never holds one, and
  evaluation reads only those."""
  from bert_jax.data.corpus import Corpus
  from bert_jax.model.bert_config import BertConfig
  from configs import tiny

  marks = [f"d{i}" for i in range(60)]
  words = [f"w{i}" for i in range(40)]
  (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *marks, *words]) + "\n")
  rng = np.random.default_rng(0)
  documents = [  # Every sentence of document i carries its mark d<i>.
    "\n".join(f"{mark} " + " ".join(rng.choice(words, rng.integers(3, 8))) for _ in range(rng.integers(4, 10)))
    for mark in marks
  ]
  (tmp_path / "corpus.txt").write_text("\n\n".join(documents) + "\n")
  inputs = data_config(input_pattern=str(tmp_path / "corpus.txt"), eval_fraction=0.05, eval_min_documents=8)
  manifest = prepare.prepare(inputs, dict(kind="wordpiece", path=str(tmp_path / "vocab.txt")), str(tmp_path / "p"))
  assert manifest["documents"] + manifest["eval_documents"] == 60 and manifest["eval_documents"] >= 6  # 60 // 10.
  # The unigram baseline: the training shards' token frequencies (add-one) scored on the evaluation shards' tokens.
  counts = {}
  for split in ("shards", "eval_shards"):
    ids = [
      token
      for shard in manifest[split]
      for record in tf.data.TFRecordDataset(str(tmp_path / "p" / shard["file"])).as_numpy_iterator()
      for token in tf.train.Example.FromString(record).features.feature["token_ids"].int64_list.value
    ]
    counts[split] = np.bincount(ids, minlength=105)
  probabilities = (counts["shards"] + 1) / (counts["shards"].sum() + 105)
  expected_loss = -np.sum(counts["eval_shards"] * np.log(probabilities)) / counts["eval_shards"].sum()
  assert manifest["unigram"]["mlm_loss"] == pytest.approx(expected_loss, rel=1e-9)
  expected_accuracy = counts["eval_shards"][counts["shards"].argmax()] / counts["eval_shards"].sum()
  assert manifest["unigram"]["mlm_accuracy"] == pytest.approx(expected_accuracy, rel=1e-9)

  config = tiny.get_config()
  config.tokenizer.update(kind="wordpiece", path=str(tmp_path / "vocab.txt"))
  config.data.update(embedded_corpus="", prepared_dir=str(tmp_path / "p"), max_seq_length=32)
  config.data.update(max_predictions_per_seq=5, shuffle_buffer=50, num_readers=1)
  config.update(batch_size=8)
  data = Corpus(config, str(tmp_path / "run"), BertConfig(vocab_size=105, max_position_embeddings=32))

  def marks_seen(source, batches):
    seen = set()
    for _ in range(batches):
      batch = next(source)
      tokens = batch["input_ids"].copy()
      rows = np.arange(len(tokens))[:, None].repeat(batch["masked_lm_positions"].shape[1], 1)
      weighted = batch["masked_lm_weights"] > 0
      tokens[rows[weighted], batch["masked_lm_positions"][weighted]] = batch["masked_lm_ids"][weighted]
      seen |= {int(t) - 5 for t in tokens.ravel() if 5 <= t < 65}  # Mark d<i> has id 5 + i.
    return seen

  evaluation = marks_seen(data.source(0, evaluation=True), 20)
  training = marks_seen(data.source(0), 80)  # About 3 epochs of the training documents.
  assert len(evaluation) == manifest["eval_documents"]
  assert len(training) == manifest["documents"] and not training & evaluation
