"""Apache Beam's pipeline options from `data.beam_options` (its command-line flags), checked before any work: the
corpus preparation pipeline (`prepare_beam`) and TFDS's Beam-built datasets (`text.prepare_tfds`) run with them."""

import os
import shlex

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
