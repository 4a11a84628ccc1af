"""The prepared corpus as a batch source, resumable from an example position: this host's readers of the tf.data
pipeline (`pipeline.py`), their saved states, and the replay when a state is missing.

Like the synthetic source (`synthetic.py`), it yields this host's numpy batches and counts `position`, the examples
of the global stream consumed so far, which checkpoints save.
"""

import hashlib
import json
import tempfile
from collections.abc import Callable

import ml_collections
import numpy as np
from absl import logging
from etils import epath

from bert_jax import paths
from bert_jax.data import mixed, pipeline, readers
from bert_jax.data.instances import instance_kind
from bert_jax.data.masking_names import OLDER_KEYS as OLDER_MASKING_KEYS
from bert_jax.data.masking_names import masking_scheme
from bert_jax.data.masking_schedule import MaskingRates
from bert_jax.tensorflow_cpu import tf

_COMPLETE = "COMPLETE"  # Written last (position, reader, fingerprint): a state directory without it is never read.


class PipelineSource:
  """This host's batches from the tf.data pipeline: its rows of its readers' batches, concatenated in reader order;
  starts `start_example` examples (of the global stream) in. `global_batch_size` is the rows of one batch of every
  reader together: `next` gives one, `take` any whole number of them (a batch-size warmup's steps, see
  `batch_warmup.py`, each reader's batches joined in order), and positions are whole numbers of them.

  To resume, each reader restores the iterator state saved at that position (`save_state`: file positions,
  shuffle buffer) in `<state_dir>/reader_<r>` when it is there and was saved by the same stream, whichever host
  saved it (the host that keeps a reader's first row saves it); a reader without one replays its stream up to the
  position (the pipeline's randomness is stateless, so it is the same stream, at the cost of recomputing it). A
  corrupt or truncated shard raises with the file's name.
  """

  def __init__(
    self,
    readers: dict[int, tf.data.Dataset],
    rows: dict[int, slice],
    files: list[str],
    global_batch_size: int,
    start_example: int,
    state_dir: str | None = None,
    fingerprint: str = "",
    schedule: Callable[[int], object] = lambda position: None,
  ):
    if start_example % global_batch_size:
      raise ValueError(f"Data position {start_example} is not a whole number of batches of {global_batch_size}.")
    self._files, self._global_batch, self._fingerprint = files, global_batch_size, fingerprint
    self._schedule = schedule
    self._datasets, self._rows = readers, rows
    self._iterators = {reader: iter(dataset) for reader, dataset in readers.items()}
    self.position = start_example
    replayed = [r for r in readers if start_example and not (state_dir and self._restore(r, state_dir))]
    if start_example and len(replayed) < len(readers):
      logging.info(
        "Restored the input pipeline's state at example %d from %s (readers %s).",
        start_example,
        state_dir,
        _spans([r for r in readers if r not in replayed]),
      )
    if replayed:
      batches = start_example // global_batch_size
      logging.warning(
        "No usable saved input-pipeline state for example %d of reader(s) %s: replaying their stream to it (%d "
        "batches each).",
        start_example,
        _spans(replayed),
        batches,
      )
      for reader in replayed:
        for _ in range(batches):
          self._next_of(reader)

  def _marker(self, reader: int, position: int) -> dict:
    """What a saved state says it belongs to: the stream's fingerprint and, for a mixture, what of its schedule the
    stream up to `position` depended on (`mixed.Mixture.before`), so that a schedule changed after it keeps it."""
    fingerprint = self._fingerprint
    schedule = self._schedule(position)
    if schedule is not None:
      fingerprint = hashlib.sha256(json.dumps([fingerprint, schedule]).encode()).hexdigest()
    return dict(position=position, reader=reader, fingerprint=fingerprint)

  def _restore(self, reader: int, state_dir: str) -> bool:
    """Whether `reader`'s state saved in `state_dir` applies and was restored; a damaged one is reported and
    ignored (the reader then replays from a fresh iterator)."""
    directory = reader_state_dir(state_dir, reader)
    try:
      if _saved_marker(directory) != self._marker(reader, self.position):
        return False
      with paths.local_copy(directory) as local:
        tf.train.Checkpoint(iterator=self._iterators[reader]).read(f"{local}/iterator").assert_consumed()
      return True
    except Exception as error:  # noqa: BLE001 - any damage: the replay gives the same stream.
      logging.warning("The saved input-pipeline state in %s cannot be read (%s); replaying instead.", directory, error)
      self._iterators[reader] = iter(self._datasets[reader])
      return False

  def save_state(self, state_dir: str) -> None:
    """Writes each of this host's readers' iterator state to `<state_dir>/reader_<r>` (through a local directory
    when it is remote); each reader's completion marker goes last. A reader that hosts share is saved by the one
    that keeps its first row."""
    for reader, iterator in self._iterators.items():
      if self._rows[reader].start:
        continue
      directory = reader_state_dir(state_dir, reader)
      with tempfile.TemporaryDirectory() as local:
        tf.train.Checkpoint(iterator=iterator).write(f"{local}/iterator")
        paths.copy_tree(local, directory)
      (epath.Path(directory) / _COMPLETE).write_text(json.dumps(self._marker(reader, self.position)))

  def _next_of(self, reader: int) -> dict:
    try:
      return next(self._iterators[reader])
    except tf.errors.DataLossError as error:
      raise ValueError(f"Corrupt or truncated shard {_find_corrupt(self._files)}: {error.message}") from None

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    return self.take(self._global_batch)

  def take(self, rows: int) -> dict:
    """This host's part of the next `rows` examples of the global stream: `rows / global_batch_size` batches of
    each reader, joined, of which the host keeps the same share as of one."""
    batches, rest = divmod(rows, self._global_batch)
    if rest or not batches:
      raise ValueError(f"{rows} rows are not a whole number of the pipeline's batches of {self._global_batch}.")
    parts = []
    for reader, kept in self._rows.items():
      part = self._next_of(reader)
      if batches > 1:
        more = [part, *(self._next_of(reader) for _ in range(batches - 1))]
        part = {name: np.concatenate([batch[name].numpy() for batch in more]) for name in part}
      parts.append((part, slice(kept.start * batches, kept.stop * batches)))
    self.position += rows
    if len(parts) == 1:
      return {name: np.asarray(value)[parts[0][1]] for name, value in parts[0][0].items()}
    return {name: np.concatenate([np.asarray(part[name])[kept] for part, kept in parts]) for name in parts[0][0]}


def reader_state_dir(state_dir: str, reader: int) -> str:
  return f"{state_dir}/reader_{reader}"


def _spans(readers: list[int]) -> str:
  """Reader numbers as a short text: "0-3", "5", "1, 4"."""
  if len(readers) > 1 and readers == list(range(readers[0], readers[-1] + 1)):
    return f"{readers[0]}-{readers[-1]}"
  return ", ".join(map(str, readers))


def _saved_marker(state_dir: str) -> dict | None:
  """The completion marker of a reader's saved state. The state applies only if it matches the run exactly: the
  same position, reader and pipeline fingerprint (corpus, tokenizer, data settings, readers, batch)."""
  marker = epath.Path(state_dir) / _COMPLETE
  if not marker.exists():
    return None
  return json.loads(marker.read_text())


def _find_corrupt(files: list[str]) -> str:
  """Reads each file to the end; the first that fails is the culprit (only on the error path)."""
  for path in files:
    try:
      for _ in tf.data.TFRecordDataset(path):
        pass
    except tf.errors.DataLossError:
      return path
  return f"(one of {files})"


# Every key of `config.data` has one decision below, on whether it defines the stream that a saved pipeline state
# belongs to; `stream_fingerprint` refuses a key without one (tests/test_pipeline.py checks configs/default.py's). A
# new key that changes the stream goes in _ADDED_LATER with its default, so that states saved before it still apply.

# Keys that define the stream, in the fingerprint at any value, as every saved state hashed them.
_STREAM = (
  "source",
  "embedded_corpus",
  "input_format",
  "tfds_name",
  "tfds_split",
  "tfds_feature",
  "num_shards",
  "masked_lm_prob",
  "short_seq_prob",
  "num_readers",
  "shuffle_buffer",
  "pack_instances",
  "max_instances_per_row",
  "packing_group",
  "max_seq_length",
  "max_predictions_per_seq",
)

# Stream keys added after saved states existed, each with the value every state saved before it ran with: a key at that
# value is left out of the fingerprint, so those states still apply.
_ADDED_LATER = {
  "mask_token_fraction": 0.8,
  "random_token_fraction": 0.1,
  "span_geometric_p": 0.2,
  "span_max_words": 10,
}

# Keys that do not define the stream: where files are, checks, and preparation's own settings (the manifest, which is
# in the fingerprint, says what preparation made); the evaluation stream's rate (which it reads as its masked_lm_prob,
# `corpus.evaluation_data`); the masking-rate schedule, whose trim is a function of each batch's place in the stream
# after the saved iterator (only whether there is one changes the elements: `stream_fingerprint`).
_NOT_THE_STREAM = (
  "eval_masked_lm_prob",
  "masking_phases",
  "prepared_dir",
  "eval_prepared_dir",
  "prepare_unit_bytes",
  "text_field",  # Recorded in the manifest of a corpus prepared from records.
  # A mixture's sources (their manifests, by name) and its schedule up to the state's place are in the fingerprint
  # (`stream_fingerprint`, `PipelineSource._marker`); where the corpora are is not.
  "mixture_sources",
  "mixture_phases",
  "max_document_bytes",
  "prepare_overwrite",
  "prepare_runner",
  "beam_options",
  "eval_fraction",
  "eval_min_documents",
  "input_pattern",
  "tfds_data_dir",
  "verify_shard_hashes",
  "restart_stream_on_reader_change",
)

# The instance kind and the masking scheme, each named by a key and an older one: written as the oldest states wrote
# them (`_kinds`).
_KINDS = ("instances", "next_sentence_prediction", "masking", *OLDER_MASKING_KEYS)


def _without_paths(value):
  """The manifest without the tokenizer's path (informative only)."""
  if isinstance(value, dict):
    return {k: _without_paths(v) for k, v in value.items() if k != "path"}
  return value


def pipeline_source(
  data,
  prepared_dir: str,
  manifest: dict,
  tokenizer,
  *,
  seed: int,
  batch_size: int,
  start_example: int = 0,
  host: tuple[int, int] = (0, 1),
  state_dir: str | None = None,
  num_readers: int = 0,
  masking_rates: MaskingRates | None = None,
  mixture: mixed.Mixture | None = None,
  documents: bool = False,
) -> PipelineSource:
  """Host `host` = (index, count)'s batches of the prepared corpus, by the settings of `data` (`config.data`), over
  `num_readers` readers (0: `data.num_readers`; 0 there too: one reader per host), from `start_example` on;
  `state_dir` may hold the readers' states at that position; `masking_rates`: `data.masking_phases` resolved
  (`MaskingRates.of(config)`), which a schedule needs; a `mixture` draws the rows from its sources (`prepared_dir` and
  `manifest` unused); with `documents`, rows carry their documents' ids (the data order's listing: a stream of its
  own, never saved)."""
  if bool(data.masking_phases) != (masking_rates is not None):
    raise ValueError(
      f"data.masking_phases={data.masking_phases!r} with masking_rates={masking_rates}: a schedule is read with its "
      "resolution (masking_schedule.MaskingRates.of(config)), and only with one."
    )
  readers_count = num_readers or data.num_readers or host[1]
  if data.num_readers != readers_count:  # The stream's settings (and fingerprint) are those of the run's readers.
    data = ml_collections.ConfigDict(dict(data.to_dict(), num_readers=readers_count))
  mine = readers.host_readers(data.num_readers, batch_size, *host)
  datasets = {
    reader: pipeline.reader_dataset(
      prepared_dir,
      manifest,
      tokenizer,
      data,
      seed=seed,
      reader=reader,
      batch_size=batch_size,
      masking_rates=masking_rates,
      mixture=mixture,
      documents=documents,
    )
    for reader in mine
  }
  if mixture is None:
    files = readers.reader_files(prepared_dir, manifest, mine, data.num_readers)
    fingerprint = stream_fingerprint(data, manifest, seed=seed, batch_size=batch_size)
    return PipelineSource(datasets, mine, files, batch_size, start_example, state_dir, fingerprint)
  corpora = list(zip(mixture.dirs, mixture.manifests, strict=True))
  files = [file for d, m in corpora for file in readers.reader_files(d, m, mine, data.num_readers)]
  manifests = dict(zip(mixture.names, mixture.manifests, strict=True))
  fingerprint = stream_fingerprint(data, manifests, seed=seed, batch_size=batch_size)
  schedule = lambda position: mixture.before(position // batch_size)  # noqa: E731
  return PipelineSource(datasets, mine, files, batch_size, start_example, state_dir, fingerprint, schedule)


def stream_fingerprint(data, manifest: dict, *, seed: int, batch_size: int) -> str:
  """A hash of what defines the stream of `data` (`config.data`): not where the files are (a moved
  corpus or workdir keeps its saved state). Keys added later are left out at the value older states ran with
  (`_ADDED_LATER`), and the instance kind and masking scheme are written as older states wrote them (`_kinds`), so
  those states still apply. A key without a decision above is refused."""
  values = data.to_dict()
  undecided = sorted(set(values) - {*_STREAM, *_ADDED_LATER, *_NOT_THE_STREAM, *_KINDS})
  if undecided:
    raise ValueError(
      f"data.{', data.'.join(undecided)}: no decision on whether saved pipeline states depend on it. Name it in "
      "bert_jax/data/sources.py: _STREAM, _ADDED_LATER (with the value runs had before it existed, so that their "
      "states still apply) or _NOT_THE_STREAM."
    )
  stream = {
    key: value
    for key, value in values.items()
    if key in _STREAM or (key in _ADDED_LATER and value != _ADDED_LATER[key])
  }
  settings = dict(stream, **_kinds(data), seed=seed, batch_size=batch_size, manifest=_without_paths(manifest))
  if values.get("masking_phases"):  # Its elements carry each prediction's threshold: a state from without won't do.
    settings["masking_thresholds"] = True
  return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def _kinds(data) -> dict:
  """The instance kind and the masking scheme of `data` as the oldest states' fingerprints name them where they can:
  `next_sentence_prediction` (True for "nsp", False for "doc_sentences") from before `data.instances`, and
  `whole_word_masking` (always), `span_masking` (True only) from before `data.masking`; a kind those keys cannot
  name is added by its key."""
  kinds = {}
  kind = instance_kind(data)
  kinds["next_sentence_prediction"] = kind == "nsp"
  if kind not in ("nsp", "doc_sentences"):
    kinds["instances"] = kind
  scheme = masking_scheme(data)
  kinds["whole_word_masking"] = scheme == "words"
  if scheme == "spans":
    kinds["span_masking"] = True
  elif scheme not in ("tokens", "words"):
    kinds["masking"] = scheme
  return kinds
