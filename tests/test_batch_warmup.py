"""The batch-size warmup's schedule: each step's rows against its formula, the rows and tokens before every step, and
the step counts that ModernBERT's configs take from it."""

import itertools

import pytest

from bert_jax.data.batch_warmup import BatchSchedule
from configs import modernbert_base, modernbert_large, modernbert_tiny, tiny


def test_each_step_reads_its_size_by_the_formula_and_the_rows_before_it_add_up():
  # 4 sizes (8, 16, 24, 32); the three below 32 read 10,000 tokens at 16 per row: 625 rows in 8 + 16 + 24 = 48-row
  # rounds of one step each, so 14 rounds (672 rows; 13 read only 624), 14 steps at each size.
  schedule = BatchSchedule.warmup(batch_size=32, start=8, tokens=10_000, seq_length=16)
  assert schedule.steps_per_size == 14 and schedule.warmup_steps == 42 and schedule.sizes == (8, 16, 24, 32)
  expected = [8 * min(4, 1 + (step - 1) // 14) for step in range(1, 60)]  # start x (1 + (step - 1) // steps each).
  assert [schedule.size(step) for step in range(1, 60)] == expected
  assert expected[:15] == [8] * 14 + [16] and expected[41:43] == [24, 32]
  assert [schedule.rows_through(step) for step in range(60)] == [0, *itertools.accumulate(expected)]
  assert schedule.tokens_through(42) == 672 * 16 >= 10_000 > 624 * 16  # Whole rounds: at least the tokens asked for.
  assert schedule.tokens_through(43) == (672 + 32) * 16
  for tokens in (1, 8 * 16, 8 * 16 + 1, 10_000, 10**6):  # The first step whose end reaches the tokens.
    step = schedule.step_reaching(tokens)
    assert schedule.tokens_through(step) >= tokens > schedule.tokens_through(step - 1)


def test_without_a_warmup_every_step_reads_the_batch():
  schedule = BatchSchedule.of(tiny.get_config())
  assert not schedule.warms_up and schedule.sizes == (32,) and schedule.start == 32 and schedule.warmup_steps == 0
  assert [schedule.size(step) for step in (1, 2, 1000)] == [32, 32, 32]
  assert schedule.rows_through(7) == 7 * 32 and schedule.tokens_through(7) == 7 * 32 * 64
  assert schedule.step_reaching(7 * 32 * 64) == 7 and schedule.step_reaching(7 * 32 * 64 + 1) == 8
  assert not BatchSchedule.of(modernbert_tiny.get_config()).warms_up


@pytest.mark.parametrize(
  "module, start, batch, tokens, learning_rate_warmup, length",
  [(modernbert_base, 768, 4608, 50e9, 3e9, 1_719e9), (modernbert_large, 448, 4928, 10e9, 2e9, 900e9)],
  ids=["base", "large"],
)
def test_modernberts_configs_grow_their_batch_over_the_training_codes_tokens(
  module, start, batch, tokens, learning_rate_warmup, length
):
  """The training code's sizes (its microbatch on each of 8 GPUs, one more at a time) over its tokens; the learning
  rate's warmup and the run's length, given in tokens, as the steps that read them under the warmup."""
  config = module.get_config()
  schedule = BatchSchedule.of(config)
  assert schedule.sizes == tuple(range(start, batch + 1, start))
  warmup = schedule.warmup_steps
  one_step_of_each = sum(schedule.sizes[:-1]) * 1024
  assert tokens <= schedule.tokens_through(warmup) < tokens + one_step_of_each
  assert schedule.size(warmup) == batch - start and schedule.size(warmup + 1) == batch
  for steps, read in ((config.warmup_steps, learning_rate_warmup), (config.num_train_steps, length)):
    assert schedule.tokens_through(steps) >= read > schedule.tokens_through(steps - 1)
