"""Corpus preparation on Apache Beam (`data.prepare_runner="beam"`; `pip install -e '.[beam]'`): the shards of
`prepare.write`, written by Beam workers instead of this machine's processes. Beam's local runner here; Dataflow,
Flink or Spark by the pipeline's options (`data.beam_options`, its command-line flags).

The pipeline is one step: the work units `prepare.work_units` cut (a byte range of a file, or a slice of a TFDS
split), redistributed over the workers, each written by `shards.write_shard`, the local preparer's shard writer. What
comes before and after runs here, on the launching machine, as it does for the local preparer: the plan (the input's
record, the comparison with a corpus already there, the check that there is enough text) before any work; the
hold-out minimum, the manifest (the commit) and the removal of a replaced corpus after the last shard. So a corpus
prepared on Beam is the local preparer's byte for byte: the same shard files, statistics and manifest.

Retries change nothing: a shard's bytes are a function of its unit; a worker writes it under a name of its own
(`shards.init_worker`'s `concurrent`) and renames it into place whole, so a retried or duplicated unit (Dataflow runs
a slow bundle twice) writes the same bytes over the same name, and a reader never sees a part; a unit whose shard is
already whole is skipped, so a pipeline that died at 80% and is run again writes the other 20%. Nothing is read as a
corpus before the manifest, written here after the pipeline succeeded.
"""

import json
import uuid
from collections.abc import Callable, Iterator

from absl import logging
from etils import epath

from bert_jax import paths
from bert_jax.data import shards
from bert_jax.data.beam_options import check_runner, pipeline_options, require_beam, run_pipeline, runner_name


class _WriteShard:
  """The DoFn's body (a plain class, so importing this module does not import Beam): loads the tokenizer once per
  worker, then writes each unit's shards; counts the text bytes and shards for Beam's metrics."""

  def __init__(self, tokenizer_args: dict):
    self.tokenizer_args = tokenizer_args

  def setup(self):
    shards.init_worker(self.tokenizer_args, pooled=True, concurrent=True)

  def process(self, unit: dict):
    from apache_beam.metrics import Metrics

    result = shards.write_shard(unit)
    written = not result.get("skipped")
    Metrics.counter("bert_jax", "shards_written" if written else "shards_already_written").inc()
    Metrics.counter("bert_jax", "text_bytes").inc(result["text_bytes"] if written else 0)
    logging.info(
      "%s %s: %d documents, %d tokens.",
      "Wrote" if written else "Kept",
      unit["file"],
      result["documents"],
      result["tokens"],
    )
    yield unit["file"]


def write_shards(units: list[dict], tokenizer_args: dict, flags: str) -> list[dict]:
  """Writes every unit's shards (those not already whole) with a Beam pipeline run with `flags`; returns each unit's
  statistics, in unit order, as `shards.write_shard` recorded them beside its shard."""
  beam = require_beam("data.prepare_runner='beam'")
  options = pipeline_options(flags)
  check_runner(options)

  class WriteShard(_WriteShard, beam.DoFn):
    pass

  logging.info("Preparing %d shard(s) on Beam's %s.", len(units), runner_name(options))
  pipeline = beam.Pipeline(options=options)
  _ = (
    pipeline
    | "Units" >> beam.Create(units, reshuffle=False)
    # Spread the units over the workers (Create's elements would otherwise stay in one bundle).
    | "Spread" >> beam.Reshuffle()
    | "WriteShard" >> beam.ParDo(WriteShard(tokenizer_args))
  )
  result = run_pipeline(pipeline, options, flags)
  for counter in result.metrics().query()["counters"]:
    logging.info("Beam counter %s: %d", counter.key.metric.name, counter.committed or counter.attempted or 0)
  _remove_staged(units)
  results = [shards.read_stats(unit) for unit in units]
  missing = [unit["file"] for unit, result in zip(units, results, strict=True) if result is None]
  if missing:  # A runner that reported success without running every unit: nothing is committed.
    raise RuntimeError(f"The Beam pipeline finished without writing {len(missing)} shard(s): {missing[:5]}.")
  return results


def _remove_staged(units: list[dict]) -> None:
  """Removes what killed workers left staged beside the shards (`<file>.tmp-<id>`; a worker that fails in Python
  removes its own): every unit's shards are whole now, so no writer of them is left."""
  for unit in units:
    for final in (unit["output"], shards.eval_file(unit["output"]), unit["output"] + ".stats.json"):
      for staged in epath.Path(final).parent.glob(epath.Path(final).name + ".tmp-*"):
        staged.unlink()


def sample_texts(
  units: list[dict],
  unit_texts: Callable[[dict], Iterator[str]],
  max_texts: int,
  seed: int,
  flags: str,
  staging_dir: str,
) -> list[str]:
  """`tokenizer.training.sample_texts` of the units' texts (`unit_texts` of each), drawn by a Beam pipeline run
  with `flags`: the workers read the units, and Beam's Top combiner keeps the `max_texts` of lowest keyed hash, the
  same texts in the same order as the sample drawn here. The sample comes back through a file staged in
  `staging_dir` (where the vocabulary is written; the workers reach it), removed once read."""
  beam = require_beam("data.prepare_runner='beam'")
  from bert_jax.data.tokenizer import training

  options = pipeline_options(flags)
  check_runner(options)
  seed_key = str(seed).encode()
  staged = epath.Path(staging_dir, f".vocabulary-sample-{uuid.uuid4().hex[:12]}.json")
  logging.info("Sampling %d texts of %d unit(s) on Beam's %s.", max_texts, len(units), runner_name(options))
  pipeline = beam.Pipeline(options=options)
  _ = (
    pipeline
    | "Units" >> beam.Create(units, reshuffle=False)
    | "Spread" >> beam.Reshuffle()
    | "Texts" >> beam.FlatMap(unit_texts)
    | "Lowest" >> beam.combiners.Top.Of(max_texts, key=lambda item: training.sample_key(seed_key, item), reverse=True)
    | "Stage" >> beam.Map(lambda sample: paths.write_text(str(staged), json.dumps(sample)))
  )
  run_pipeline(pipeline, options, flags)
  try:
    return json.loads(staged.read_text())
  finally:
    staged.unlink()
