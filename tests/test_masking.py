"""Masked-LM selection against the published recipe, measured on >100k generated tokens."""

import dataclasses
import json
import pathlib
import re

import numpy as np
import pytest
import tensorflow as tf

from bert_jax import config_checks
from bert_jax.data import masking, masking_schedule, span_masking
from bert_jax.data.masking import Masking, describe, mask_tokens
from bert_jax.data.masking_names import MASKINGS, masking_scheme
from bert_jax.data.masking_schedule import MaskingRates
from configs import default, tiny

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


def _settings(**overrides) -> Masking:
  """BERT's masking (configs/default.py) with MAX_PREDICTIONS predictions, and `overrides`."""
  bert = Masking.of(default.get_config().data)
  return dataclasses.replace(bert, **{"max_predictions_per_seq": MAX_PREDICTIONS, **overrides})


# What mask_tokens needs of a tokenizer, for _sequences' ids.
GENERATED = dict(special_ids=SPECIAL, word_start=np.arange(VOCAB) < 500, vocab_size=VOCAB, mask_id=MASK)


def _mask_all(ids, mask, scheme="tokens", seed=0, vocabulary=GENERATED, thresholds=False, **overrides):
  """mask_tokens of each row (seed (seed, row)) by `scheme` (data.masking), with `vocabulary` (GENERATED's keys),
  `thresholds` (a masking-rate schedule's) and `overrides` of _settings."""
  settings = _settings(scheme=scheme, **overrides)

  def apply(index, input_ids, input_mask):
    row_seed = tf.stack([tf.constant(seed, tf.int64), index])
    return mask_tokens(input_ids, input_mask, row_seed, **vocabulary, masking=settings, thresholds=thresholds)

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
  out = _mask_all(ids, mask, scheme="words")
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
  ids = np.repeat(np.array([[CLS] + [10, 600, 11, 12, 601, 13] * 3 + [SEP]], np.int32), 40, 0)  # 40 seeds.
  mask = np.ones_like(ids)
  out = _mask_all(ids, mask, scheme="words")
  np.testing.assert_array_equal(out["masked_lm_weights"].sum(1), 3)


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
    masking=_settings(max_predictions_per_seq=80),
  )
  assert int(out["masked_lm_weights"].numpy().sum()) == round(length * 0.15) == 52


def _words(ids, mask):
  """_sequences' candidates (real tokens, not special) and word starts (a piece below 500, or the first after a
  special token): [n, SEQ] bool each."""
  candidate = (mask > 0) & ~np.isin(ids, SPECIAL)
  after_special = ~np.pad(candidate[:, :-1], ((0, 0), (1, 0)))
  return candidate, candidate & ((ids < 500) | after_special)


def _selected(out) -> np.ndarray:
  """[n, SEQ] bool: the positions mask_tokens selected."""
  weights = out["masked_lm_weights"]
  selected = np.zeros(out["input_ids"].shape, bool)
  np.put_along_axis(selected, out["masked_lm_positions"], weights > 0, 1)
  return selected


def _runs(flags: np.ndarray) -> list[tuple[int, int]]:
  """(start, end) of each run of consecutive True positions of a 1-D bool array, end excluded."""
  edges = np.flatnonzero(np.diff(np.concatenate([[0], flags.astype(np.int8), [0]])))
  return list(zip(edges[::2], edges[1::2], strict=True))


def test_span_masking_selects_fifteen_percent_in_whole_words_replaced_span_by_span(masked):
  ids, mask, _ = masked
  out = _mask_all(ids, mask, scheme="spans")
  assert abs(out["masked_lm_weights"].sum() / mask.sum() - 0.15) < 0.005
  candidate, starts = _words(ids, mask)
  selected = _selected(out)
  assert not (selected & ~candidate).any()
  assert (out["input_ids"][~selected] == ids[~selected]).all()
  # Whole words, but for one word per row at most: the budget may cut the last span, leaving a word's first pieces.
  word = np.cumsum(starts, 1) - 1
  for row in range(len(ids)):
    words, chosen = word[row][candidate[row]], selected[row][candidate[row]]
    partial = np.flatnonzero((np.bincount(words, chosen) > 0) & (np.bincount(words, chosen) < np.bincount(words)))
    assert len(partial) <= 1
    for w in partial:
      pieces = chosen[words == w]
      assert (np.diff(pieces.astype(int)) <= 0).all()  # First pieces selected, then none.
  # Each run of consecutive selected tokens (a span, or spans that touch: SpanBERT merges them) is all [MASK], all
  # unchanged or all random. A random token equals [MASK] or the original one time in 1000, which alone mixes a run;
  # tokens decided one by one would mix most runs of two tokens or more.
  kinds = dict(mask=0, kept=0, random=0, mixed=0)
  for row in range(len(ids)):
    for start, end in _runs(selected[row]):
      now, before = out["input_ids"][row, start:end], ids[row, start:end]
      if (now == MASK).all():
        kinds["mask"] += 1
      elif (now == before).all():
        kinds["kept"] += 1
      elif ((now != MASK) & (now != before)).all():
        kinds["random"] += 1
      else:
        kinds["mixed"] += 1
  runs = sum(kinds.values())
  assert runs > 2000 and kinds["mixed"] <= 0.01 * runs, kinds
  assert abs(kinds["mask"] / runs - 0.8) < 0.03 and abs(kinds["kept"] / runs - 0.1) < 0.025, kinds
  assert abs(kinds["random"] / runs - 0.1) < 0.025, kinds


def _select_spans_all(ids, mask, seed=0):
  """span_masking.select_spans of each row of _sequences at 15%: (candidate, starts, budget, selected, span_id,
  span_words)."""
  candidate, starts = _words(ids, mask)
  budget = np.minimum(MAX_PREDICTIONS, np.maximum(1, np.round(mask.sum(1) * 0.15))).astype(np.int32)

  def apply(index, row_candidate, row_starts, row_budget):
    row_seed = tf.stack([tf.constant(seed, tf.int64), index])
    return span_masking.select_spans(row_candidate, row_starts, row_budget, row_seed, geometric_p=0.2, max_words=10)

  rows = tf.data.Dataset.from_tensor_slices((tf.range(len(ids), dtype=tf.int64), candidate, starts, budget))
  selected, span_id, span_words = next(iter(rows.map(apply, num_parallel_calls=tf.data.AUTOTUNE).batch(len(ids))))
  return candidate, starts, budget, selected.numpy(), span_id.numpy(), span_words.numpy()


def test_spans_are_whole_words_from_a_word_start_with_spanbert_s_lengths(masked):
  ids, mask, _ = masked
  candidate, starts, budget, selected, span_id, span_words = _select_spans_all(ids, mask)
  np.testing.assert_array_equal(selected.sum(1), budget)
  np.testing.assert_array_equal(selected, span_id >= 0)
  word = np.cumsum(starts, 1) - 1
  segment = np.cumsum(candidate & ~np.pad(candidate[:, :-1], ((0, 0), (1, 0))), 1)
  for row in range(len(ids)):
    num_spans = int((span_words[row] > 0).sum())
    assert span_id[row].max() == num_spans - 1 and not span_words[row][num_spans:].any()
    before = np.zeros(SEQ, bool)
    for k in range(num_spans):
      mine = span_id[row] == k
      first = np.argmax(mine)
      assert mine.any() and starts[row, first]  # From the anchor's word start ...
      # ... the drawn number of whole words, within the segment; tokens an earlier span took stay that span's.
      in_reach = (segment[row] == segment[row, first]) & (word[row] >= word[row, first])
      fresh = candidate[row] & in_reach & (word[row] < word[row, first] + span_words[row, k]) & ~before
      if k == num_spans - 1:  # The last span stops at the budget.
        fresh &= np.cumsum(fresh) <= budget[row] - before.sum()
      np.testing.assert_array_equal(mine, fresh)
      before |= mine
  # The lengths drawn, which the spans above cover exactly unless cut: SpanBERT's renormalised geometric.
  lengths = span_words[span_words > 0]
  assert len(lengths) > 2500
  np.testing.assert_allclose(
    np.bincount(lengths, minlength=11)[1:] / len(lengths), span_masking.length_pmf(0.2, 10), atol=0.02
  )
  assert abs(lengths.mean() - 3.8) < 0.15 and abs(span_masking.mean_words(0.2, 10) - 3.797) < 5e-4


@pytest.mark.parametrize("scheme", MASKINGS)
def test_the_masking_rate_is_a_setting(scheme):
  ids, mask = _sequences(300, seed=2)
  out = _mask_all(ids, mask, scheme, masked_lm_prob=0.4, max_predictions_per_seq=SEQ)
  assert abs(out["masked_lm_weights"].sum() / mask.sum() - 0.4) < 0.01


def test_a_rate_that_max_predictions_caps_is_stated_with_the_value_needed():
  line, warning = describe(_settings(masked_lm_prob=0.4), SEQ)
  assert warning == (
    "data.masked_lm_prob=0.4 asks for 51 masked tokens in a full 128-token sequence, but "
    "data.max_predictions_per_seq=20 allows 20: such a sequence gets 15.6% masked. Set "
    "data.max_predictions_per_seq=51 to mask 40%."
  )
  assert line == (
    "20 of a full 128-token sequence, 15.6% (data.max_predictions_per_seq caps data.masked_lm_prob=0.4), token by "
    "token; 80% [MASK], 10% random, 10% unchanged"
  )
  full = _mask_all(
    np.array([[CLS] + [7] * (SEQ - 2) + [SEP]], np.int32), np.ones([1, SEQ], np.int32), masked_lm_prob=0.4
  )
  assert full["masked_lm_weights"].sum() == 20
  line, warning = describe(_settings(masked_lm_prob=0.4, max_predictions_per_seq=51, scheme="spans"), SEQ)
  assert warning == "" and line == (
    "40% of tokens (51 of a full 128-token sequence), in spans of 1-10 whole words (geometric p=0.2, mean 3.80); "
    "80% [MASK], 10% random, 10% unchanged"
  )


def test_data_masking_names_a_scheme_of_the_table_and_the_header_names_its_units():
  # The config checks read the names without TensorFlow (masking_names); the table is what masks.
  assert tuple(masking.SCHEMES) == MASKINGS == ("tokens", "words", "spans")
  units = {scheme: describe(_settings(scheme=scheme), SEQ)[0] for scheme in MASKINGS}
  assert units == {
    "tokens": "15% of tokens (19 of a full 128-token sequence), token by token; 80% [MASK], 10% random, 10% unchanged",
    "words": "15% of tokens (19 of a full 128-token sequence), by whole words; 80% [MASK], 10% random, 10% unchanged",
    "spans": "15% of tokens (19 of a full 128-token sequence), in spans of 1-10 whole words (geometric p=0.2, mean "
    "3.80); 80% [MASK], 10% random, 10% unchanged",
  }


@pytest.mark.parametrize(
  "keys,scheme",
  [
    (dict(), "tokens"),
    (dict(masking="words"), "words"),
    (dict(masking="spans"), "spans"),
    (dict(whole_word_masking=True), "words"),
    (dict(span_masking=True), "spans"),
    (dict(whole_word_masking=False, span_masking=True), "spans"),
    (dict(whole_word_masking=False, span_masking=False), "tokens"),
  ],
  ids=lambda value: ",".join(f"{k}={v}" for k, v in value.items()) or "default" if isinstance(value, dict) else value,
)
def test_the_older_keys_read_as_the_scheme_they_asked_for(keys, scheme):
  data = default.get_config().data
  data.update(keys)
  bert = Masking.of(default.get_config().data)
  assert masking_scheme(data) == scheme and Masking.of(data) == dataclasses.replace(bert, scheme=scheme)
  # A checkpoint's saved config (a dict) from before data.masking existed has the older keys alone.
  saved = {key: value for key, value in data.to_dict().items() if key != "masking" and value is not None}
  if "masking" not in keys:
    assert masking_scheme(saved) == scheme


def test_a_config_saved_before_data_masking_existed_reads_as_token_masking():
  metadata = pathlib.Path(__file__).parent / "golden" / "checkpoints" / "2" / "config" / "metadata"
  saved = json.loads(metadata.read_text())["data"]
  assert "masking" not in saved and saved["whole_word_masking"] is False
  assert masking_scheme(saved) == "tokens"


def test_the_replacement_fractions_are_settings(masked):
  ids, mask, _ = masked
  out = _mask_all(ids, mask, mask_token_fraction=0.85, random_token_fraction=0.0)  # ELECTRA's.
  selected = out["masked_lm_weights"] > 0
  now = np.take_along_axis(out["input_ids"], out["masked_lm_positions"], 1)[selected]
  before = out["masked_lm_ids"][selected]
  assert ((now == MASK) | (now == before)).all()  # No random token.
  assert abs(np.mean(now == MASK) - 0.85) < 0.015


# Words the fixture's SentencePiece model has as pieces, and words it spells with several (no x or z: its training
# text has none, and [UNK] would begin a word of its own).
SENTENCEPIECE_WORDS = (
  "the dog ran to london with mary because people played chess in the garden then she went home quickly "
  "and they were playing a new game of cards at night"
).split()


def test_sentencepiece_whole_word_masking_masks_every_piece_of_a_word(fixture_tokenizers):
  tokenizer = fixture_tokenizers["sentencepiece"]
  rng = np.random.default_rng(0)
  rows = 300
  ids, mask = np.zeros((rows, SEQ), np.int32), np.zeros((rows, SEQ), np.int32)
  text_word = np.full((rows, SEQ), -1)  # Each piece's word in the text: a run of letters, or a full stop.
  for row in range(rows):
    tokens, words = [tokenizer.cls_id], [-1]
    for _ in range(2):  # Two segments of a sentence each.
      text = " ".join(rng.choice(SENTENCEPIECE_WORDS, rng.integers(3, 8))) + "."
      spans = [match.span() for match in re.finditer(r"[a-z]+|\.", text)]
      word_of_character = {c: len(words) + i for i, (start, end) in enumerate(spans) for c in range(start, end)}
      position = 0
      for piece_id in tokenizer.encode(text):
        assert piece_id != tokenizer.unk_id, text
        letters = tokenizer.pieces[piece_id].lstrip("\u2581")  # A bare "\u2581" belongs to the word after it.
        while text[position] == " ":
          position += 1
        assert text.startswith(letters, position), (text, letters)
        tokens.append(piece_id)
        words.append(word_of_character[position])
        position += len(letters)
      tokens.append(tokenizer.sep_id)
      words.append(-1)
    assert len(tokens) <= SEQ
    ids[row, : len(tokens)], mask[row, : len(tokens)], text_word[row, : len(tokens)] = tokens, 1, words
  vocabulary = dict(
    special_ids=[tokenizer.pad_id, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id],
    word_start=tokenizer.word_start,
    vocab_size=tokenizer.vocab_size,
    mask_id=tokenizer.mask_id,
  )
  out = _mask_all(ids, mask, "words", vocabulary=vocabulary)
  assert abs(out["masked_lm_weights"].sum() / mask.sum() - 0.15) < 0.02
  selected = _selected(out)
  alone = 0  # Full stops selected without the word before them.
  for row in range(rows):
    for word in np.unique(text_word[row][text_word[row] >= 0]):
      pieces = selected[row][text_word[row] == word]
      assert pieces.all() or not pieces.any(), (row, word)
    for position in np.flatnonzero(selected[row] & (ids[row] == tokenizer.pieces.index("."))):
      alone += not selected[row, position - 1]
  assert alone > 0  # Punctuation is a word of its own (ALBERT's rule), not the end of the word before it.


# A masking-rate schedule (data.masking_phases, data/masking_schedule.py): every instance selected at masked_lm_prob,
# each prediction with its threshold, each batch trimmed to its rate.


def _trimmed(out: dict, rate: float) -> dict:
  """masking.trim_to_rate of rows masked with thresholds."""
  batch = {name: tf.constant(value) for name, value in out.items()}
  return {name: value.numpy() for name, value in masking.trim_to_rate(batch, tf.constant(rate, tf.float32)).items()}


# Selection at 30%, with room for all of it at SEQ tokens.
AT_30 = dict(masked_lm_prob=0.3, max_predictions_per_seq=40)


@pytest.mark.parametrize("scheme", MASKINGS)
def test_thresholds_leave_the_masks_as_they_were_and_a_trim_to_the_selection_rate_keeps_them_all(masked, scheme):
  ids, mask, _ = masked
  ids, mask = ids[:300], mask[:300]
  plain = _mask_all(ids, mask, scheme, **AT_30)
  with_thresholds = _mask_all(ids, mask, scheme, thresholds=True, **AT_30)
  thresholds = with_thresholds.pop("masked_lm_thresholds")
  assert thresholds.shape == (300, 40) and thresholds.dtype == np.float32
  for name in plain:
    np.testing.assert_array_equal(with_thresholds[name], plain[name], err_msg=name)
  predicted = plain["masked_lm_weights"] > 0
  assert (thresholds[~predicted] == 2.0).all() and (thresholds[predicted] <= np.float32(0.3)).all()
  assert ((thresholds == 0) & predicted).any(1).all()  # Every instance keeps its first unit at any rate.
  trimmed = _trimmed(dict(with_thresholds, masked_lm_thresholds=thresholds), 0.3)
  assert trimmed.keys() == plain.keys()  # The thresholds are not passed on.
  for name in plain:
    np.testing.assert_array_equal(trimmed[name], plain[name], err_msg=name)


def test_a_tokens_trim_to_a_rate_is_the_recipe_at_that_rate(masked):
  """Selected at 30% and trimmed to 15%: each row keeps round(length x 15%) predictions (at least 1), as masking at
  15% selects, replaced 80/10/10; a dropped position holds its original token again (no [MASK] without a
  prediction); the kept predictions come first, in position order."""
  ids, mask, at_15 = masked
  trimmed = _trimmed(_mask_all(ids, mask, thresholds=True, **AT_30), 0.15)
  weights = trimmed["masked_lm_weights"]
  kept = weights.sum(1)
  asked = mask.sum(1) * 0.15
  expected = np.maximum(1, np.round(asked))
  tie = np.abs(asked % 1 - 0.5) < 1e-9  # 70 x 15% = 10.5: the trim keeps 11 where round gives 10 (half to even).
  assert 0 < tie.sum() < 0.1 * len(ids)
  np.testing.assert_array_equal(kept[~tie], expected[~tie])
  assert (np.abs(kept - expected)[tie] <= 1).all()
  assert kept.mean() == pytest.approx(at_15["masked_lm_weights"].sum(1).mean(), rel=0.005)  # The ties: 0.23% here.
  selected = _selected(trimmed)
  assert (trimmed["input_ids"][~selected] == ids[~selected]).all()
  for row in range(len(ids)):
    positions = trimmed["masked_lm_positions"][row]
    assert (weights[row][: int(kept[row])] == 1).all() and not weights[row][int(kept[row]) :].any()
    assert (np.diff(positions[: int(kept[row])]) > 0).all() and not positions[int(kept[row]) :].any()
  now = np.take_along_axis(trimmed["input_ids"], trimmed["masked_lm_positions"], 1)[weights > 0]
  before = trimmed["masked_lm_ids"][weights > 0]
  np.testing.assert_array_equal(before, ids[selected])  # Row by row, in position order.
  assert abs(np.mean(now == MASK) - 0.8) < 0.015 and abs(np.mean(now == before) - 0.1) < 0.015


@pytest.mark.parametrize("scheme", ["words", "spans"])
def test_words_and_spans_are_trimmed_whole_at_their_rate(masked, scheme):
  """A word (a run of selected tokens, for spans) is kept or dropped whole; the kept tokens come to the rate on
  average (each unit kept while its middle is within the rate)."""
  ids, mask, _ = masked
  out = _mask_all(ids, mask, scheme, thresholds=True, **AT_30)
  trimmed = _trimmed(out, 0.15)
  assert abs(trimmed["masked_lm_weights"].sum() / mask.sum() - 0.15) < 0.005
  before, after = _selected(out), _selected(trimmed)
  assert not (after & ~before).any()
  candidate, starts = _words(ids, mask)
  units = (
    np.cumsum(starts, 1) if scheme == "words" else np.cumsum(before & ~np.pad(before[:, :-1], ((0, 0), (1, 0))), 1)
  )
  for row in range(len(ids)):
    for unit in np.unique(units[row][before[row]]):
      kept = after[row][before[row] & (units[row] == unit)]
      assert kept.all() or not kept.any(), (row, unit)
  assert (trimmed["input_ids"][~after] == ids[~after]).all()


def test_a_batchs_rate_follows_its_phase_constant_or_linear_and_the_last_rate_after():
  rates = MaskingRates(bounds=(0, 2, 4, 8), firsts=(0.3, 0.15, 0.15), lasts=(0.3, 0.15, 0.05))
  got = [float(masking.batch_rate(tf.constant(b, tf.int64), rates)) for b in range(12)]
  linear = [0.15 - 0.1 * k / 4 for k in range(4)]
  np.testing.assert_allclose(got, [0.3, 0.3, 0.15, 0.15, *linear, 0.05, 0.05, 0.05, 0.05], rtol=1e-6)
  assert got[0] == np.float32(0.3) and got[2] == np.float32(0.15)  # A phase's own rate, exactly.


def _scheduled(phases: str, **keys):
  """configs/tiny.py with data.masking_phases=`phases`, masked_lm_prob 0.3 and `keys`."""
  config = tiny.get_config()
  config.data.update(masking_phases=phases, masked_lm_prob=0.3)
  config.update(keys)
  return config


def test_a_schedule_resolves_to_reader_batches_and_the_header_says_it():
  config = _scheduled("0: 0.3; 200: 0.15; 400: 0.15->0.05", num_train_steps=550)
  config_checks.check_pretraining(config)
  assert MaskingRates.of(config) == MaskingRates((0, 200, 400, 550), (0.3, 0.15, 0.15), (0.3, 0.15, 0.05))
  assert masking_schedule.describe(config) == (
    "by phase: 30% (steps 1-200), 15% (steps 201-400), 15%->5% (steps 401-550); selected at 30% "
    "(data.masked_lm_prob), each step's rows trimmed to its rate"
  )
  # A batch-size warmup: reader batches of its first size, 8 rows (steps of 8, 16 and 24 rows, 4 each, then 32), a
  # phase beginning in tokens: 2e4 token positions at 64 per row are 312.5 rows, read by the end of step 16 (192 rows
  # in the warmup's 12 steps, then 32 a step: 320 rows, 40 reader batches); step 550 ends at 17,408 rows, 2,176.
  warm = _scheduled("0: 0.3; 2e4tokens: 0.1", batch_warmup_start=8, batch_warmup_tokens=10_000)
  config_checks.check_pretraining(warm)
  assert MaskingRates.of(warm) == MaskingRates((0, 40, 2176), (0.3, 0.1), (0.3, 0.1))
  assert MaskingRates.of(tiny.get_config()) is None and masking_schedule.describe(tiny.get_config()) == ""


BAD_SCHEDULES = [
  (
    "0: 0.3; 100: 0.4",
    "data.masking_phases: phase '100: 0.4' has rate 0.4; expected rates in (0, data.masked_lm_prob=0.3]",
  ),
  ("0: 0.3->0", "data.masking_phases: phase '0: 0.3->0' has rate 0; expected rates in (0, data.masked_lm_prob=0.3]"),
  ("0: -0.1", "data.masking_phases: phase '0: -0.1' has rate -0.1; expected"),
  ("0: nan", "data.masking_phases: 'nan' is not a masking rate (a finite number)."),
  ("0: 0.3; 100: fast", "data.masking_phases: 'fast' is not a masking rate (a finite number)."),
  (
    "0: 0.3; 300: 0.2; 200: 0.1",
    "data.masking_phases: phases out of order: '200' (step 200) does not begin after '300'",
  ),
  ("100: 0.2", "data.masking_phases: the first phase begins at '100'; it must begin at 0."),
  ("0 0.2", "data.masking_phases: phase '0 0.2' is not BEGIN: VALUE"),
]


@pytest.mark.parametrize("phases,error", BAD_SCHEDULES, ids=[phases for phases, _ in BAD_SCHEDULES])
def test_a_bad_masking_schedule_is_refused_naming_the_key_and_the_phase(phases, error):
  with pytest.raises(ValueError, match=re.escape(error)):
    config_checks.check_pretraining(_scheduled(phases))
