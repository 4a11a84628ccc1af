"""Packing NSP instances into rows, in tf.data: several instances share one `max_seq_length` row instead of each
padding its own (on short documents most of a 512-token row is padding).

Instances come in groups of `packing_group` (consecutive, after shuffling and masking); each group is packed by
first-fit decreasing: longest first, each into the first row with room for its tokens, its masked-LM predictions
(at most `max_predictions_per_seq` per row) and one more instance (at most `max_instances_per_row`). A row then
holds its instances one after another, each with its own [CLS], and carries (rows leave a group in a random
order, a stateless function of the seed and the group's place in the stream):

* `input_mask`: 0 for padding, else the instance's number in the row (1, 2, ...): the model attends only within
  an instance (`attention.attention_mask`);
* `position_ids`: positions restarting at 0 for every instance;
* `masked_lm_*`: every instance's predictions, positions shifted to where the instance sits;
* `next_sentence_labels`, `next_sentence_weights`, `cls_positions`: `[max_instances_per_row]`, one per instance
  (weight 0 for empty slots).

The packer is a pure function of its group, so the stream stays a stateless, checkpointable function of the seed.
"""

import functools

from bert_jax.data.masking import NEVER_KEPT
from bert_jax.tensorflow_cpu import tf


def _first_fit_decreasing(lengths, predictions, max_seq_length, max_predictions, max_instances):
  """Row, token offset, prediction offset and slot of every instance of a group: [group] int32 each."""
  group = tf.shape(lengths)[0]
  order = tf.argsort(-lengths, stable=True)

  def place(i, tokens, preds, counts, row, offset, pred_offset, slot):
    instance = order[i]
    length, num_predictions = lengths[instance], predictions[instance]
    fits = (tokens + length <= max_seq_length) & (preds + num_predictions <= max_predictions)
    fits &= counts < max_instances
    first = tf.cast(tf.argmax(tf.cast(fits, tf.int32)), tf.int32)  # A fresh row always fits.
    at = [[instance]]
    row = tf.tensor_scatter_nd_update(row, at, [first])
    offset = tf.tensor_scatter_nd_update(offset, at, [tokens[first]])
    pred_offset = tf.tensor_scatter_nd_update(pred_offset, at, [preds[first]])
    slot = tf.tensor_scatter_nd_update(slot, at, [counts[first]])
    tokens = tf.tensor_scatter_nd_add(tokens, [[first]], [length])
    preds = tf.tensor_scatter_nd_add(preds, [[first]], [num_predictions])
    counts = tf.tensor_scatter_nd_add(counts, [[first]], [1])
    return i + 1, tokens, preds, counts, row, offset, pred_offset, slot

  zeros = tf.zeros([group], tf.int32)
  _, _, _, _, row, offset, pred_offset, slot = tf.while_loop(
    lambda i, *_: i < group, place, (0, zeros, zeros, zeros, zeros, zeros, zeros, zeros)
  )
  return row, offset, pred_offset, slot


def pack_group(instances: dict, *, max_seq_length: int, max_predictions: int, max_instances: int, pad_id: int) -> dict:
  """A group of masked instances ([group, ...] each, BERT's feature names) -> packed rows ([rows, ...]); padding
  holds `pad_id` in input_ids, 0 elsewhere."""
  real = instances["input_mask"] > 0
  lengths = tf.reduce_sum(tf.cast(real, tf.int32), axis=1)
  has_prediction = instances["masked_lm_weights"] > 0
  predictions = tf.reduce_sum(tf.cast(has_prediction, tf.int32), axis=1)
  row, offset, pred_offset, slot = _first_fit_decreasing(
    lengths, predictions, max_seq_length, max_predictions, max_instances
  )
  rows = tf.reduce_max(row) + 1

  # Every real token of instance i moves from (i, t) to (row[i], offset[i] + t).
  token = tf.where(real)  # [tokens, 2]: (instance, t)
  instance, position = tf.cast(token[:, 0], tf.int32), tf.cast(token[:, 1], tf.int32)
  to = tf.stack([tf.gather(row, instance), tf.gather(offset, instance) + position], axis=1)

  def tokens(values, fill=None, pad=0):
    values = tf.gather_nd(instances[values], token) if fill is None else fill
    return tf.tensor_scatter_nd_update(tf.fill([rows, max_seq_length], pad), to, values)

  # Predictions j of instance i move to (row[i], pred_offset[i] + j), their positions shifted by offset[i].
  prediction = tf.where(has_prediction)
  p_instance = tf.cast(prediction[:, 0], tf.int32)
  p_to = tf.stack(
    [tf.gather(row, p_instance), tf.gather(pred_offset, p_instance) + tf.cast(prediction[:, 1], tf.int32)], axis=1
  )

  def predicted(name, shift=0, pad=0):
    values = tf.gather_nd(instances[name], prediction) + shift
    return tf.tensor_scatter_nd_update(tf.fill([rows, max_predictions], tf.cast(pad, values.dtype)), p_to, values)

  slots = tf.stack([row, slot], axis=1)

  def per_instance(values):
    return tf.scatter_nd(slots, values, [rows, max_instances])

  packed = dict(
    input_ids=tokens("input_ids", pad=pad_id),
    segment_ids=tokens("segment_ids"),
    input_mask=tokens(None, fill=tf.gather(slot, instance) + 1),
    position_ids=tokens(None, fill=position),
    masked_lm_positions=predicted("masked_lm_positions", tf.gather(offset, p_instance)),
    masked_lm_ids=predicted("masked_lm_ids"),
    masked_lm_weights=predicted("masked_lm_weights"),
    next_sentence_labels=per_instance(instances["next_sentence_labels"]),
    next_sentence_weights=per_instance(tf.ones_like(row, tf.float32)),
    cls_positions=per_instance(offset),
    **(
      {"documents": _slot_documents(instances["documents"], slots, rows, max_instances)}
      if "documents" in instances
      else {}
    ),
  )
  if "masked_lm_thresholds" in instances:  # A masking-rate schedule's (masking.mask_tokens), with its predictions.
    packed["masked_lm_thresholds"] = predicted("masked_lm_thresholds", pad=NEVER_KEPT)
  return packed


def _slot_documents(documents, slots, rows, max_instances):
  """[rows, max_instances, 3]: each slot's document ids (`pipeline._with_document`), -1 in empty slots."""
  filled = tf.scatter_nd(slots, documents[:, 0, :] + 1, [rows, max_instances, 3])
  return filled - 1


_ROW_ORDER = 4  # A salt apart from the pipeline's own (pipeline.py): the order of a group's rows.


@functools.cache
def _pack_function(seed: int, max_seq_length: int, max_predictions: int, max_instances: int, pad_id: int):
  """`pack_group` for these settings as one tf.function (traced once for all readers), its rows in a random order:
  first-fit decreasing fills them longest instances first, and a batch should not see only one end of a group."""

  def pack(index, group):
    rows = pack_group(
      group, max_seq_length=max_seq_length, max_predictions=max_predictions, max_instances=max_instances, pad_id=pad_id
    )
    seed_of_group = tf.random.experimental.stateless_fold_in(tf.constant([seed, _ROW_ORDER], tf.int64), index)
    order = tf.random.experimental.stateless_shuffle(tf.range(tf.shape(rows["input_ids"])[0]), seed_of_group)
    return {name: tf.gather(value, order) for name, value in rows.items()}

  return tf.function(pack, autograph=False)


def packed(dataset: tf.data.Dataset, data, seed: int, pad_id: int) -> tf.data.Dataset:
  """Masked instances -> packed rows, by the settings of `data` (`config.data`): `packing_group`,
  `max_instances_per_row`, `max_seq_length`, `max_predictions_per_seq`; `seed` orders each group's rows; padding
  holds the tokenizer's `pad_id`."""
  pack = _pack_function(seed, data.max_seq_length, data.max_predictions_per_seq, data.max_instances_per_row, pad_id)
  groups = dataset.batch(data.packing_group, drop_remainder=True).enumerate()
  return groups.map(pack, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).unbatch()
