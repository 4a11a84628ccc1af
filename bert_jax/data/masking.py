"""Masked-LM selection on the fly, in TensorFlow ops (inside the tf.data graph, no Python per example).

BERT's recipe: `masked_lm_prob` (15%) of the tokens of a sequence are selected (counting [CLS] and [SEP] in
the length as the original does, at least one, at most `max_predictions_per_seq`), never [CLS], [SEP] or
[PAD]; of those, 80% become [MASK], 10% a random token, 10% stay. With whole-word masking, a word's pieces
are selected together. Every random choice comes from a stateless seed, so the same example gets the same
masks on any host and after any restart.
"""

import tensorflow as tf


def mask_tokens(
  input_ids: tf.Tensor,
  input_mask: tf.Tensor,
  seed: tf.Tensor,
  *,
  special_ids,
  word_start,
  vocab_size: int,
  mask_id: int,
  masked_lm_prob: float,
  max_predictions_per_seq: int,
  whole_word: bool,
) -> dict:
  """input_ids, input_mask: [seq] int32; seed: [2] int32 or int64.

  Returns `input_ids` with the replacements, `masked_lm_positions`, `masked_lm_ids` (the original tokens)
  and `masked_lm_weights` ([max_predictions_per_seq], padded with 0).
  """
  seq_len = tf.shape(input_ids)[0]
  seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), num=3)
  is_real = input_mask > 0
  candidate = is_real & ~tf.reduce_any(input_ids[:, None] == tf.constant(special_ids, tf.int32)[None, :], axis=1)
  # float64, so that round-half-to-even sees the same products as Python's `round(len(tokens) * prob)`.
  num_tokens = tf.reduce_sum(tf.cast(is_real, tf.float64))
  num_to_predict = tf.minimum(
    max_predictions_per_seq, tf.maximum(1, tf.cast(tf.round(num_tokens * masked_lm_prob), tf.int32))
  )

  # Group candidates into units (a word for whole-word masking, else a token) and order units randomly.
  if whole_word:
    starts = candidate & (tf.gather(tf.constant(word_start, tf.bool), input_ids) | ~_shifted(candidate))
  else:
    starts = candidate
  unit = tf.cumsum(tf.cast(starts, tf.int32)) - 1  # Unit index of each position; only candidates count.
  num_units = tf.reduce_sum(tf.cast(starts, tf.int32))
  unit_scores = tf.random.stateless_uniform([seq_len], seeds[0])
  unit_rank = tf.argsort(tf.argsort(unit_scores[:num_units]))  # A random permutation of the units.
  unit_sizes = tf.math.unsorted_segment_sum(
    tf.cast(candidate, tf.int32), tf.where(candidate, unit, num_units), num_units + 1
  )[:num_units]
  # Take units in random order; a unit that does not fit in what is left is skipped, later ones may fit.
  size_by_rank = tf.scatter_nd(unit_rank[:, None], unit_sizes, [num_units])
  if whole_word:
    totals = tf.scan(
      lambda total, size: tf.where(total + size <= num_to_predict, total + size, total), size_by_rank, initializer=0
    )
    taken_rank = totals > tf.concat([[0], totals[:-1]], 0)
  else:  # Units of one token: the first num_to_predict of them.
    taken_rank = tf.cumsum(size_by_rank) <= num_to_predict
  unit_taken = tf.gather(taken_rank, unit_rank)
  selected = candidate & tf.gather(tf.concat([unit_taken, [False]], 0), tf.where(candidate, unit, num_units))

  # 80% [MASK], 10% random token, 10% unchanged; decided per selected token.
  draw = tf.random.stateless_uniform([seq_len], seeds[1])
  random_ids = tf.random.stateless_uniform([seq_len], seeds[2], minval=0, maxval=vocab_size, dtype=tf.int32)
  replacement = tf.where(draw < 0.8, mask_id, tf.where(draw < 0.9, input_ids, random_ids))
  masked_input_ids = tf.where(selected, replacement, input_ids)

  positions = tf.cast(tf.where(selected)[:, 0], tf.int32)[:max_predictions_per_seq]
  num_predictions = tf.shape(positions)[0]
  padding = [[0, max_predictions_per_seq - num_predictions]]
  return {
    "input_ids": masked_input_ids,
    "masked_lm_positions": tf.pad(positions, padding),
    "masked_lm_ids": tf.pad(tf.gather(input_ids, positions), padding),
    "masked_lm_weights": tf.pad(tf.ones([num_predictions], tf.float32), padding),
  }


def _shifted(mask: tf.Tensor) -> tf.Tensor:
  """mask[i - 1], False at 0: whether the previous position was a candidate."""
  return tf.concat([[False], mask[:-1]], 0)
