import numpy as np

from bert_jax.data.pretraining_batch import check_pretraining_batch
from bert_jax.data.synthetic import CLS_ID, MASK_ID, SEP_ID, SyntheticSource


def _source(**overrides):
  args = dict(seed=3, global_batch_size=8, max_seq_length=32, max_predictions_per_seq=5, vocab_size=50)
  return SyntheticSource(**(args | overrides))


def test_batches_follow_the_contract_and_mask_real_tokens():
  batch = next(_source())
  check_pretraining_batch(
    batch, batch_size=8, max_seq_length=32, max_predictions_per_seq=5, vocab_size=50, type_vocab_size=2
  )
  assert (batch["input_ids"][:, 0] == CLS_ID).all()
  for row in range(8):
    real = batch["masked_lm_weights"][row] > 0
    positions = batch["masked_lm_positions"][row][real]
    assert (batch["input_ids"][row][positions] == MASK_ID).all()
    assert not np.isin(batch["masked_lm_ids"][row][real], [0, CLS_ID, SEP_ID, MASK_ID]).any()
    assert (batch["input_mask"][row][positions] == 1).all()


def test_stream_is_deterministic_and_resumable():
  a, b = _source(), _source()
  first = [next(a) for _ in range(3)]
  second = [next(b) for _ in range(3)]
  for x, y in zip(first, second, strict=True):
    for name in x:
      np.testing.assert_array_equal(x[name], y[name])
  resumed = next(_source(start_example=2 * 8))
  for name in resumed:
    np.testing.assert_array_equal(resumed[name], first[2][name])
  other_seed = next(_source(seed=4))
  assert not np.array_equal(other_seed["input_ids"], first[0]["input_ids"])


def test_hosts_take_consecutive_slices_of_the_global_batch():
  whole = next(_source())
  parts = [next(_source(process_index=i, process_count=2)) for i in range(2)]
  for name in whole:
    np.testing.assert_array_equal(np.concatenate([p[name] for p in parts]), whole[name])


def test_a_batch_of_any_size_is_the_streams_next_examples_split_over_the_hosts():
  """A batch-size warmup's steps: `take(rows)` gives the next `rows` examples, whatever the source's batch."""
  source = _source()
  whole = [next(source) for _ in range(3)]  # Examples 0-23 in batches of 8.
  hosts = [_source(process_index=i, process_count=2) for i in range(2)]
  taken = [[host.take(rows) for rows in (4, 12, 8)] for host in hosts]  # Examples 0-3, 4-15 and 16-23.
  assert [host.position for host in hosts] == [24, 24]
  for name in whole[0]:
    stream = np.concatenate([batch[name] for batch in whole])
    for step, (first, rows) in enumerate([(0, 4), (4, 12), (16, 8)]):
      joined = np.concatenate([taken[i][step][name] for i in range(2)])
      np.testing.assert_array_equal(joined, stream[first : first + rows])
