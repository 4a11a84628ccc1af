"""RoBERTa's FULL-SENTENCES rows (Liu et al. 2019, section 4.2), in tf.data: `data.instances="full_sentences"`.

Each row is filled with whole sentences read on in the reader's document order, across document boundaries, with a
[SEP] between two documents inside a row: `[CLS] sentences of d1 [SEP] sentences of d2 [SEP]`. A sentence that does
not fit closes the row; there are no short targets and no random choices, so the rows are a function of the
document stream alone. A sentence longer than a row's room (`max_seq_length - 2` tokens) is cut: it goes on from
the partly filled row, fills rows, and its rest starts the next one; no text is dropped. Segment ids and labels are
0 (no sentence task).

The partly filled row is carried from document to document (and on into the next epoch) by
`tf.data.Dataset.scan`, whose state is part of tf.data's iterator checkpoint: a saved pipeline state resumes
mid-row, and the replay of the deterministic stream rebuilds it.
"""

import functools

from bert_jax.tensorflow_cpu import tf


def document_rows(buffer, fill, token_ids, sentence_lengths, *, max_seq_length: int, special: tuple):
  """One document's sentences after the carried row `buffer[:fill]` (buffer [max_seq_length - 2]).

  token_ids [T], sentence_lengths [S]; special: the ids of [CLS], [SEP] and [PAD]. Returns the carried row after
  this document (buffer, fill) and the rows it closed: input_ids, segment_ids, input_mask [n, max_seq_length],
  next_sentence_labels [n].
  """
  cls, sep, pad = special
  room = max_seq_length - 2
  splits = tf.concat([[0], tf.cumsum(sentence_lengths)], 0)

  def close(rows, n, body):
    """`rows` with `[CLS] body [SEP]` (padded) written at n."""
    ids = tf.concat([[cls], body, [sep]], 0)
    return rows.write(n, tf.pad(ids, [[0, max_seq_length - tf.shape(ids)[0]]], constant_values=pad)), n + 1

  def step(s, buffer, fill, rows, n):
    sentence = token_ids[splits[s] : splits[s + 1]]
    carried = buffer[:fill]
    separator = tf.fill([tf.cast((s == 0) & (fill > 0), tf.int32)], sep)  # The document's first sentence.
    joined = tf.concat([carried, separator, sentence], 0)

    def append():
      return joined, rows, n

    def close_and_start():
      # A sentence longer than the room is cut anyway: it goes on from the carried row, filling rows, and the rest
      # (1 .. room tokens) is carried. Another closes the carried row and is carried whole.
      long = tf.shape(sentence)[0] > room
      text = tf.cond(long, lambda: joined, lambda: sentence)
      rows_, n_ = tf.cond(~long & (fill > 0), lambda: close(rows, n, carried), lambda: (rows, n))
      pieces = tf.maximum((tf.shape(text)[0] - 1) // room, 0)
      full = tf.reshape(text[: pieces * room], [pieces, room])
      full = tf.concat([tf.fill([pieces, 1], cls), full, tf.fill([pieces, 1], sep)], 1)
      rows_ = rows_.scatter(tf.range(n_, n_ + pieces), full)
      return text[pieces * room :], rows_, n_ + pieces

    body, rows, n = tf.cond(tf.shape(joined)[0] <= room, append, close_and_start)
    fill = tf.shape(body)[0]
    return s + 1, tf.reshape(tf.pad(body, [[0, room - fill]]), [room]), fill, rows, n

  rows = tf.TensorArray(tf.int32, size=0, dynamic_size=True, element_shape=[max_seq_length])
  _, buffer, fill, rows, n = tf.while_loop(
    lambda s, *_: s < tf.shape(sentence_lengths)[0], step, (0, buffer, fill, rows, 0)
  )
  input_ids = tf.reshape(rows.stack(), [n, max_seq_length])
  # A row is real up to its last [SEP] (padding holds none).
  positions = tf.range(max_seq_length)[None, :]
  input_mask = tf.cast(positions <= tf.reduce_max(tf.where(input_ids == sep, positions, -1), 1)[:, None], tf.int32)
  return (buffer, fill), dict(
    input_ids=input_ids,
    segment_ids=tf.zeros_like(input_ids),
    input_mask=input_mask,
    next_sentence_labels=tf.zeros([n], tf.int32),
  )


@functools.cache
def _rows_function(max_seq_length: int, special: tuple):
  """`document_rows` for these settings as one tf.function (traced once for all readers)."""
  return tf.function(functools.partial(document_rows, max_seq_length=max_seq_length, special=special), autograph=False)


def full_sentence_rows(documents: tf.data.Dataset, *, max_seq_length: int, special: tuple) -> tf.data.Dataset:
  """A reader's document stream (`pipeline._epoch_documents`' elements: epoch, shard, index, (tokens, sentence
  lengths), partner) -> (epoch, shard, index, rows): the rows that each document closed (`document_rows`; often
  none), in stream order."""
  rows_of = _rows_function(max_seq_length, special)

  def step(state, element):
    epoch, shard, index, (token_ids, sentence_lengths), _ = element
    state, rows = rows_of(*state, token_ids, sentence_lengths)
    return state, (epoch, shard, index, rows)

  return documents.scan((tf.zeros([max_seq_length - 2], tf.int32), tf.constant(0)), step)
