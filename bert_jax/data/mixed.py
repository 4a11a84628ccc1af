"""A reader's rows drawn from several prepared corpora (`mixture.py`): each source's own row stream (`pipeline.py`,
the same reader of that corpus), and, for each row of the reader's stream, a source drawn by the schedule at the
row's place in the stream.

Row k of a reader belongs to its batch b = k // (rows per reader batch); batch b's draws are stateless categorical
draws from (seed, reader, b) with the schedule's log-weights at b, row k taking draw k mod (rows per batch). So which
source (and so which document) a row holds is a pure function of the seed, the mixture and the row's place: the same
on any host count, after any resume. A source's stream advances only by the rows drawn from it, so each source reads
its corpus in its own order, as alone.
"""

import dataclasses
import hashlib

from bert_jax.data import mixture as mixture_lib
from bert_jax.data import phases
from bert_jax.tensorflow_cpu import tf

_DRAW = 5  # A salt apart from the pipeline's (pipeline.py) and packing's.


@dataclasses.dataclass(frozen=True)
class Mixture:
  """The sources of a mixture run and its schedule in the stream's batches: `bounds` (P + 1 boundaries, in batches of
  `BatchSchedule.start` rows) and each phase's log-weights per source at its beginning and end (`first`, `last`)."""

  names: tuple[str, ...]
  dirs: tuple[str, ...]
  manifests: tuple[dict, ...]
  bounds: tuple[int, ...]
  first: tuple[tuple[float, ...], ...]
  last: tuple[tuple[float, ...], ...]

  @classmethod
  def of(cls, data, manifests: dict[str, dict], batches, end_step: int) -> "Mixture":
    """`data`'s mixture (checked) over the sources' `manifests` (name -> manifest, read), for a run whose steps read
    as `batches` (its `BatchSchedule`) and end at `end_step`."""
    written, draws = mixture_lib.schedule(data)
    tokens = {name: manifest["tokens"] for name, manifest in manifests.items()}
    logits = [draw.logits(tokens) for draw in draws]
    return cls(
      names=tuple(manifests),
      dirs=tuple(mixture_lib.sources(data).values()),
      manifests=tuple(manifests.values()),
      bounds=tuple(phases.bounds(written, batches, end_step, mixture_lib.PHASES_KEY)),
      first=tuple(tuple(first) for first, _ in logits),
      last=tuple(tuple(last) for _, last in logits),
    )

  def source_seed(self, seed: int, index: int) -> int:
    """The seed of source `index`'s own stream: apart from the other sources' (the same documents of two sources
    would otherwise pair and mask alike)."""
    digest = hashlib.sha256(f"{seed}:{self.names[index]}".encode()).digest()
    return int.from_bytes(digest[:7], "little")

  def before(self, batch: int) -> list:
    """What of the schedule the stream's first `batch` batches depend on: the phases that begin before it (an
    interpolated one to its end, the others up to `batch`). A saved pipeline state at that place applies to any
    mixture with the same sources and the same `before`: the schedule may change at a boundary it declares."""
    spans = zip(self.bounds, self.bounds[1:], self.first, self.last, strict=False)
    return [
      (begin, end if first != last else min(end, batch), first, last)
      for begin, end, first, last in spans
      if begin < batch
    ]

  def logits_at(self, batch) -> tf.Tensor:
    """[sources] float32: the log-weights at stream batch `batch` (a scalar int64 tensor), interpolated within its
    phase; past the last boundary, the last phase's end."""
    bounds, batch = tf.constant(self.bounds, tf.int64), tf.cast(batch, tf.int64)
    phase = tf.clip_by_value(tf.searchsorted(bounds, [batch], side="right")[0] - 1, 0, len(self.first) - 1)
    begin, end = bounds[phase], bounds[phase + 1]
    fraction = tf.clip_by_value(
      tf.cast(batch - begin, tf.float32) / tf.cast(tf.maximum(end - begin, 1), tf.float32), 0, 1
    )
    first, last = tf.constant(self.first, tf.float32)[phase], tf.constant(self.last, tf.float32)[phase]
    return first + fraction * (last - first)


def tagged(rows: tf.data.Dataset, index: int) -> tf.data.Dataset:
  """Source `index`'s rows, each with its `source` (int32): tagged in the source's own stream, before its buffer."""
  return rows.map(lambda row: dict(row, source=tf.constant(index, tf.int32)))


def choose(rows: list[tf.data.Dataset], mixture: Mixture, *, seed: int, reader: int, rows_per_batch: int):
  """Reader `reader`'s rows drawn from the sources' `rows` (one infinite row stream each, `tagged`).

  Nothing after the draw may buffer (no parallel map or batch, no prefetch): a saved iterator state holds its buffers'
  elements, and a resume whose schedule changes at a boundary would replay rows drawn by the old one. Each source's
  stream buffers before the draw, which the schedule does not touch. The draws of a batch are one op (a draw per row
  cost a third of the throughput): row i of batch b is draw i of the categorical keyed on (seed, reader, b)."""

  def draw(b):
    key = tf.random.experimental.stateless_fold_in(tf.constant([seed, _DRAW], tf.int64), reader)
    key = tf.random.experimental.stateless_fold_in(key, b)
    return tf.random.stateless_categorical(mixture.logits_at(b)[None], rows_per_batch, key, dtype=tf.int64)[0]

  choices = tf.data.Dataset.range(2**62).map(draw).unbatch()
  return tf.data.Dataset.choose_from_datasets(rows, choices, stop_on_empty_dataset=False)
