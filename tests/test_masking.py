"""Masked-LM selection against the published recipe, measured on >100k generated tokens."""

import dataclasses
import json
import pathlib
import re

import numpy as np
import pytest
import tensorflow as tf

from bert_jax.data import masking, span_masking
from bert_jax.data.masking import Masking, describe, mask_tokens
from bert_jax.data.masking_names import MASKINGS, masking_scheme
from configs import default
from tests.helpers import MASKING_CLS as CLS
from tests.helpers import MASKING_MASK as MASK
from tests.helpers import MASKING_PREDICTIONS as MAX_PREDICTIONS
from tests.helpers import MASKING_SEP as SEP
from tests.helpers import MASKING_SEQ as SEQ
from tests.helpers import MASKING_SPECIAL as SPECIAL
from tests.helpers import MASKING_VOCAB as VOCAB
from tests.helpers import generated_rows, mask_all, masking_settings, selected_positions, words_of


@pytest.fixture(scope="module")
def masked():
  ids, mask = generated_rows(1100)
  assert mask.sum() > 100_000
  return ids, mask, mask_all(ids, mask)


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
  again = mask_all(ids[:50], mask[:50])
  for name in again:
    np.testing.assert_array_equal(again[name], out[name][:50])
  other = mask_all(ids[:50], mask[:50], seed=1)
  assert not np.array_equal(other["masked_lm_positions"], out["masked_lm_positions"][:50])


def test_whole_word_masking_takes_every_piece_of_a_word():
  ids, mask = generated_rows(300, seed=1)
  out = mask_all(ids, mask, scheme="words")
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
  out = mask_all(ids, mask, scheme="words")
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
    masking=masking_settings(max_predictions_per_seq=80),
  )
  assert int(out["masked_lm_weights"].numpy().sum()) == round(length * 0.15) == 52


def _runs(flags: np.ndarray) -> list[tuple[int, int]]:
  """(start, end) of each run of consecutive True positions of a 1-D bool array, end excluded."""
  edges = np.flatnonzero(np.diff(np.concatenate([[0], flags.astype(np.int8), [0]])))
  return list(zip(edges[::2], edges[1::2], strict=True))


def test_span_masking_selects_fifteen_percent_in_whole_words_replaced_span_by_span(masked):
  ids, mask, _ = masked
  out = mask_all(ids, mask, scheme="spans")
  assert abs(out["masked_lm_weights"].sum() / mask.sum() - 0.15) < 0.005
  candidate, starts = words_of(ids, mask)
  selected = selected_positions(out)
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
  candidate, starts = words_of(ids, mask)
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
  ids, mask = generated_rows(300, seed=2)
  out = mask_all(ids, mask, scheme, masked_lm_prob=0.4, max_predictions_per_seq=SEQ)
  assert abs(out["masked_lm_weights"].sum() / mask.sum() - 0.4) < 0.01


def test_a_rate_that_max_predictions_caps_is_stated_with_the_value_needed():
  line, warning = describe(masking_settings(masked_lm_prob=0.4), SEQ)
  assert warning == (
    "data.masked_lm_prob=0.4 asks for 51 masked tokens in a full 128-token sequence, but "
    "data.max_predictions_per_seq=20 allows 20: such a sequence gets 15.6% masked. Set "
    "data.max_predictions_per_seq=51 to mask 40%."
  )
  assert line == (
    "20 of a full 128-token sequence, 15.6% (data.max_predictions_per_seq caps data.masked_lm_prob=0.4), token by "
    "token; 80% [MASK], 10% random, 10% unchanged"
  )
  full = mask_all(
    np.array([[CLS] + [7] * (SEQ - 2) + [SEP]], np.int32), np.ones([1, SEQ], np.int32), masked_lm_prob=0.4
  )
  assert full["masked_lm_weights"].sum() == 20
  line, warning = describe(masking_settings(masked_lm_prob=0.4, max_predictions_per_seq=51, scheme="spans"), SEQ)
  assert warning == "" and line == (
    "40% of tokens (51 of a full 128-token sequence), in spans of 1-10 whole words (geometric p=0.2, mean 3.80); "
    "80% [MASK], 10% random, 10% unchanged"
  )


def test_data_masking_names_a_scheme_of_the_table_and_the_header_names_its_units():
  # The config checks read the names without TensorFlow (masking_names); the table is what masks.
  assert tuple(masking.SCHEMES) == MASKINGS == ("tokens", "words", "spans")
  units = {scheme: describe(masking_settings(scheme=scheme), SEQ)[0] for scheme in MASKINGS}
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
  out = mask_all(ids, mask, mask_token_fraction=0.85, random_token_fraction=0.0)  # ELECTRA's.
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
  out = mask_all(ids, mask, "words", vocabulary=vocabulary)
  assert abs(out["masked_lm_weights"].sum() / mask.sum() - 0.15) < 0.02
  selected = selected_positions(out)
  alone = 0  # Full stops selected without the word before them.
  for row in range(rows):
    for word in np.unique(text_word[row][text_word[row] >= 0]):
      pieces = selected[row][text_word[row] == word]
      assert pieces.all() or not pieces.any(), (row, word)
    for position in np.flatnonzero(selected[row] & (ids[row] == tokenizer.pieces.index("."))):
      alone += not selected[row, position - 1]
  assert alone > 0  # Punctuation is a word of its own (ALBERT's rule), not the end of the word before it.
