"""The masking rate as a schedule (data.masking_phases; data/masking_schedule.py): each prediction's threshold and the
trim to a rate (masking.py) against the recipe at that rate, by tokens, whole words and spans; each batch's rate by its
phase; the schedule checked, resolved to reader batches and described; the pipeline's batches following it, and
evaluation's at its own fixed rate over the same rows. Its
resumption from saved states: tests/test_pipeline_state.py; a run's: tests/test_train.py's batch warmup."""

import re

import numpy as np
import pytest
import tensorflow as tf

from bert_jax import config_checks
from bert_jax.data import masking, masking_schedule
from bert_jax.data.masking_names import MASKINGS
from bert_jax.data.masking_schedule import MaskingRates
from configs import tiny
from tests.helpers import MASKING_MASK as MASK
from tests.helpers import (
  PIPELINE_SCHEDULE,
  PIPELINE_SEQ,
  assert_same_batches,
  corpus_source,
  generated_rows,
  mask_all,
  next_batches,
  selected_positions,
  unmasked_ids,
  words_of,
)


@pytest.fixture(scope="module")
def masked():
  """1,100 generated rows (over 100k tokens) and their masks at 15%."""
  ids, mask = generated_rows(1100)
  return ids, mask, mask_all(ids, mask)


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
  plain = mask_all(ids, mask, scheme, **AT_30)
  with_thresholds = mask_all(ids, mask, scheme, thresholds=True, **AT_30)
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
  trimmed = _trimmed(mask_all(ids, mask, thresholds=True, **AT_30), 0.15)
  weights = trimmed["masked_lm_weights"]
  kept = weights.sum(1)
  asked = mask.sum(1) * 0.15
  expected = np.maximum(1, np.round(asked))
  tie = np.abs(asked % 1 - 0.5) < 1e-9  # 70 x 15% = 10.5: the trim keeps 11 where round gives 10 (half to even).
  assert 0 < tie.sum() < 0.1 * len(ids)
  np.testing.assert_array_equal(kept[~tie], expected[~tie])
  assert (np.abs(kept - expected)[tie] <= 1).all()
  assert kept.mean() == pytest.approx(at_15["masked_lm_weights"].sum(1).mean(), rel=0.005)  # The ties: 0.23% here.
  selected = selected_positions(trimmed)
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
  out = mask_all(ids, mask, scheme, thresholds=True, **AT_30)
  trimmed = _trimmed(out, 0.15)
  assert abs(trimmed["masked_lm_weights"].sum() / mask.sum() - 0.15) < 0.005
  before, after = selected_positions(out), selected_positions(trimmed)
  assert not (after & ~before).any()
  candidate, starts = words_of(ids, mask)
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
  # A run whose learning-rate schedule ends later (a first phase of several): the last phase ends there too.
  longer = _scheduled("0: 0.3; 200: 0.15; 400: 0.15->0.05", num_train_steps=550, schedule_end_step=1000)
  assert MaskingRates.of(longer).bounds == (0, 200, 400, 1000)
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


# The pipeline's batches under tests/helpers.py's PIPELINE_SCHEDULE: each batch's rate by its place in the stream.
RATES = [0.3, 0.3, 0.15, 0.15, 0.3, 0.3 - 0.25 / 4, 0.3 - 0.25 / 2, 0.3 - 0.25 * 3 / 4, 0.05, 0.05]


def _masked_share(batch: dict) -> float:
  return batch["masked_lm_weights"].sum() / (batch["input_mask"] > 0).sum()


@pytest.mark.slow  # A pipeline's batches; the rate per batch is test_a_batchs_rate_follows_its_phase_...
def test_the_masking_rate_follows_its_schedule_batch_by_batch_over_the_same_rows(pipeline_corpus, data_config):
  """Each batch is masked at the rate of its place in the stream (constant phases, a linear decay, the last rate
  after), over the rows of the stream without a schedule; a batch at the selection rate is that stream's, bitwise;
  a dropped prediction leaves its original token (no [MASK] without a prediction)."""
  scheduled = next_batches(corpus_source(pipeline_corpus, data_config, **PIPELINE_SCHEDULE), len(RATES))
  at_30 = next_batches(corpus_source(pipeline_corpus, data_config, masked_lm_prob=0.3, max_predictions_per_seq=40), 10)
  for b, (batch, plain, rate) in enumerate(zip(scheduled, at_30, RATES, strict=True)):
    assert batch.keys() == plain.keys()  # The thresholds stay in the pipeline.
    assert _masked_share(batch) == pytest.approx(rate, abs=0.005), b
    np.testing.assert_array_equal(unmasked_ids(batch), unmasked_ids(plain))
    if rate == 0.3:
      assert_same_batches([batch], [plain])
    predicted = selected_positions(batch)
    assert not (batch["input_ids"][~predicted] == 4).any(), b  # [MASK] is 4 in conftest.py's vocabulary too.
    assert (batch["input_ids"][~predicted] == unmasked_ids(batch)[~predicted]).all()
  # Packed rows carry each instance's thresholds to the trim.
  packed = dict(pack_instances=True, packing_group=64, max_instances_per_row=4, batch_size=32, **PIPELINE_SCHEDULE)
  rows = next_batches(corpus_source(pipeline_corpus, data_config, **packed), len(RATES))
  plain = next_batches(
    corpus_source(pipeline_corpus, data_config, **dict(packed, masking_phases="", masking_rates=None)), 10
  )
  for b, (batch, untrimmed, rate) in enumerate(zip(rows, plain, RATES, strict=True)):
    assert _masked_share(batch) == pytest.approx(rate, abs=0.01), b
    np.testing.assert_array_equal(unmasked_ids(batch), unmasked_ids(untrimmed))
    assert not (batch["input_ids"][~selected_positions(batch)] == 4).any(), b


def test_evaluation_masks_at_its_own_rate_over_the_same_held_out_rows(pipeline_corpus, tmp_path):
  """data.eval_masked_lm_prob: evaluation masks at its rate whatever the training rate (ModernBERT trains at 30% and
  evaluates at 15%), over the same held-out rows; 0 evaluates at the training rate, as before the key existed."""
  import os

  from bert_jax.data.corpus import Corpus
  from bert_jax.model.bert_config import BertConfig
  from configs import tiny

  prepared, manifest, tokenizer = pipeline_corpus
  assert manifest["eval_documents"] >= 2  # Evaluation reads the held-out split, not a sample of the training one.

  def corpus(masked_lm_prob, eval_masked_lm_prob, masking_phases=""):
    config = tiny.get_config()
    config.tokenizer.update(kind="wordpiece", path=os.path.join(os.path.dirname(prepared), "vocab.txt"))
    config.data.update(
      embedded_corpus="", prepared_dir=prepared, max_seq_length=PIPELINE_SEQ, max_predictions_per_seq=40
    )
    config.data.update(shuffle_buffer=100, num_readers=1, masked_lm_prob=masked_lm_prob)
    config.data.update(eval_masked_lm_prob=eval_masked_lm_prob, masking_phases=masking_phases)
    config.update(batch_size=16)
    model = BertConfig(vocab_size=tokenizer.vocab_size, max_position_embeddings=PIPELINE_SEQ)
    return Corpus(config, str(tmp_path), model, tokenizer)

  def evaluation(*keys):
    return next_batches(corpus(*keys).source(0, evaluation=True), 3)

  def unmasked(batches):  # The rows' tokens before masking.
    rows = []
    for batch in batches:
      tokens, weighted = batch["input_ids"].copy(), batch["masked_lm_weights"] > 0
      row = np.arange(len(tokens))[:, None].repeat(weighted.shape[1], 1)
      tokens[row[weighted], batch["masked_lm_positions"][weighted]] = batch["masked_lm_ids"][weighted]
      rows.append(tokens)
    return np.concatenate(rows)

  def masked_share(batches):
    return sum(b["masked_lm_weights"].sum() for b in batches) / sum(b["input_mask"].sum() for b in batches)

  at_15 = evaluation(0.15, 0.15)
  assert_same_batches(evaluation(0.3, 0.15), at_15)  # Training at 30%, evaluating at 15%: the same batches,
  assert_same_batches(evaluation(0.15, 0.0), at_15)  # as evaluating at the training rate of 15% (0: today's).
  at_30 = evaluation(0.3, 0.0)  # At the training rate of 30%: the same rows, twice the masks.
  np.testing.assert_array_equal(unmasked(at_30), unmasked(at_15))
  assert masked_share(at_15) == pytest.approx(0.15, abs=0.01) and masked_share(at_30) == pytest.approx(0.3, abs=0.01)
  # A masking-rate schedule is training's: evaluation masks as without it, while training follows it.
  assert_same_batches(evaluation(0.3, 0.15, "0: 0.1"), at_15)
  assert_same_batches(evaluation(0.3, 0.0, "0: 0.1"), at_30)
  training = next_batches(corpus(0.3, 0.15, "0: 0.1").source(0), 3)
  assert masked_share(training) == pytest.approx(0.1, abs=0.01)
