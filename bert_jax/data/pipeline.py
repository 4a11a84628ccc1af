"""The pretraining input pipeline: prepared shards -> instances -> 80/10/10 masks -> batches, all in tf.data.

The stream is defined over `data.num_readers` virtual readers, whatever the number of hosts: reader r reads its own
units of the corpus (shards `r::num_readers`; with fewer shards than readers, each shard is split into interleaved
stripes of documents), in an order shuffled per epoch, with a deterministic interleave, and makes batches of
`batch_size / num_readers` examples (`batch_size`: a batch-size warmup's first size, whose steps join several, see
`batch_warmup.py`). The global batch of a step is the readers' batches in reader order; hosts divide the readers among
themselves (`host_readers`), so any host count that divides `num_readers` sees the same global stream, and a checkpoint
resumes exactly on another host count.

Each document becomes instances of the kind `data.instances` names: next-sentence-prediction pairs exactly as
`create_pretraining_data.py` of the original BERT builds them, ALBERT's sentence-order pairs or RoBERTa's
DOC-SENTENCES (see `document_instances`), or RoBERTa's FULL-SENTENCES rows, which run on across documents
(`full_sentences.py`); instances are shuffled in a buffer, masked (`masking.py`) and batched. Every random choice
is a stateless function of (seed, epoch, document) or of (seed, epoch, document, instance): the same document
yields the same pairs and masks after any restart.

Stages, in order: `reader_units` (what a reader reads) -> `_unit_documents` / `_epoch_documents` (documents with
their random-next partners) -> `_instances_function` (a document's instances; FULL-SENTENCES:
`full_sentences.full_sentence_rows`) -> shuffle -> `_mask_function` -> packing (`packing.py`, with
`data.pack_instances`) -> batch -> the masking-rate schedule's trim (`data.masking_phases`); `reader_dataset` composes
them.
"""

import contextlib
import functools
import os

from bert_jax.data import full_sentences, mixed, packing
from bert_jax.data.instances import instance_kind
from bert_jax.data.manifest import check_documents
from bert_jax.data.masking import Masking, batch_rate, mask_tokens, trim_to_rate
from bert_jax.data.masking_schedule import MaskingRates
from bert_jax.data.readers import reader_units
from bert_jax.tensorflow_cpu import tf

# Salts that keep the random streams of different decisions apart.
_SHARD_ORDER, _PARTNER, _DOCUMENT = 1, 2, 3


@contextlib.contextmanager
def _global_seed_unset():
  """TensorFlow's global seed (`tf.random.set_seed`) unset while the block builds its ops, and put back after.

  A tf.data op's seed is combined with the global seed when one is set, so a process that seeded TensorFlow (a
  notebook, Keras' `set_random_seed`, transformers' `set_seed`, mteb on import) would shuffle the instances in
  another order: a step's rows would no longer be a function of the run's seed alone, and a resume would not equal
  the run it continues. The block's ops get the seeds they get in a process that never set one."""
  from tensorflow.python.eager import context
  from tensorflow.python.framework import ops

  eager, graph = context.context(), ops.get_default_graph()
  saved = eager._seed, graph.seed  # noqa: SLF001 - tf.random.set_seed would also restart the caller's op seeds.
  eager._seed = graph.seed = None  # noqa: SLF001
  try:
    yield
  finally:
    eager._seed, graph.seed = saved  # noqa: SLF001


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


def _padded_row(ids, segments, max_seq_length: int, pad_id):
  """input_ids (padded with `pad_id`), segment_ids and input_mask ([max_seq_length] each) of one instance."""
  pad = [[0, max_seq_length - tf.shape(ids)[0]]]
  return tf.pad(ids, pad, constant_values=pad_id), tf.pad(segments, pad), tf.pad(tf.ones_like(ids), pad)


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
  instances="nsp",
):
  """One document -> its instances, as BERT's `create_instances_from_document`.

  token_ids [T], sentence_lengths [S] (this document); partner_* (another document, for random next
  sentences); seed [2]; special: the ids of [CLS], [SEP] and [PAD]. Returns input_ids, segment_ids, input_mask
  [n, max_seq_length] int32 and next_sentence_labels [n], by `instances` (`data.instances`):

  * "nsp": `[CLS] A [SEP] B [SEP]`, label 1 = B is a random next sentence (from the partner);
  * "sop" (ALBERT's sentence order): the same chunks and A/B split, B always the actual continuation, and half the
    time the two swapped (`[CLS] B [SEP] A [SEP]`, label 1). Where NSP trims a long pair at either end of each
    segment at random, SOP trims A's front and B's back, so the two stay consecutive. A chunk of one sentence is
    split at a random token boundary (ALBERT's code takes B from a random document there, which is NSP's task,
    not sentence order); a one-token sentence gives B empty, label 0;
  * "doc_sentences" (RoBERTa's DOC-SENTENCES: never across documents): `[CLS] sentences... [SEP]` from one chunk,
    labelled 0.
  """
  pair = instances in ("nsp", "sop")
  max_tokens = max_seq_length - (3 if pair else 2)  # [CLS] A [SEP] B [SEP], or [CLS] A [SEP]
  splits = tf.concat([[0], tf.cumsum(sentence_lengths)], 0)
  partner_splits = tf.concat([[0], tf.cumsum(partner_lengths)], 0)
  num_sentences = tf.shape(sentence_lengths)[0]
  num_partner = tf.shape(partner_lengths)[0]
  seeds = tf.random.experimental.stateless_split(seed, num=2)
  target = tf.where(
    tf.random.stateless_uniform([], seeds[0]) < short_seq_prob, _randint(seeds[1], 2, max_tokens), max_tokens
  )
  cls, sep, pad = special

  def build(i, chunk_start, n, arrays):
    chunk = i - chunk_start + 1
    # One draw per instance, keyed by (document seed, instance number): uniform integers are floor(u * range).
    # (Keys [s0 + 1, ...] and [s0 + 2, ...]: instance k's masks use [s0, s1 + k + 1], see _with_mask_seeds.)
    key = seed + tf.stack([tf.constant(1, tf.int64), tf.cast(n, tf.int64) + 1])
    u = tf.random.stateless_uniform([3], key)
    if pair:
      a_end = tf.where(chunk < 2, 1, 1 + tf.cast(u[0] * tf.cast(chunk - 1, tf.float32), tf.int32))
    else:  # The whole chunk is A; B is empty.
      a_end = chunk
    is_random = ((chunk == 1) | (u[1] < 0.5)) if instances == "nsp" else tf.constant(False)
    a_lo, a_hi = splits[chunk_start], splits[chunk_start + a_end]
    # Random next: sentences of the partner from a random start until target_b tokens.
    target_b = target - (a_hi - a_lo)
    start = tf.minimum(tf.cast(u[2] * tf.cast(num_partner, tf.float32), tf.int32), num_partner - 1)
    ends = partner_splits[start + 1 :] - partner_splits[start]
    last = start + tf.minimum(tf.reduce_sum(tf.cast(ends < target_b, tf.int32)), num_partner - 1 - start)
    b_lo = tf.where(is_random, partner_splits[start], splits[chunk_start + a_end])
    b_hi = tf.where(is_random, partner_splits[last + 1], splits[i + 1])
    next_i = tf.where(is_random, i - (chunk - a_end), i)  # Random next: unused sentences go back.
    if instances == "sop":  # A one-sentence chunk: A and B are its two parts, cut after token 1 .. length - 1.
      cut = a_lo + 1 + tf.cast(u[0] * tf.cast(tf.maximum(a_hi - a_lo - 1, 0), tf.float32), tf.int32)
      cut = tf.where(chunk == 1, tf.minimum(cut, a_hi), a_hi)
      a_hi, b_lo = cut, tf.where(chunk == 1, cut, b_lo)

    len_a, len_b = _truncated_lengths(a_hi - a_lo, b_hi - b_lo, max_tokens)
    if instances == "sop":  # A loses its front, B its back: still consecutive.
      front_a, front_b = a_hi - a_lo - len_a, 0
    else:  # Each trimmed token comes off the front or the back with equal chance.
      trimmed = tf.cast(tf.stack([a_hi - a_lo - len_a, b_hi - b_lo - len_b]), tf.float32)
      front = tf.random.stateless_binomial([2], key + [1, 0], trimmed, 0.5)
      front_a, front_b = tf.unstack(tf.cast(front, tf.int32))
    tokens_a = token_ids[a_lo + front_a : a_lo + front_a + len_a]
    source_b = tf.cond(is_random, lambda: partner_ids, lambda: token_ids)
    tokens_b = source_b[b_lo + front_b : b_lo + front_b + len_b]
    label = is_random
    if instances == "sop":
      label = (u[1] < 0.5) & (len_b > 0)
      tokens_a, tokens_b = tf.cond(label, lambda: (tokens_b, tokens_a), lambda: (tokens_a, tokens_b))
      len_a, len_b = tf.shape(tokens_a)[0], tf.shape(tokens_b)[0]
    if pair:
      ids = tf.concat([[cls], tokens_a, [sep], tokens_b, [sep]], 0)
      segments = tf.concat([tf.zeros([len_a + 2], tf.int32), tf.ones([len_b + 1], tf.int32)], 0)
    else:
      ids = tf.concat([[cls], tokens_a, [sep]], 0)
      segments = tf.zeros([len_a + 2], tf.int32)
    row = (*_padded_row(ids, segments, max_seq_length, pad), tf.cast(label, tf.int32))
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


# Units of one reader read at a time (a deterministic interleave, one document from each in turn).
_CYCLE_LENGTH = 8


def _unit_documents(unit, epoch, *, paths, counts, seed):
  """The documents of one unit in order, each with its partner (another shard's document, for random next
  sentences): a dataset of (epoch, shard, index, (tokens, sentence lengths), partner)."""
  shard, stripe, stripes = unit[0], unit[1], unit[2]
  count = counts[shard]
  all_shards = tf.range(tf.shape(counts, out_type=tf.int64)[0], dtype=tf.int64)
  # Random next sentences come from a partner stream: the documents of another shard (chosen per shard and
  # epoch) from a random document on; in a one-shard corpus, the same shard shifted by at least one.
  others = tf.boolean_mask(all_shards, (counts > 0) & (all_shards != shard))
  keys = tf.random.stateless_uniform([2], _seed(_PARTNER, seed, epoch, shard))
  num_others = tf.shape(others, out_type=tf.int64)[0]
  partner_shard = tf.cond(
    num_others > 0,
    lambda: others[tf.minimum(tf.cast(keys[0] * tf.cast(num_others, tf.float32), tf.int64), num_others - 1)],
    lambda: shard,
  )
  partner_count = counts[partner_shard]
  first = tf.cast(keys[1] * tf.cast(partner_count, tf.float32), tf.int64)
  first = tf.where(partner_shard == shard, 1 + first % tf.maximum(partner_count - 1, 1), first % partner_count)
  documents = tf.data.TFRecordDataset(paths[shard])
  partners = tf.data.TFRecordDataset(paths[partner_shard]).repeat().skip(first)
  # Every document of the shard takes the next partner, whichever stripe keeps it: a stripe's pairs are those
  # of the whole shard.
  return (
    tf.data.Dataset.zip(tf.data.Dataset.range(count), documents, partners)
    .filter(lambda index, document, partner: index % stripes == stripe)
    .map(lambda index, document, partner: (epoch, shard, index, _parse(document), _parse(partner)))
  )


def _epoch_documents(epoch, *, units, paths, counts, seed):
  """One epoch of a reader: its units in an order shuffled per epoch, interleaved document by document."""
  order = tf.random.experimental.stateless_shuffle(
    tf.range(tf.shape(units, out_type=tf.int64)[0]), _seed(_SHARD_ORDER, seed, epoch)
  )
  return tf.data.Dataset.from_tensor_slices(tf.gather(units, order)).interleave(
    lambda unit: _unit_documents(unit, epoch, paths=paths, counts=counts, seed=seed),
    cycle_length=min(_CYCLE_LENGTH, int(units.shape[0])),
    block_length=1,
    num_parallel_calls=tf.data.AUTOTUNE,
    deterministic=True,
  )


def _with_mask_seeds(rows: dict, doc_seed) -> dict:
  """A document's instances (or the rows it closed) with their masking seeds: instance k masks with key
  (doc_seed[0], doc_seed[1] + k + 1), a distinct Philox key."""
  k = tf.range(1, tf.shape(rows["next_sentence_labels"])[0] + 1, dtype=tf.int64)
  return dict(rows, mask_seed=tf.stack([tf.fill(tf.shape(k), doc_seed[0]), doc_seed[1] + k], axis=1))


def _with_document(rows: dict, epoch, shard, index) -> dict:
  """Rows with `documents` ([n, 1, 3] int64: the (epoch, shard, index) of the document each came from), for the data
  order's listing (`data_order.py`); the stream a run trains on carries none."""
  n = tf.shape(rows["next_sentence_labels"])[0]
  document = tf.cast(tf.stack([epoch, shard, index]), tf.int64)
  return dict(rows, documents=tf.tile(document[None, None, :], [n, 1, 1]))


@functools.cache
def _instances_function(
  seed: int, max_seq_length: int, short_seq_prob: float, kind: str, special: tuple, documents: bool = False
):
  """A document's instances of kind `kind` (`document_instances`) with their masking seeds (and, with `documents`,
  the document's ids, `_with_document`), for these settings, as one tf.function: traced once, whatever the number of
  readers (each reader's dataset calls the same graph)."""

  def instances(epoch, shard, index, document, partner):
    doc_seed = _seed(_DOCUMENT, seed, epoch, shard, index)
    out = document_instances(
      *document,
      *partner,
      doc_seed,
      max_seq_length=max_seq_length,
      short_seq_prob=short_seq_prob,
      special=special,
      instances=kind,
    )
    out = _with_mask_seeds(out, doc_seed)
    return _with_document(out, epoch, shard, index) if documents else out

  return tf.function(instances, autograph=False)


@functools.cache
def _seeds_function(seed: int, documents: bool = False):
  """The masking seeds of the FULL-SENTENCES rows a document closed (with `documents`, its ids: the document that
  closed each row, whose text ends it), as one tf.function (traced once)."""

  def seeds(epoch, shard, index, rows):
    out = _with_mask_seeds(rows, _seed(_DOCUMENT, seed, epoch, shard, index))
    return _with_document(out, epoch, shard, index) if documents else out

  return tf.function(seeds, autograph=False)


@functools.cache
def _mask_function(tokenizer, masking: Masking, thresholds: bool):
  """Masked-LM selection (`masking.py`) applied to an instance, as one tf.function (traced once for all readers): the
  pretraining batch's features (with `thresholds`, each prediction's too: a masking-rate schedule's)."""

  def masked(example):
    selected = mask_tokens(
      example["input_ids"],
      example["input_mask"],
      example["mask_seed"],
      special_ids=[tokenizer.pad_id, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id],
      word_start=tokenizer.word_start,
      vocab_size=tokenizer.vocab_size,
      mask_id=tokenizer.mask_id,
      masking=masking,
      thresholds=thresholds,
    )
    passed = ("input_mask", "segment_ids", "next_sentence_labels", "documents")
    return dict({name: example[name] for name in passed if name in example}, **selected)

  return tf.function(masked, autograph=False)


def reader_rows(
  prepared_dir: str,
  manifest: dict,
  tokenizer,
  data,
  *,
  seed: int,
  reader: int,
  documents: bool = False,
  thresholds: bool = False,
) -> tf.data.Dataset:
  """Reader `reader`'s infinite stream of rows of one prepared corpus (of `data.num_readers`), masked and, with
  `data.pack_instances`, packed: what `reader_dataset` batches. With `documents`, each row also has the ids of its
  documents (`_with_document`; packed: one per instance slot, -1 for empty ones); with `thresholds`, each prediction's
  (a masking-rate schedule's, `masking.mask_tokens`)."""
  num_readers = data.num_readers
  shards = manifest["shards"]
  check_documents(prepared_dir, manifest)
  units = reader_units(manifest, reader, num_readers)
  if not sum(len(range(stripe, shards[shard]["documents"], stripes)) for shard, stripe, stripes in units):
    raise ValueError(
      f"Reader {reader} of {num_readers} gets no document of {prepared_dir} ({len(shards)} shard(s), "
      f"{sum(s['documents'] for s in shards)} documents): use fewer data.num_readers or a larger corpus."
    )
  paths = tf.constant([os.path.join(prepared_dir, s["file"]) for s in shards])
  counts = tf.constant([s["documents"] for s in shards], tf.int64)
  corpus = dict(paths=paths, counts=counts, seed=seed)
  epochs = functools.partial(_epoch_documents, units=tf.constant(units, tf.int64), **corpus)
  special = (tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id)
  kind = instance_kind(data)
  stream = tf.data.Dataset.range(2**62).flat_map(epochs)  # Epochs 0, 1, 2, ...
  if kind == "full_sentences":  # Rows carried from document to document: a scan, in order.
    dataset = full_sentences.full_sentence_rows(stream, max_seq_length=data.max_seq_length, special=special)
    dataset = dataset.map(_seeds_function(seed, documents), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  else:
    instances = _instances_function(seed, data.max_seq_length, data.short_seq_prob, kind, special, documents)
    dataset = stream.map(instances, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  dataset = dataset.unbatch()
  with _global_seed_unset():
    dataset = dataset.shuffle(data.shuffle_buffer, seed=seed, reshuffle_each_iteration=False)
  masked = _mask_function(tokenizer, Masking.of(data), thresholds)
  dataset = dataset.map(masked, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  if data.pack_instances:
    dataset = packing.packed(dataset, data, seed, tokenizer.pad_id)
  return dataset


def reader_dataset(
  prepared_dir: str,
  manifest: dict,
  tokenizer,
  data,
  *,
  seed: int,
  reader: int,
  batch_size: int,
  mixture: mixed.Mixture | None = None,
  documents: bool = False,
  masking_rates: MaskingRates | None = None,
) -> tf.data.Dataset:
  """Reader `reader`'s infinite stream of batches of `batch_size // data.num_readers` examples (numpy-ready dicts
  with BERT's feature names).

  `data` is the run's `config.data` (sequence length, predictions, masking and pairing probabilities, shuffle
  buffer, readers); `tokenizer` (bert_jax.data.tokenizer) gives the special ids, the word starts and the vocabulary
  size; `batch_size` is the global batch. With a `mixture`, the rows are drawn from its sources (`mixed.py`; each
  row's `source` says which) and `prepared_dir`, `manifest` are not read. With `documents`, rows carry their
  documents' ids (`reader_rows`). `masking_rates`, a masking-rate schedule in reader batches (`masking_schedule.py`):
  each batch trimmed to its rate (None: every batch at `data.masked_lm_prob`).
  """
  num_readers = data.num_readers
  if batch_size % num_readers:
    raise ValueError(f"batch_size={batch_size} does not split over data.num_readers={num_readers} readers.")
  rows = functools.partial(
    reader_rows, tokenizer=tokenizer, data=data, reader=reader, documents=documents, thresholds=bool(masking_rates)
  )
  options = tf.data.Options()
  options.deterministic = True
  # No autotuning thread: AUTOTUNE parallelism becomes the core count. Measured on this project's 2-core machine
  # (python -m bert_jax.benchmarks.pipeline_throughput, 2026-11-24): 8,476 vs 6,771 sequences/s at 128 and
  # 6,238 vs 5,175 at 512; and a finished run no longer waits up to ~40 s at exit for the autotuner's thread to notice
  # that the iterator is being destroyed (py-spy: ~IteratorResource waiting in UnboundedThreadPool's thread wrapper).
  options.autotune.enabled = False
  if mixture is not None:  # Rows drawn after every buffer: see `mixed.choose`.
    streams = [
      mixed.tagged(rows(directory, source_manifest, seed=mixture.source_seed(seed, j)), j).prefetch(tf.data.AUTOTUNE)
      for j, (directory, source_manifest) in enumerate(zip(mixture.dirs, mixture.manifests, strict=True))
    ]
    dataset = mixed.choose(streams, mixture, seed=seed, reader=reader, rows_per_batch=batch_size // num_readers)
    batches = dataset.batch(batch_size // num_readers, drop_remainder=True)
    if masking_rates is None:
      return batches.with_options(options)
    return batches.enumerate().map(_trim_function(masking_rates)).with_options(options)  # No buffer after the draw.
  dataset = rows(prepared_dir, manifest, seed=seed).batch(
    batch_size // num_readers, drop_remainder=True, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
  )
  if masking_rates is None:
    return dataset.prefetch(tf.data.AUTOTUNE).with_options(options)
  # Batch b at the rate of its place in the stream, trimmed after the prefetch buffer (in the caller's thread, no
  # buffer of its own): a saved state, whose buffers hold batches, holds them untrimmed, so it does not depend on the
  # schedule, and a resume with another schedule trims by that one.
  batches = dataset.enumerate().prefetch(tf.data.AUTOTUNE)
  return batches.map(_trim_function(masking_rates)).with_options(options)


@functools.cache
def _trim_function(rates: MaskingRates):
  """Reader batch b trimmed to its rate (`masking.trim_to_rate`, `masking.batch_rate`), as one tf.function."""
  return tf.function(lambda b, batch: trim_to_rate(batch, batch_rate(b, rates)), autograph=False)
