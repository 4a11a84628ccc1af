"""The pretraining input pipeline: prepared shards -> NSP pairs -> 80/10/10 masks -> host batches, all in tf.data.

Per host: its own slice of the shard files (`files[process_index::process_count]`), in an order shuffled per
epoch, read with a deterministic interleave. Each document becomes next-sentence-prediction instances exactly
as `create_pretraining_data.py` of the original BERT builds them (see `document_instances`); instances are
shuffled in a buffer, masked (`masking.py`) and batched. Every random choice is a stateless function of
(seed, epoch, document) or of (seed, epoch, document, instance): the same document yields the same pairs and
masks on any number of hosts and after any restart.
"""

import os

import tensorflow as tf

from bert_jax.data.masking import mask_tokens

# Salts that keep the random streams of different decisions apart.
_SHARD_ORDER, _PARTNER, _DOCUMENT = 1, 2, 3


def _seed(*parts) -> tf.Tensor:
  """A [2] int64 stateless seed from integers (python or scalar tensors). Callers put their salt first:
  `stateless_fold_in` keeps the last value as the second word, so a salt last could equal a data value."""
  seed = tf.constant([0x5EED, 0], tf.int64)
  for part in parts:
    seed = tf.random.experimental.stateless_fold_in(seed, tf.cast(part, tf.int64))
  return seed


def _randint(seed, low, high) -> tf.Tensor:
  """Uniform int in [low, high] (inclusive, as Python's random.randint)."""
  return tf.random.stateless_uniform([], seed, minval=low, maxval=high + 1, dtype=tf.int32)


def _truncated_lengths(len_a, len_b, max_tokens):
  """Lengths after BERT's `truncate_seq_pair`: trim the longer side (the second on ties) one token at a time."""
  excess = tf.maximum(len_a + len_b - max_tokens, 0)
  diff = tf.abs(len_a - len_b)
  from_longer = tf.minimum(excess, diff)
  rest = excess - from_longer
  cut_a = tf.where(len_a > len_b, from_longer, 0) + rest // 2
  cut_b = tf.where(len_a > len_b, 0, from_longer) + rest - rest // 2
  return len_a - cut_a, len_b - cut_b


def document_instances(
  token_ids,
  sentence_lengths,
  partner_ids,
  partner_lengths,
  seed,
  *,
  max_seq_length,
  short_seq_prob,
  special,
  next_sentence_prediction=True,
):
  """One document -> its NSP instances, as BERT's `create_instances_from_document`.

  token_ids [T], sentence_lengths [S] (this document); partner_* (another document, for random next
  sentences); seed [2]. Returns input_ids, segment_ids, input_mask [n, max_seq_length] int32 and
  next_sentence_labels [n] (1 = B is a random next sentence). Without next-sentence prediction (RoBERTa's
  full sentences), each instance is `[CLS] sentences... [SEP]` from one chunk, labelled 0.
  """
  nsp = next_sentence_prediction
  max_tokens = max_seq_length - (3 if nsp else 2)  # [CLS] A [SEP] B [SEP], or [CLS] A [SEP]
  splits = tf.concat([[0], tf.cumsum(sentence_lengths)], 0)
  partner_splits = tf.concat([[0], tf.cumsum(partner_lengths)], 0)
  num_sentences = tf.shape(sentence_lengths)[0]
  num_partner = tf.shape(partner_lengths)[0]
  seeds = tf.random.experimental.stateless_split(seed, num=2)
  target = tf.where(
    tf.random.stateless_uniform([], seeds[0]) < short_seq_prob, _randint(seeds[1], 2, max_tokens), max_tokens
  )

  def build(i, chunk_start, n, arrays):
    chunk = i - chunk_start + 1
    # One draw per instance, keyed by (document seed, instance number): uniform integers are floor(u * range).
    # (Keys [s0 + 1, ...] and [s0 + 2, ...]: instance k's masks use [s0, s1 + k + 1], see pretraining_dataset.)
    key = seed + tf.stack([tf.constant(1, tf.int64), tf.cast(n, tf.int64) + 1])
    u = tf.random.stateless_uniform([3], key)
    if nsp:
      a_end = tf.where(chunk < 2, 1, 1 + tf.cast(u[0] * tf.cast(chunk - 1, tf.float32), tf.int32))
      is_random = (chunk == 1) | (u[1] < 0.5)
    else:  # The whole chunk is A; B is empty.
      a_end, is_random = chunk, tf.constant(False)
    a_lo, a_hi = splits[chunk_start], splits[chunk_start + a_end]
    # Random next: sentences of the partner from a random start until target_b tokens.
    target_b = target - (a_hi - a_lo)
    start = tf.minimum(tf.cast(u[2] * tf.cast(num_partner, tf.float32), tf.int32), num_partner - 1)
    ends = partner_splits[start + 1 :] - partner_splits[start]
    last = start + tf.minimum(tf.reduce_sum(tf.cast(ends < target_b, tf.int32)), num_partner - 1 - start)
    b_lo = tf.where(is_random, partner_splits[start], splits[chunk_start + a_end])
    b_hi = tf.where(is_random, partner_splits[last + 1], splits[i + 1])
    next_i = tf.where(is_random, i - (chunk - a_end), i)  # Random next: unused sentences go back.

    len_a, len_b = _truncated_lengths(a_hi - a_lo, b_hi - b_lo, max_tokens)
    # Each trimmed token comes off the front or the back with equal chance.
    trimmed = tf.cast(tf.stack([a_hi - a_lo - len_a, b_hi - b_lo - len_b]), tf.float32)
    front_a, front_b = tf.unstack(tf.cast(tf.random.stateless_binomial([2], key + [1, 0], trimmed, 0.5), tf.int32))
    tokens_a = token_ids[a_lo + front_a : a_lo + front_a + len_a]
    source_b = tf.cond(is_random, lambda: partner_ids, lambda: token_ids)
    tokens_b = source_b[b_lo + front_b : b_lo + front_b + len_b]
    cls, sep = special
    if nsp:
      ids = tf.concat([[cls], tokens_a, [sep], tokens_b, [sep]], 0)
      segments = tf.concat([tf.zeros([len_a + 2], tf.int32), tf.ones([len_b + 1], tf.int32)], 0)
    else:
      ids = tf.concat([[cls], tokens_a, [sep]], 0)
      segments = tf.zeros([len_a + 2], tf.int32)
    length = tf.shape(ids)[0]
    pad = [[0, max_seq_length - length]]
    row = (
      tf.pad(ids, pad),
      tf.pad(segments, pad),
      tf.pad(tf.ones([length], tf.int32), pad),
      tf.cast(is_random, tf.int32),
    )
    arrays = tuple(array.write(n, value) for array, value in zip(arrays, row, strict=True))
    return next_i, arrays

  def body(chunk_start, n, arrays):
    # The chunk ends at the first sentence that brings it to `target` tokens, or at the document's end
    # (BERT accumulates sentence by sentence; a search finds the same sentence in one step).
    reach = tf.searchsorted(splits, splits[chunk_start : chunk_start + 1] + target, side="left")[0] - 1
    i = tf.clip_by_value(reach, chunk_start, num_sentences - 1)
    next_i, arrays = build(i, chunk_start, n, arrays)
    return next_i + 1, n + 1, arrays

  arrays = tuple(
    tf.TensorArray(tf.int32, size=0, dynamic_size=True, element_shape=shape)
    for shape in ([max_seq_length], [max_seq_length], [max_seq_length], [])
  )
  _, _, arrays = tf.while_loop(lambda start, *_: start < num_sentences, body, (0, 0, arrays))
  input_ids, segment_ids, input_mask, labels = (array.stack() for array in arrays)
  return dict(input_ids=input_ids, segment_ids=segment_ids, input_mask=input_mask, next_sentence_labels=labels)


def _parse(record):
  features = tf.io.parse_single_example(
    record, {"token_ids": tf.io.VarLenFeature(tf.int64), "sentence_lengths": tf.io.VarLenFeature(tf.int64)}
  )
  return (
    tf.cast(tf.sparse.to_dense(features["token_ids"]), tf.int32),
    tf.cast(tf.sparse.to_dense(features["sentence_lengths"]), tf.int32),
  )


def host_files(prepared_dir: str, manifest: dict, process_index: int, process_count: int) -> list[tuple]:
  """(global shard index, path, documents) of this host's shards."""
  shards = [
    (index, os.path.join(prepared_dir, s["file"]), s["documents"]) for index, s in enumerate(manifest["shards"])
  ]
  if len(shards) < process_count:
    raise ValueError(
      f"{prepared_dir} has {len(shards)} shard file(s) for {process_count} hosts; every host needs at "
      f"least one: prepare the corpus into at least {process_count} shards."
    )
  return shards[process_index::process_count]


def pretraining_dataset(
  prepared_dir: str,
  manifest: dict,
  tokenizer,
  *,
  seed: int,
  batch_size: int,
  max_seq_length: int,
  max_predictions_per_seq: int,
  masked_lm_prob: float,
  short_seq_prob: float,
  whole_word_masking: bool,
  next_sentence_prediction: bool = True,
  process_index: int = 0,
  process_count: int = 1,
  shuffle_buffer: int = 10_000,
  cycle_length: int = 8,
) -> tf.data.Dataset:
  """This host's infinite stream of pretraining batches (numpy-ready dicts with BERT's feature names).

  `tokenizer` (bert_jax.tokenizer) gives the special ids, the word starts and the vocabulary size.
  """
  shards = host_files(prepared_dir, manifest, process_index, process_count)
  indices = tf.constant([s[0] for s in shards], tf.int64)
  special = (tokenizer.cls_id, tokenizer.sep_id)
  # Every shard of the corpus, for partner documents (any host may read any shard).
  all_paths = tf.constant([os.path.join(prepared_dir, s["file"]) for s in manifest["shards"]])
  all_counts = tf.constant([s["documents"] for s in manifest["shards"]], tf.int64)
  all_indices = tf.range(len(manifest["shards"]), dtype=tf.int64)
  if not sum(s[2] for s in shards):
    raise ValueError(f"Host {process_index}'s shards of {prepared_dir} hold no documents.")
  if sum(s["documents"] for s in manifest["shards"]) < 2:
    raise ValueError(f"{prepared_dir} holds fewer than 2 documents: next-sentence pairs need random documents.")

  def shard_documents(epoch, position):
    shard = indices[position]
    count = all_counts[shard]
    documents = tf.data.TFRecordDataset(all_paths[shard]).map(_parse)
    # Random next sentences come from a partner stream: the documents of another shard (chosen per shard and
    # epoch) from a random document on; in a one-shard corpus, the same shard shifted by at least one.
    others = tf.boolean_mask(all_indices, (all_counts > 0) & (all_indices != shard))
    keys = tf.random.stateless_uniform([2], _seed(_PARTNER, seed, epoch, shard))
    num_others = tf.shape(others, out_type=tf.int64)[0]
    partner_shard = tf.cond(
      num_others > 0,
      lambda: others[tf.minimum(tf.cast(keys[0] * tf.cast(num_others, tf.float32), tf.int64), num_others - 1)],
      lambda: shard,
    )
    partner_count = all_counts[partner_shard]
    first = tf.cast(keys[1] * tf.cast(partner_count, tf.float32), tf.int64)
    first = tf.where(partner_shard == shard, 1 + first % tf.maximum(partner_count - 1, 1), first % partner_count)
    partners = tf.data.TFRecordDataset(all_paths[partner_shard]).map(_parse).repeat().skip(first)
    return tf.data.Dataset.zip(tf.data.Dataset.range(count), documents, partners).map(
      lambda index, doc, partner: (epoch, shard, index, doc, partner)
    )

  def epoch_documents(epoch):
    order = tf.random.experimental.stateless_shuffle(
      tf.range(len(shards), dtype=tf.int64), _seed(_SHARD_ORDER, seed, epoch)
    )
    return tf.data.Dataset.from_tensor_slices(order).interleave(
      lambda position: shard_documents(epoch, position),
      cycle_length=min(cycle_length, len(shards)),
      block_length=1,
      num_parallel_calls=tf.data.AUTOTUNE,
      deterministic=True,
    )

  def instances(epoch, shard, index, document, partner):
    doc_seed = _seed(_DOCUMENT, seed, epoch, shard, index)
    out = document_instances(
      *document,
      *partner,
      doc_seed,
      max_seq_length=max_seq_length,
      short_seq_prob=short_seq_prob,
      special=special,
      next_sentence_prediction=next_sentence_prediction,
    )
    # Instance k of the document masks with key (doc_seed[0], doc_seed[1] + k + 1): a distinct Philox key.
    k = tf.range(1, tf.shape(out["next_sentence_labels"])[0] + 1, dtype=tf.int64)
    out["mask_seed"] = tf.stack([tf.fill(tf.shape(k), doc_seed[0]), doc_seed[1] + k], axis=1)
    return out

  def mask(example):
    masked = mask_tokens(
      example["input_ids"],
      example["input_mask"],
      example["mask_seed"],
      special_ids=[tokenizer.pad_id, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id],
      word_start=tokenizer.word_start,
      vocab_size=tokenizer.vocab_size,
      mask_id=tokenizer.mask_id,
      masked_lm_prob=masked_lm_prob,
      max_predictions_per_seq=max_predictions_per_seq,
      whole_word=whole_word_masking,
    )
    return dict(
      input_mask=example["input_mask"],
      segment_ids=example["segment_ids"],
      next_sentence_labels=example["next_sentence_labels"],
      **masked,
    )

  options = tf.data.Options()
  options.deterministic = True
  dataset = tf.data.Dataset.range(2**62).flat_map(epoch_documents)  # Epochs 0, 1, 2, ...
  dataset = dataset.map(instances, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).unbatch()
  dataset = dataset.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=False)
  dataset = dataset.map(mask, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  dataset = dataset.batch(batch_size, drop_remainder=True, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  return dataset.prefetch(tf.data.AUTOTUNE).with_options(options)
