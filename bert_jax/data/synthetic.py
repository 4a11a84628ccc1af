"""A deterministic synthetic pretraining source: random tokens in the real feature layout.

For benchmarks and smoke runs, where what matters is the shape of the work, not the text. Each example is
a pure function of (seed, example index): a restart, or a different number of hosts, sees the same stream.
Sequences have random lengths (so padding and `input_mask` are exercised), two segments (both segment id 0 for a
model with one token type, as RoBERTa), and up to
`max_predictions_per_seq` masked positions among the real non-special tokens.
"""

import numpy as np

from bert_jax.data.pretraining_batch import pretraining_shapes

# Ids below this are reserved for special tokens ([PAD]=0, [UNK], [CLS], [SEP], [MASK]) and never sampled.
FIRST_WORD_ID = 5
CLS_ID, SEP_ID, MASK_ID = 2, 3, 4


def synthetic_example(
  seed: int, index: int, max_seq_length: int, max_predictions_per_seq: int, vocab_size: int, type_vocab_size: int = 2
) -> dict:
  """One example; `index` is its position in the stream."""
  rng = np.random.default_rng([seed, index])
  length = int(rng.integers(max(8, max_seq_length // 2), max_seq_length + 1))
  split = int(rng.integers(2, length - 2))  # [CLS] a.. [SEP] b.. [SEP]
  input_ids = np.zeros(max_seq_length, np.int32)
  input_ids[:length] = rng.integers(FIRST_WORD_ID, vocab_size, length)
  input_ids[[0, split, length - 1]] = CLS_ID, SEP_ID, SEP_ID
  segment_ids = np.zeros(max_seq_length, np.int32)
  segment_ids[split + 1 : length] = min(1, type_vocab_size - 1)
  input_mask = (np.arange(max_seq_length) < length).astype(np.int32)

  candidates = np.setdiff1d(np.arange(1, length - 1), [split])
  num_predictions = min(max_predictions_per_seq, max(1, round(0.15 * length)), len(candidates))
  positions = np.sort(rng.choice(candidates, num_predictions, replace=False))
  masked_lm_positions = np.zeros(max_predictions_per_seq, np.int32)
  masked_lm_ids = np.zeros(max_predictions_per_seq, np.int32)
  masked_lm_weights = np.zeros(max_predictions_per_seq, np.float32)
  masked_lm_positions[:num_predictions] = positions
  masked_lm_ids[:num_predictions] = input_ids[positions]
  masked_lm_weights[:num_predictions] = 1.0
  input_ids[positions] = MASK_ID
  return dict(
    input_ids=input_ids,
    input_mask=input_mask,
    segment_ids=segment_ids,
    masked_lm_positions=masked_lm_positions,
    masked_lm_ids=masked_lm_ids,
    masked_lm_weights=masked_lm_weights,
    next_sentence_labels=np.int32(rng.integers(0, 2)),
  )


class SyntheticSource:
  """Host batches of synthetic examples, resumable from any example position.

  Host `process_index` of `process_count` takes the contiguous slice of each global batch that
  `jax.make_array_from_process_local_data` expects from it. `next` gives a batch of `global_batch_size`, `take` one of
  any size the hosts divide (a batch-size warmup's steps).
  """

  def __init__(
    self,
    *,
    seed: int,
    global_batch_size: int,
    max_seq_length: int,
    max_predictions_per_seq: int,
    vocab_size: int,
    type_vocab_size: int = 2,
    process_index: int = 0,
    process_count: int = 1,
    start_example: int = 0,
  ):
    if global_batch_size % process_count:
      raise ValueError(f"Global batch size {global_batch_size} does not split over {process_count} hosts.")
    self._seed, self._vocab_size, self._type_vocab_size = seed, vocab_size, type_vocab_size
    self._seq, self._pred = max_seq_length, max_predictions_per_seq
    self._global_batch = global_batch_size
    self._process_index, self._process_count = process_index, process_count
    self.position = start_example  # Examples of the global stream consumed so far: the data position.

  def save_state(self, state_dir: str) -> None:
    """Nothing to save: the position alone (in the checkpoint) determines the stream."""

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    return self.take(self._global_batch)

  def take(self, rows: int) -> dict:
    """This host's part of the next `rows` examples of the global stream."""
    if rows % self._process_count:
      raise ValueError(f"A batch of {rows} does not split over {self._process_count} hosts.")
    host_batch = rows // self._process_count
    first = self.position + self._process_index * host_batch
    examples = [
      synthetic_example(self._seed, first + i, self._seq, self._pred, self._vocab_size, self._type_vocab_size)
      for i in range(host_batch)
    ]
    self.position += rows
    shapes = pretraining_shapes(host_batch, self._seq, self._pred)
    return {
      name: np.stack([e[name] for e in examples]).astype(dtype).reshape(shape)
      for name, (shape, dtype) in shapes.items()
    }
