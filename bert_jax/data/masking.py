"""Masked-LM selection on the fly, in TensorFlow ops (inside the tf.data graph, no Python per example).

BERT's recipe: `masked_lm_prob` (15%) of the tokens of a sequence are selected (counting [CLS] and [SEP] in
the length as the original does, at least one, at most `max_predictions_per_seq`), never [CLS], [SEP] or
[PAD]; of those, 80% become [MASK], 10% a random token, 10% stay (`mask_token_fraction`, `random_token_fraction`).
The selection works in units, by the scheme `data.masking` names (`SCHEMES`): tokens; whole words (a word's pieces
are selected together); or SpanBERT's spans of whole words (`span_masking.py`). A new scheme is a selection function
and its entry in `SCHEMES` (and its name in `masking_names.MASKINGS`, which the config checks read without
TensorFlow). Every random choice comes from a stateless seed, so the same example gets the same masks on any host and
after any restart.
"""

import dataclasses
from collections.abc import Callable

from bert_jax.data import span_masking
from bert_jax.data.masking_names import masking_scheme
from bert_jax.data.masking_schedule import MaskingRates
from bert_jax.tensorflow_cpu import tf


@dataclasses.dataclass(frozen=True)
class Masking:
  """What masked-LM selection does: `config.data`'s masking keys, named as there (configs/default.py), but for
  `scheme`: `data.masking` as the older keys may set it (`masking_names.masking_scheme`)."""

  masked_lm_prob: float
  max_predictions_per_seq: int
  scheme: str
  span_geometric_p: float
  span_max_words: int
  mask_token_fraction: float
  random_token_fraction: float

  @classmethod
  def of(cls, data) -> "Masking":
    """The masking keys of `data` (`config.data`)."""
    keys = {field.name: data[field.name] for field in dataclasses.fields(cls) if field.name != "scheme"}
    return cls(scheme=masking_scheme(data), **keys)


def describe(masking: Masking, max_seq_length: int, key: str = "data.masked_lm_prob") -> tuple[str, str]:
  """The run header's line (the rate a full-length sequence gets, the units, the replacements) and a warning ('' if
  none) when `max_predictions_per_seq` caps what `masked_lm_prob` asks of a full-length sequence; `key`: the config
  key the rate came from."""
  asked = max(1, round(max_seq_length * masking.masked_lm_prob))  # As `mask_tokens` rounds.
  gets = min(asked, masking.max_predictions_per_seq)
  units = SCHEMES[masking.scheme].units(masking)
  kept = max(0.0, 1 - masking.mask_token_fraction - masking.random_token_fraction)  # Not -5e-17 for 0.8 + 0.2.
  replaced = (
    f"{_percent(masking.mask_token_fraction)} [MASK], {_percent(masking.random_token_fraction)} random, "
    f"{_percent(kept)} unchanged"
  )
  full = f"{gets} of a full {max_seq_length}-token sequence"
  if gets == asked:
    return f"{_percent(masking.masked_lm_prob)} of tokens ({full}), {units}; {replaced}", ""
  warning = (
    f"{key}={masking.masked_lm_prob:g} asks for {asked} masked tokens in a full {max_seq_length}-token "
    f"sequence, but data.max_predictions_per_seq={masking.max_predictions_per_seq} allows {gets}: such a sequence "
    f"gets {_percent(gets / max_seq_length)} masked. Set data.max_predictions_per_seq={asked} to mask "
    f"{_percent(masking.masked_lm_prob)}."
  )
  capped = f"data.max_predictions_per_seq caps {key}={masking.masked_lm_prob:g}"
  return f"{full}, {_percent(gets / max_seq_length)} ({capped}), {units}; {replaced}", warning


def _percent(fraction: float) -> str:
  return f"{100 * fraction:.3g}%"


def mask_tokens(
  input_ids: tf.Tensor,
  input_mask: tf.Tensor,
  seed: tf.Tensor,
  *,
  special_ids,
  word_start,
  vocab_size: int,
  mask_id: int,
  masking: Masking,
  thresholds: bool = False,
) -> dict:
  """input_ids, input_mask: [seq] int32; seed: [2] int32 or int64; word_start: [vocab] bool.

  Returns `input_ids` with the replacements, `masked_lm_positions`, `masked_lm_ids` (the original tokens)
  and `masked_lm_weights` ([max_predictions_per_seq], padded with 0); with `thresholds` (a masking-rate schedule,
  `masking_schedule.py`), also `masked_lm_thresholds` ([max_predictions_per_seq] float32): the lowest rate at which
  each prediction is kept (`_thresholds`; padding 2.0, never kept).
  """
  max_predictions = masking.max_predictions_per_seq
  seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), num=3)
  is_real = input_mask > 0
  candidate = is_real & ~tf.reduce_any(input_ids[:, None] == tf.constant(special_ids, tf.int32)[None, :], axis=1)
  # float64, so that round-half-to-even sees the same products as Python's `round(len(tokens) * prob)`.
  num_tokens = tf.reduce_sum(tf.cast(is_real, tf.float64))
  num_to_predict = tf.minimum(
    max_predictions, tf.maximum(1, tf.cast(tf.round(num_tokens * masking.masked_lm_prob), tf.int32))
  )
  # A word starts at a word-start piece, or after a non-candidate ([CLS], [SEP]).
  word_starts = candidate & (tf.gather(tf.constant(word_start, tf.bool), input_ids) | ~_shifted(candidate))

  selected, unit = SCHEMES[masking.scheme].select(candidate, word_starts, num_to_predict, seeds[0], masking)
  masked_input_ids = _replace(input_ids, selected, unit, seeds[1], seeds[2], vocab_size, mask_id, masking)

  positions = tf.cast(tf.where(selected)[:, 0], tf.int32)[:max_predictions]
  num_predictions = tf.shape(positions)[0]
  padding = [[0, max_predictions - num_predictions]]
  out = {
    "input_ids": masked_input_ids,
    "masked_lm_positions": tf.pad(positions, padding),
    "masked_lm_ids": tf.pad(tf.gather(input_ids, positions), padding),
    "masked_lm_weights": tf.pad(tf.ones([num_predictions], tf.float32), padding),
  }
  if thresholds:
    units = SCHEMES[masking.scheme].trim_units(selected, unit, word_starts)
    kept_from = _thresholds(positions, units, num_tokens, seed, masking.masked_lm_prob)
    out["masked_lm_thresholds"] = tf.pad(kept_from, padding, constant_values=NEVER_KEPT)
  return out


# A salt apart from the pipeline's (pipeline.py, packing.py): the order in which a schedule trims an instance's units.
_TRIM_ORDER = 0x7215
# The threshold of a padding prediction: above any rate, never kept.
NEVER_KEPT = 2.0


def _thresholds(positions, units, num_tokens, seed, masked_lm_prob: float) -> tf.Tensor:
  """[predictions] float32: the lowest rate at which each prediction (at `positions`, [predictions] int32) is kept.

  The selected units (`units` [seq]: each position's trim unit, in [0, seq)) in a random order (a seed of their own,
  folded from the instance's: the masks stay as they are); c(unit): the selected tokens of the units up to it in that
  order, itself included. The first unit's threshold is 0 (an instance keeps one, as `mask_tokens` selects at least
  one), each other's (c - 0.5) / `num_tokens` (the real tokens), so that at rate p the units of the first
  round(num_tokens x p) tokens or so are kept, as `mask_tokens` rounds; at most `masked_lm_prob`, the rate they were
  selected at, so that trimming to it keeps everything."""
  order_seed = tf.random.experimental.stateless_fold_in(tf.cast(seed, tf.int64), _TRIM_ORDER)
  rank = tf.argsort(tf.argsort(tf.random.stateless_uniform(tf.shape(units), order_seed)))  # Distinct per unit.
  unit_rank = tf.gather(rank, tf.gather(units, positions))  # [predictions]
  tokens_up_to = tf.reduce_sum(tf.cast(unit_rank[None, :] <= unit_rank[:, None], tf.float64), axis=1)
  unit_tokens = tf.reduce_sum(tf.cast(unit_rank[None, :] == unit_rank[:, None], tf.float64), axis=1)
  first = unit_rank == tf.reduce_min(unit_rank)
  later = tf.minimum((tokens_up_to - unit_tokens / 2) / num_tokens, masked_lm_prob)
  return tf.cast(tf.where(first, tf.zeros_like(later), later), tf.float32)


def batch_rate(batch_index, rates: MaskingRates) -> tf.Tensor:
  """The masking rate of reader batch `batch_index` (scalar int64) by `rates` (masking_schedule.py): its phase's,
  linear from the phase's first rate to its last; past the last bound, the last rate. Scalar float32."""
  bounds = tf.constant(rates.bounds, tf.int64)
  phase = tf.clip_by_value(tf.searchsorted(bounds, batch_index[None], side="right")[0] - 1, 0, len(rates.firsts) - 1)
  begin, end = bounds[phase], bounds[phase + 1]
  within = tf.cast(tf.minimum(batch_index, end) - begin, tf.float64) / tf.cast(end - begin, tf.float64)
  first, last = tf.constant(rates.firsts, tf.float64)[phase], tf.constant(rates.lasts, tf.float64)[phase]
  return tf.cast(first + within * (last - first), tf.float32)


def trim_to_rate(batch: dict, rate) -> dict:
  """A batch of rows masked with thresholds (`mask_tokens(..., thresholds=True)`; [batch, ...] each) trimmed to
  `rate` (scalar float32): a prediction is kept where its threshold is at most the rate; a dropped one's position
  gets its original token back (`masked_lm_ids`), and the kept predictions move to the front of `masked_lm_*`, the
  rest 0. `masked_lm_thresholds` is left out: the model never sees it."""
  trimmed = dict(batch)
  thresholds = trimmed.pop("masked_lm_thresholds")
  predicted = batch["masked_lm_weights"] > 0
  keep = predicted & (thresholds <= rate)
  dropped = tf.where(predicted & ~keep)  # [n, 2]: (row, prediction)
  at = tf.stack([dropped[:, 0], tf.cast(tf.gather_nd(batch["masked_lm_positions"], dropped), tf.int64)], axis=1)
  trimmed["input_ids"] = tf.tensor_scatter_nd_update(
    batch["input_ids"], at, tf.gather_nd(batch["masked_lm_ids"], dropped)
  )
  order = tf.argsort(tf.cast(~keep, tf.int32), axis=1, stable=True)  # Kept first, each in its order.
  kept = tf.gather(keep, order, batch_dims=1)
  for name in ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights"):
    values = tf.gather(batch[name], order, batch_dims=1)
    trimmed[name] = tf.where(kept, values, tf.zeros_like(values))
  return trimmed


def _tokens(candidate, word_starts, num_to_predict, seed, masking: Masking):
  """BERT's: tokens in a random order, the first `num_to_predict` of them; replaced token by token."""
  selected = _select_units(candidate, candidate, num_to_predict, seed, whole_word=False)
  return selected, tf.range(tf.shape(candidate)[0])


def _words(candidate, word_starts, num_to_predict, seed, masking: Masking):
  """Whole words in a random order, a word that does not fit skipped; replaced token by token, as BERT's
  `create_pretraining_data.py` does with whole words too."""
  selected = _select_units(candidate, word_starts, num_to_predict, seed, whole_word=True)
  return selected, tf.range(tf.shape(candidate)[0])


def _spans(candidate, word_starts, num_to_predict, seed, masking: Masking):
  """SpanBERT's spans of whole words (`span_masking.py`); replaced span by span."""
  selected, _, _ = span_masking.select_spans(
    candidate,
    word_starts,
    num_to_predict,
    seed,
    geometric_p=masking.span_geometric_p,
    max_words=masking.span_max_words,
  )
  # SpanBERT decides the replacement once per span, spans that touch counting as one (its `merge_intervals`): once
  # per run of consecutive selected tokens.
  return selected, tf.maximum(tf.cumsum(tf.cast(selected & ~_shifted(selected), tf.int32)) - 1, 0)


def _span_units(masking: Masking) -> str:
  mean = span_masking.mean_words(masking.span_geometric_p, masking.span_max_words)
  geometric = f"geometric p={masking.span_geometric_p:g}, mean {mean:.2f}"
  return f"in spans of 1-{masking.span_max_words} whole words ({geometric})"


@dataclasses.dataclass(frozen=True)
class Scheme:
  """A masking scheme: `select(candidate, word_starts, num_to_predict, seed, masking)` (candidate, word_starts: [seq]
  bool, the tokens that may be selected and those of them that begin a word; num_to_predict: scalar int32; seed: [2]
  int64) returns the selected tokens [seq] bool and each position's replacement unit [seq] int32 (in [0, seq): its
  tokens share one [MASK] / random / unchanged decision); `units(masking)` names the units in the run's header;
  `trim_units(selected, unit, word_starts)` gives each position's unit [seq] int32 (in [0, seq)) for a masking-rate
  schedule, which keeps or drops a unit's selected tokens together."""

  select: Callable
  units: Callable[[Masking], str]
  trim_units: Callable


# data.masking -> its scheme; the names are masking_names.MASKINGS.
SCHEMES = {
  "tokens": Scheme(_tokens, lambda masking: "token by token", lambda selected, unit, starts: tf.range(tf.size(unit))),
  "words": Scheme(_words, lambda masking: "by whole words", lambda selected, unit, starts: _word_of(starts)),
  "spans": Scheme(_spans, _span_units, lambda selected, unit, starts: unit),  # A run of selected tokens.
}


def _word_of(word_starts) -> tf.Tensor:
  """[seq] int32: each position's word, numbered from 0 (0 before the first)."""
  return tf.maximum(tf.cumsum(tf.cast(word_starts, tf.int32)) - 1, 0)


def _select_units(candidate, starts, num_to_predict, seed, *, whole_word: bool) -> tf.Tensor:
  """[seq] bool: BERT's selection. Candidates grouped into units (a unit begins at each of `starts`: a word, or a
  token), taken in a random order until `num_to_predict` tokens; a unit that does not fit in what is left is
  skipped, later ones may fit."""
  seq_len = tf.shape(candidate)[0]
  unit = tf.cumsum(tf.cast(starts, tf.int32)) - 1  # Unit index of each position; only candidates count.
  num_units = tf.reduce_sum(tf.cast(starts, tf.int32))
  unit_scores = tf.random.stateless_uniform([seq_len], seed)
  unit_rank = tf.argsort(tf.argsort(unit_scores[:num_units]))  # A random permutation of the units.
  unit_sizes = tf.math.unsorted_segment_sum(
    tf.cast(candidate, tf.int32), tf.where(candidate, unit, num_units), num_units + 1
  )[:num_units]
  size_by_rank = tf.scatter_nd(unit_rank[:, None], unit_sizes, [num_units])
  if whole_word:
    totals = tf.scan(
      lambda total, size: tf.where(total + size <= num_to_predict, total + size, total), size_by_rank, initializer=0
    )
    taken_rank = totals > tf.concat([[0], totals[:-1]], 0)
  else:  # Units of one token: the first num_to_predict of them.
    taken_rank = tf.cumsum(size_by_rank) <= num_to_predict
  unit_taken = tf.gather(taken_rank, unit_rank)
  return candidate & tf.gather(tf.concat([unit_taken, [False]], 0), tf.where(candidate, unit, num_units))


def _replace(input_ids, selected, unit, draw_seed, random_seed, vocab_size: int, mask_id: int, masking: Masking):
  """input_ids [seq] with each selected position replaced: [MASK] (`mask_token_fraction`), a random token
  (`random_token_fraction`) or itself, decided once per unit (`unit` [seq]: each position's unit, in [0, seq));
  a random replacement draws a token per position."""
  seq_len = tf.shape(input_ids)[0]
  draw = tf.gather(tf.random.stateless_uniform([seq_len], draw_seed), unit)
  random_ids = tf.random.stateless_uniform([seq_len], random_seed, minval=0, maxval=vocab_size, dtype=tf.int32)
  kept_below = 1 - masking.random_token_fraction  # Draws in [mask_token_fraction, kept_below) keep the token.
  replacement = tf.where(
    draw < masking.mask_token_fraction, mask_id, tf.where(draw < kept_below, input_ids, random_ids)
  )
  return tf.where(selected, replacement, input_ids)


def _shifted(mask: tf.Tensor) -> tf.Tensor:
  """mask[i - 1], False at 0: whether the previous position was a candidate (or was selected)."""
  return tf.concat([[False], mask[:-1]], 0)
