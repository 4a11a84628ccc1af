"""The batch sources training reads, chosen by `config.data.source`, each resumable from an example position.

`pretraining`: the prepared corpus through the tf.data pipeline (`pipeline.py`); `synthetic`: random tokens in
the real layout (`synthetic.py`), for benchmarks and smoke runs. Both yield this host's numpy batches and count
`position`, the examples of the global stream consumed so far, which checkpoints save.
"""

import hashlib
import json
import tempfile

import tensorflow as tf
from absl import logging
from etils import epath

from bert_jax import paths
from bert_jax.data import pipeline
from bert_jax.data.synthetic import SyntheticSource

_COMPLETE = "COMPLETE"  # Written last (position, hosts, fingerprint): a state directory without it is never read.


class PipelineSource:
  """Host batches from the tf.data pipeline; starts `start_example` examples into the stream.

  To resume, it restores the iterator state saved at that position (`save_state`: file positions, shuffle
  buffer) when `state_dir` has it, else it replays the stream up to the position (the pipeline's randomness is
  stateless, so it is the same stream, at the cost of recomputing it). A corrupt or truncated shard raises with
  the file's name.
  """

  def __init__(
    self,
    dataset: tf.data.Dataset,
    files: list[str],
    global_batch_size: int,
    start_example: int,
    state_dir: str | None = None,
    process_count: int = 1,
    fingerprint: str = "",
  ):
    if start_example % global_batch_size:
      raise ValueError(f"Data position {start_example} is not a whole number of batches of {global_batch_size}.")
    self._files, self._global_batch = files, global_batch_size
    self._iterator = iter(dataset)
    self.position = 0
    self._marker = lambda position: dict(position=position, hosts=process_count, fingerprint=fingerprint)
    if start_example and state_dir and self._restore(dataset, state_dir, start_example):
      self.position = start_example
      logging.info("Restored the input pipeline's state at example %d from %s.", start_example, state_dir)
    elif start_example:
      logging.warning(
        "No saved input-pipeline state for example %d: replaying the stream to it (%d batches).",
        start_example,
        start_example // global_batch_size,
      )
      while self.position < start_example:
        next(self)

  def _restore(self, dataset: tf.data.Dataset, state_dir: str, start_example: int) -> bool:
    """Whether the state saved in `state_dir` applies and was restored; a damaged one is reported and ignored (the
    stream is then replayed from a fresh iterator)."""
    try:
      if _saved_marker(state_dir) != self._marker(start_example):
        return False
      with paths.local_copy(state_dir) as local:
        tf.train.Checkpoint(iterator=self._iterator).read(f"{local}/iterator").assert_consumed()
      return True
    except Exception as error:  # noqa: BLE001 - any damage: the replay gives the same stream.
      logging.warning("The saved input-pipeline state in %s cannot be read (%s); replaying instead.", state_dir, error)
      self._iterator = iter(dataset)
      return False

  def save_state(self, state_dir: str) -> None:
    """Writes the iterator's state (this host's) to `state_dir` (through a local directory when it is remote);
    the completion marker goes last."""
    with tempfile.TemporaryDirectory() as local:
      tf.train.Checkpoint(iterator=self._iterator).write(f"{local}/iterator")
      paths.copy_tree(local, state_dir)
    (epath.Path(state_dir) / _COMPLETE).write_text(json.dumps(self._marker(self.position)))

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    try:
      batch = {name: value.numpy() for name, value in next(self._iterator).items()}
    except tf.errors.DataLossError as error:
      raise ValueError(f"Corrupt or truncated shard {_find_corrupt(self._files)}: {error.message}") from None
    self.position += self._global_batch
    return batch


def _saved_marker(state_dir: str) -> dict | None:
  """The completion marker of a saved state. The state applies only if it matches the run exactly: the same
  position, host count (each host's shards) and pipeline fingerprint (corpus, tokenizer, data settings)."""
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


_NOT_THE_STREAM = (
  "prepared_dir",
  "eval_prepared_dir",
  "input_pattern",
  "tfds_data_dir",
  "verify_shard_hashes",
  "restart_stream_on_host_change",
)


def _without_paths(value):
  """The manifest without the tokenizer's path (informative only)."""
  if isinstance(value, dict):
    return {k: _without_paths(v) for k, v in value.items() if k != "path"}
  return value


def make_source(
  config,
  *,
  seed: int,
  start_example: int,
  process_index: int,
  process_count: int,
  vocab_size: int,
  tokenizer=None,
  prepared_dir: str = "",
  manifest: dict | None = None,
  state_dir: str | None = None,
):
  """The source `config.data.source` names, for this host; `state_dir` may hold its state at `start_example`."""
  data = config.data
  host_batch = config.batch_size // process_count
  if data.source == "synthetic":
    return SyntheticSource(
      seed=seed,
      global_batch_size=config.batch_size,
      max_seq_length=data.max_seq_length,
      max_predictions_per_seq=data.max_predictions_per_seq,
      vocab_size=vocab_size,
      process_index=process_index,
      process_count=process_count,
      start_example=start_example,
    )
  dataset = pipeline.pretraining_dataset(
    prepared_dir,
    manifest,
    tokenizer,
    seed=seed,
    batch_size=host_batch,
    max_seq_length=data.max_seq_length,
    max_predictions_per_seq=data.max_predictions_per_seq,
    masked_lm_prob=data.masked_lm_prob,
    short_seq_prob=data.short_seq_prob,
    whole_word_masking=data.whole_word_masking,
    next_sentence_prediction=data.next_sentence_prediction,
    process_index=process_index,
    process_count=process_count,
    shuffle_buffer=data.shuffle_buffer,
  )
  files = [path for _, path, _ in pipeline.host_files(prepared_dir, manifest, process_index, process_count)]
  # What defines the stream; not where the files are (a moved corpus or workdir keeps its saved state).
  stream = {key: value for key, value in data.to_dict().items() if key not in _NOT_THE_STREAM}
  settings = dict(stream, seed=seed, batch_size=config.batch_size, manifest=_without_paths(manifest))
  fingerprint = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()
  return PipelineSource(dataset, files, config.batch_size, start_example, state_dir, process_count, fingerprint)
