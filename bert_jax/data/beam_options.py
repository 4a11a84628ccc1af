"""Apache Beam's pipeline options from `data.beam_options` (its command-line flags), checked before any work: the
corpus preparation pipeline (`prepare_beam`) and TFDS's Beam-built datasets (`text.prepare_tfds`) run with them; and
a pipeline run to its end (`run_pipeline`), whose failure, a runner that cannot start included, is one line."""

import os
import shlex

# The local runner's default: Beam's DirectRunner with a worker process per core (each loads the tokenizer once).
_LOCAL_FLAGS = ("--runner=DirectRunner", "--direct_running_mode=multi_processing")


class BeamPipelineError(RuntimeError):
  """A Beam pipeline that failed, or whose runner could not start; the message is one line naming the runner,
  `data.beam_options` and the cause (`--mode=prepare` prints it alone)."""


def run_pipeline(pipeline, options, flags: str, key: str = "data.beam_options") -> object:
  """Runs `pipeline` to its end; returns its result. Whatever the runner raises (a runner that cannot start: Flink's
  job server that cannot be fetched without network; a worker's error) becomes one `BeamPipelineError` line."""
  try:
    result = pipeline.run()
    result.wait_until_finish()
  except Exception as error:  # noqa: BLE001 - whatever the runner raised.
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    cause = f"{type(error).__name__}: {lines[0] if lines else 'no message'}"
    raise BeamPipelineError(
      f"The Beam pipeline on {runner_name(options)} ({key}={flags!r}) failed: {cause}"
      + ("" if cause.endswith(".") else ".")
    ) from None
  return result


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
