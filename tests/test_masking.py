"""Masked-LM selection against the published recipe, measured on >100k generated tokens."""

import numpy as np
import pytest
import tensorflow as tf

from bert_jax.data.masking import mask_tokens

VOCAB, SEQ, MAX_PREDICTIONS = 1000, 128, 20
PAD, CLS, SEP, MASK = 0, 2, 3, 4
SPECIAL = [0, 1, 2, 3, 4]


def _sequences(n: int, seed: int = 0):
  """[CLS] a [SEP] b [SEP] [PAD]...; words of 1-3 pieces, a piece id >= 500 continuing a word."""
  rng = np.random.default_rng(seed)
  ids = np.zeros((n, SEQ), np.int32)
  mask = np.zeros((n, SEQ), np.int32)
  for row in range(n):
    length = rng.integers(SEQ // 2, SEQ + 1)
    body = []
    while len(body) < length - 3:
      body += [rng.integers(5, 500)] + list(rng.integers(500, VOCAB, rng.integers(0, 3)))
    body = body[: length - 3]
    split = rng.integers(1, len(body))
    ids[row, :length] = [CLS, *body[:split], SEP, *body[split:], SEP]
    mask[row, :length] = 1
  return ids, mask


def _mask_all(ids, mask, whole_word=False, seed=0):
  word_start = np.arange(VOCAB) < 500

  def apply(index, input_ids, input_mask):
    return mask_tokens(
      input_ids,
      input_mask,
      tf.stack([tf.constant(seed, tf.int64), index]),
      special_ids=SPECIAL,
      word_start=word_start,
      vocab_size=VOCAB,
      mask_id=MASK,
      masked_lm_prob=0.15,
      max_predictions_per_seq=MAX_PREDICTIONS,
      whole_word=whole_word,
    )

  dataset = tf.data.Dataset.from_tensor_slices((tf.range(len(ids), dtype=tf.int64), ids, mask))
  dataset = dataset.map(apply, num_parallel_calls=tf.data.AUTOTUNE).batch(len(ids))
  return {k: v.numpy() for k, v in next(iter(dataset)).items()}


@pytest.fixture(scope="module")
def masked():
  ids, mask = _sequences(1100)
  assert mask.sum() > 100_000
  return ids, mask, _mask_all(ids, mask)


def test_fifteen_percent_selected_never_special(masked):
  ids, mask, out = masked
  weights = out["masked_lm_weights"]
  assert abs(weights.sum() / mask.sum() - 0.15) < 0.005
  positions = out["masked_lm_positions"]
  original_at = np.take_along_axis(ids, positions, 1)
  selected = weights > 0
  assert not np.isin(original_at[selected], SPECIAL).any()
  np.testing.assert_array_equal(out["masked_lm_ids"][selected], original_at[selected])
  assert (weights.sum(1) <= MAX_PREDICTIONS).all() and (weights.sum(1) >= 1).all()
  # Positions are distinct, ascending, inside the real tokens.
  for row in range(len(ids)):
    real = positions[row][selected[row]]
    assert (np.diff(real) > 0).all() and (mask[row][real] == 1).all()
  # Nothing outside the selected positions changed.
  changed = out["input_ids"] != ids
  chosen = np.zeros_like(changed)
  np.put_along_axis(chosen, positions, selected, 1)
  assert not (changed & ~chosen).any()


def test_eighty_ten_ten(masked):
  ids, _, out = masked
  selected = out["masked_lm_weights"] > 0
  now = np.take_along_axis(out["input_ids"], out["masked_lm_positions"], 1)[selected]
  before = out["masked_lm_ids"][selected]
  masked_fraction = np.mean(now == MASK)
  kept_fraction = np.mean(now == before)
  random_fraction = 1 - masked_fraction - kept_fraction
  assert abs(masked_fraction - 0.8) < 0.015
  assert abs(kept_fraction - 0.1) < 0.015
  assert abs(random_fraction - 0.1) < 0.015


def test_same_seed_same_masks_other_seed_other_masks(masked):
  ids, mask, out = masked
  again = _mask_all(ids[:50], mask[:50])
  for name in again:
    np.testing.assert_array_equal(again[name], out[name][:50])
  other = _mask_all(ids[:50], mask[:50], seed=1)
  assert not np.array_equal(other["masked_lm_positions"], out["masked_lm_positions"][:50])


def test_whole_word_masking_takes_every_piece_of_a_word():
  ids, mask = _sequences(300, seed=1)
  out = _mask_all(ids, mask, whole_word=True)
  weights = out["masked_lm_weights"]
  assert abs(weights.sum() / mask.sum() - 0.15) < 0.02
  for row in range(len(ids)):
    chosen = set(out["masked_lm_positions"][row][weights[row] > 0].tolist())
    # A continuation piece is chosen only with the piece before it, and vice versa (within a segment).
    for position in chosen:
      if ids[row, position] >= 500 and ids[row, position - 1] not in SPECIAL:
        assert position - 1 in chosen
      if position + 1 < SEQ and ids[row, position + 1] >= 500:
        assert position + 1 in chosen


def test_whole_word_masking_skips_a_word_that_does_not_fit_and_goes_on():
  # 20 tokens -> 3 predictions. Words of 2 pieces and of 1: after a 2-piece word, another 2-piece word does
  # not fit, but a 1-piece word still does (BERT's `continue`), so every sequence gets exactly 3.
  ids = np.array([[CLS] + [10, 600, 11, 12, 601, 13] * 3 + [SEP]], np.int32)
  mask = np.ones_like(ids)
  for seed in range(40):
    out = _mask_all(ids, mask, whole_word=True, seed=seed)
    assert out["masked_lm_weights"].sum() == 3


def test_number_of_predictions_rounds_as_python_does():
  # round(350 * 0.15) = round(52.5) = 52 (half to even); float32 arithmetic would make it 53.
  length = 350
  ids = np.full((1, length), 7, np.int32)
  ids[0, 0], ids[0, -1] = CLS, SEP
  out = mask_tokens(
    tf.constant(ids[0]),
    tf.ones([length], tf.int32),
    tf.constant([0, 0], tf.int64),
    special_ids=SPECIAL,
    word_start=np.ones(VOCAB, bool),
    vocab_size=VOCAB,
    mask_id=MASK,
    masked_lm_prob=0.15,
    max_predictions_per_seq=80,
    whole_word=False,
  )
  assert int(out["masked_lm_weights"].numpy().sum()) == round(length * 0.15) == 52
