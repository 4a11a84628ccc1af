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

import os
import shlex

from absl import logging
from etils import epath

from bert_jax.data import shards

# The local runner's default: Beam's DirectRunner with a worker process per core (each loads the tokenizer once).
_LOCAL_FLAGS = ("--runner=DirectRunner", "--direct_running_mode=multi_processing")


def require_beam(key: str):
  """Imports apache_beam, or raises naming `key` (the setting that asked for it) and the install command."""
  try:
    import apache_beam
  except ImportError as error:
    raise ImportError(
      f"{key} needs Apache Beam, which is not installed: pip install -e '.[beam]' (or pip install apache-beam)."
    ) from error
  return apache_beam


def pipeline_options(flags: str, key: str = "data.beam_options"):
  """Beam's PipelineOptions from `flags` (command-line flags, e.g. "--runner=DataflowRunner --project=P"). Without
  `--runner`: the local runner, a worker process per core (`--direct_num_workers` overrides). Refuses flags Beam does
  not know, naming them, before any work (Beam itself would ignore them with a warning)."""
  require_beam(key)
  from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

  try:
    args = shlex.split(flags)
  except ValueError as error:
    raise ValueError(f"{key}={flags!r} is not a list of command-line flags: {error}.") from error
  options = PipelineOptions(args)
  known = options.get_all_options(drop_default=True)
  unknown = sorted(set(options.get_all_options(retain_unknown_options=True, drop_default=True)) - set(known))
  if unknown:
    raise ValueError(
      f"{key}={flags!r}: Beam knows no option {', '.join('--' + name for name in unknown)} (expected Beam's pipeline "
      "flags, e.g. --runner=DataflowRunner --project=P --region=R --temp_location=gs://B/tmp)."
    )
  if options.view_as(StandardOptions).runner is None:
    options = PipelineOptions([*_LOCAL_FLAGS, *args])
    if "direct_num_workers" not in known:
      options.view_as(DirectOptions).direct_num_workers = os.cpu_count() or 1
  return options


def runner_name(options) -> str:
  from apache_beam.options.pipeline_options import StandardOptions

  runner = options.view_as(StandardOptions).runner
  return runner if isinstance(runner, str) else type(runner).__name__


def check_runner(options, key: str = "data.beam_options") -> None:
  """Refuses a runner Beam cannot create (a misspelled name; a runner whose package is not installed), before any
  work, naming it."""
  from apache_beam.runners.runner import create_runner

  name = runner_name(options)
  try:
    create_runner(name)
  except (ValueError, ImportError) as error:
    raise ValueError(f"{key} names runner {name!r}, which Beam cannot create: {error}") from error


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
  result = pipeline.run()
  result.wait_until_finish()
  for counter in result.metrics().query()["counters"]:
    logging.info("Beam counter %s: %d", counter.key.metric.name, counter.committed or counter.attempted or 0)
  _remove_staged(units)
  return [shards.read_stats(unit) for unit in units]


def _remove_staged(units: list[dict]) -> None:
  """Removes what killed workers left staged beside the shards (`<file>.tmp-<id>`; a worker that fails in Python
  removes its own): every unit's shards are whole now, so no writer of them is left."""
  for unit in units:
    for final in (unit["output"], shards.eval_file(unit["output"]), unit["output"] + ".stats.json"):
      for staged in epath.Path(final).parent.glob(epath.Path(final).name + ".tmp-*"):
        staged.unlink()
