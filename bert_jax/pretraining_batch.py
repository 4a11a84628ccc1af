"""The pretraining batch contract shared by every data source and the train step.

Feature names are the original BERT's. Shapes are per example; a batch adds a leading batch axis.
`check_pretraining_batch` runs on the host where a batch enters training, so a bad token id is a clear
error on the first step instead of a NaN hours later.
"""

import numpy as np

# name -> (per-example shape as a function of (max_seq_length, max_predictions_per_seq), numpy dtype)
PRETRAINING_FEATURES = {
  "input_ids": (lambda seq, pred: (seq,), np.int32),
  "input_mask": (lambda seq, pred: (seq,), np.int32),
  "segment_ids": (lambda seq, pred: (seq,), np.int32),
  "masked_lm_positions": (lambda seq, pred: (pred,), np.int32),
  "masked_lm_ids": (lambda seq, pred: (pred,), np.int32),
  "masked_lm_weights": (lambda seq, pred: (pred,), np.float32),
  "next_sentence_labels": (lambda seq, pred: (), np.int32),
}


def pretraining_shapes(batch_size: int, max_seq_length: int, max_predictions_per_seq: int) -> dict:
  """Feature name -> (shape with the batch axis, dtype)."""
  return {
    name: ((batch_size, *shape(max_seq_length, max_predictions_per_seq)), dtype)
    for name, (shape, dtype) in PRETRAINING_FEATURES.items()
  }


def _range_error(name: str, values: np.ndarray, low: int, high: int) -> str | None:
  bad = (values < low) | (values >= high)
  if not bad.any():
    return None
  where = tuple(int(i) for i in np.argwhere(bad)[0])
  return f"{name}[{', '.join(map(str, where))}] = {int(values[where])} is outside [{low}, {high})"


def check_pretraining_batch(
  batch: dict,
  *,
  batch_size: int,
  max_seq_length: int,
  max_predictions_per_seq: int,
  vocab_size: int,
  type_vocab_size: int,
) -> None:
  """Raises ValueError naming the feature, index and value of the first problem in a host batch."""
  expected = pretraining_shapes(batch_size, max_seq_length, max_predictions_per_seq)
  missing = sorted(set(expected) - set(batch))
  if missing:
    raise ValueError(f"Pretraining batch lacks features {missing}; it has {sorted(batch)}.")
  for name, (shape, dtype) in expected.items():
    value = batch[name]
    if tuple(value.shape) != shape or value.dtype != dtype:
      raise ValueError(
        f"Pretraining feature {name} has shape {tuple(value.shape)} and dtype {value.dtype}; "
        f"expected {shape} {np.dtype(dtype).name}."
      )
  errors = [
    _range_error("input_ids", batch["input_ids"], 0, vocab_size),
    _range_error("masked_lm_ids", batch["masked_lm_ids"], 0, vocab_size),
    _range_error("segment_ids", batch["segment_ids"], 0, type_vocab_size),
    _range_error("masked_lm_positions", batch["masked_lm_positions"], 0, max_seq_length),
    _range_error("input_mask", batch["input_mask"], 0, 2),
    _range_error("next_sentence_labels", batch["next_sentence_labels"], 0, 2),
  ]
  errors = [error for error in errors if error]
  if errors:
    raise ValueError(
      "Bad pretraining batch (ids must be below model.vocab_size="
      f"{vocab_size}, segment ids below model.type_vocab_size={type_vocab_size}): " + "; ".join(errors)
    )
