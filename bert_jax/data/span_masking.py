"""SpanBERT's span masking (Joshi et al., 2020; facebookresearch/SpanBERT `PairWithSpanMaskingScheme.mask`), in
TensorFlow ops with a stateless seed, for `masking.mask_tokens`.

Until the budget (the tokens `masked_lm_prob` asks for) is selected, draw a span length in words, geometric with
p=0.2 cut to 1..10 words and renormalised (mean 3.8 words), and an anchor uniformly among the candidate tokens; an
anchor already selected is skipped with its length. The span covers the anchor's whole word and the whole words after
it, that many words in all, and never crosses a token that is not a candidate ([SEP]: it stays in its segment).
Tokens of the span that an earlier span selected stay selected and cost nothing (SpanBERT's spans overlap, then
merge). The budget may cut the last span, within a word. Draws are bounded at 4 x budget: a budget the anchors cannot
reach (nearly every candidate selected, as with masked_lm_prob near 1) ends with fewer tokens.
"""

import numpy as np

from bert_jax.tensorflow_cpu import tf


def length_pmf(geometric_p: float, max_words: int) -> np.ndarray:
  """[max_words] float64: the probability of a span of 1, 2, ... max_words words."""
  weights = geometric_p * (1 - geometric_p) ** np.arange(max_words)
  return weights / weights.sum()


def mean_words(geometric_p: float, max_words: int) -> float:
  """The mean span length in words (3.797 for p=0.2 over 1..10: the paper's 3.8)."""
  return float(np.dot(np.arange(1, max_words + 1), length_pmf(geometric_p, max_words)))


def select_spans(candidate, word_starts, budget, seed, *, geometric_p: float, max_words: int):
  """candidate, word_starts: [seq] bool (the tokens that may be selected; those of them that begin a word); budget:
  scalar int32, tokens to select; seed: [2] int64.

  Returns selected [seq] bool; span_id [seq] int32: the span (numbered in the order drawn, from 0) that selected
  each token, -1 where none; span_words [seq] int32: each span's drawn length in words, 0 after the last span.
  """
  seq_len = tf.shape(candidate)[0]
  word = tf.cumsum(tf.cast(word_starts, tf.int32)) - 1
  after_gap = candidate & ~tf.concat([[False], candidate[:-1]], 0)
  segment = tf.cumsum(tf.cast(after_gap, tf.int32))  # Runs of consecutive candidates.
  positions = tf.cast(tf.where(candidate)[:, 0], tf.int32)
  num_candidates = tf.shape(positions)[0]
  budget = tf.minimum(budget, num_candidates)
  # A length is 1 + the number of the cumulative probabilities below a uniform draw.
  cumulative = tf.constant(np.cumsum(length_pmf(geometric_p, max_words))[:-1], tf.float32)

  def body(draw, taken, selected, span_id, span_words, spans):
    u = tf.random.stateless_uniform([2], tf.random.experimental.stateless_fold_in(seed, tf.cast(draw, tf.int64)))
    words = 1 + tf.reduce_sum(tf.cast(u[0] >= cumulative, tf.int32))
    anchor = positions[tf.minimum(tf.cast(u[1] * tf.cast(num_candidates, tf.float32), tf.int32), num_candidates - 1)]
    first = word[anchor]
    fresh = ~selected[anchor]
    covered = candidate & (segment == segment[anchor]) & (word >= first) & (word < first + words)
    new = covered & ~selected & fresh
    take = new & (tf.cumsum(tf.cast(new, tf.int32)) <= budget - taken)
    span_words = tf.tensor_scatter_nd_update(span_words, [[spans]], [tf.where(fresh, words, span_words[spans])])
    return (
      draw + 1,
      taken + tf.reduce_sum(tf.cast(take, tf.int32)),
      selected | take,
      tf.where(take, spans, span_id),
      span_words,
      spans + tf.cast(fresh, tf.int32),
    )

  # Every accepted span selects at least its first token (an unselected anchor's word is unselected: only the last
  # span, cut by the budget, can leave a word partly selected), so `spans` stays below the budget while looping.
  state = (0, 0, tf.zeros([seq_len], tf.bool), tf.fill([seq_len], -1), tf.zeros([seq_len], tf.int32), 0)
  _, _, selected, span_id, span_words, _ = tf.while_loop(
    lambda draw, taken, *_: (taken < budget) & (draw < 4 * budget), body, state
  )
  return selected, span_id, span_words
