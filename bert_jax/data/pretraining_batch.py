"""The pretraining batch contract shared by every data source and the train step.

Feature names are the original BERT's. Shapes are per example; a batch adds a leading batch axis. Packed rows
(`data/packing.py`, `max_instances` > 0) hold several instances: `input_mask` is each token's instance number,
`position_ids` restart per instance, and the next-sentence features are one per instance slot. SpanBERT's
span-boundary objective reads its spans from `masked_lm_positions` (the runs of consecutive masked positions,
`train/objectives/span_boundary.py`), so spans add no feature.
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


def max_instances(data) -> int:
  """Instance slots per row of the batches `data` (`config.data`) makes: 0 for unpacked rows."""
  return data.max_instances_per_row if data.pack_instances else 0


def pretraining_shapes(batch_size: int, max_seq_length: int, max_predictions_per_seq: int, max_instances: int = 0):
  """Feature name -> (shape with the batch axis, dtype); packed rows with `max_instances` > 0."""
  shapes = {
    name: ((batch_size, *shape(max_seq_length, max_predictions_per_seq)), dtype)
    for name, (shape, dtype) in PRETRAINING_FEATURES.items()
  }
  if max_instances:
    shapes.update(
      position_ids=((batch_size, max_seq_length), np.int32),
      next_sentence_labels=((batch_size, max_instances), np.int32),
      next_sentence_weights=((batch_size, max_instances), np.float32),
      cls_positions=((batch_size, max_instances), np.int32),
    )
  return shapes


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
  max_instances: int = 0,
) -> None:
  """Raises ValueError naming the feature, index and value of the first problem in a host batch (packed rows with
  `max_instances` > 0)."""
  expected = pretraining_shapes(batch_size, max_seq_length, max_predictions_per_seq, max_instances)
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
    _range_error("input_mask", batch["input_mask"], 0, max(max_instances, 1) + 1),
    _range_error("next_sentence_labels", batch["next_sentence_labels"], 0, 2),
  ]
  if max_instances:
    errors += [
      _range_error("position_ids", batch["position_ids"], 0, max_seq_length),
      _range_error("cls_positions", batch["cls_positions"], 0, max_seq_length),
    ]
  errors = [error for error in errors if error]
  if errors:
    raise ValueError(
      "Bad pretraining batch (ids must be below model.vocab_size="
      f"{vocab_size}, segment ids below model.type_vocab_size={type_vocab_size}): " + "; ".join(errors)
    )
