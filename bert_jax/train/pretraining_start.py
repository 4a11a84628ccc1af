"""Pretraining's start policy, on the start order every job shares (`train/start_order.py`):

1. the workdir's newest readable checkpoint: a resume, which must have this config's shapes, architecture,
   optimizer, objective, teacher and tokenizer (the teacher and tokenizer by content, at any path; `init_from`, when
   still named, too: see `train/start_order.py`), and continues the same data stream on any host count (over the
   same number of readers, unless `data.restart_stream_on_reader_change`);
2. else `init_from`: a workdir's step (a previous phase) gives its state and step, with the data stream afresh;
   any other source (bundle, Hugging Face, Google) its weights, the heads it lacks from the seed and a fresh
   optimizer;
3. else what the objective starts a new run from (a distillation student: its teacher's layers), else the seed.

`resolve` decides all of it before anything is written and returns one value, an `Origin`: the source, its weights
(read), the tokenizer checking it loaded, and the run's reader count. Nothing computed is written into the config;
what a checkpoint records as the config is `Origin.record(config, model)`.
"""

import copy
import dataclasses
import functools

import jax
from absl import logging
from etils import epath

from bert_jax.data import mixture, phases
from bert_jax.data.batch_warmup import BatchSchedule
from bert_jax.data.tokenizer import Tokenizer
from bert_jax.handoff import formats, pretrained
from bert_jax.model import param_layout
from bert_jax.model.bert_config import ARCHITECTURE_FIELDS, PREDICTION_HEAD_FIELDS, SIZE_FIELDS, BertConfig, from_fields
from bert_jax.train import init_from, start_order
from bert_jax.train import step as step_lib
from bert_jax.train.objectives import registry
from bert_jax.train.run import Run
from bert_jax.workdir import checkpoints, reading


@dataclasses.dataclass(frozen=True)
class Origin:
  """Where a pretraining launch starts, resolved once before anything is written (`resolve`)."""

  # The data readers the stream is defined over: `data.num_readers`, else the resumed checkpoint's, else one per
  # host of this (first) launch. Checkpoints and pipeline states record it.
  num_readers: int
  # `init_from`'s source when this launch starts from it (None on a resume, or without `init_from`).
  source: formats.Source | None = None
  # The weights a new run starts from: the source's (not a workdir), read and checked; or, without a source, what
  # the objective starts a new run from (then `describes` says what they are).
  params: dict | None = None
  describes: str = ""
  # The config's tokenizer, when checking the source loaded it (else the corpus loads it).
  tokenizer: Tokenizer | None = None
  # The inputs identified by content (a teacher, `init_from`), checked on a resume; every checkpoint records them.
  inputs: tuple = ()

  def record(self, config, model: BertConfig):
    """The config a checkpoint records: `config` with the run's reader count and the prediction-head fields of
    `model` (the model trained), which `config` may leave unset."""
    recorded = copy.deepcopy(config)
    recorded.data.num_readers = self.num_readers
    recorded.model.update({name: getattr(model, name) for name in PREDICTION_HEAD_FIELDS})
    return recorded


def _check_compatible(saved: dict, config, where: str) -> None:
  """Raises if the checkpoint's config (a dict) has other parameter or optimizer-state shapes, or another
  architecture, than `config`. Keys a checkpoint predates take their defaults (BERT's)."""
  ours, theirs = from_fields(config.model.to_dict()), from_fields(saved["model"])
  different = [
    f"model.{name}: {getattr(theirs, name)!r} vs {getattr(ours, name)!r}"
    for name in SIZE_FIELDS + ARCHITECTURE_FIELDS
    if getattr(theirs, name) != getattr(ours, name)
  ]
  if saved.get("optimizer", "adamw") != config.optimizer:
    different.append(f"optimizer: {saved.get('optimizer', 'adamw')!r} vs {config.optimizer!r}")
  if different:
    raise ValueError(f"The checkpoint in {where} does not fit this config (checkpoint vs config): {different}.")


def saved_readers(data_position: dict) -> int | None:
  """The number of readers a checkpoint's data stream was defined over; before readers existed, each host was one."""
  return data_position.get("readers", data_position.get("hosts"))


def _other_stream(config, num_readers: int, data_position: dict) -> bool:
  """Whether the checkpoint's stream was defined over another number of readers than the run's (the synthetic
  source is one stream whatever the readers)."""
  return config.data.source != "synthetic" and saved_readers(data_position) not in (None, num_readers)


def _check_readers(config, data_position: dict, step: int) -> None:
  """A checkpoint continues the same stream on any host count, but only over the same number of readers (a
  config's 0 names the checkpoint's)."""
  readers = config.data.num_readers
  if not readers or not _other_stream(config, readers, data_position):
    return
  saved = saved_readers(data_position)
  if config.data.restart_stream_on_reader_change:
    logging.warning(
      "Checkpoint step %d's data stream was defined over %d reader(s), this run's over data.num_readers=%d: the "
      "stream restarts from its beginning (data.restart_stream_on_reader_change).",
      step,
      saved,
      readers,
    )
    return
  raise ValueError(
    f"Checkpoint step {step}'s data stream was defined over {saved} reader(s) (one per host before readers existed); "
    f"this run's over data.num_readers={readers}, a different stream that would repeat and skip "
    f"examples. Set data.num_readers={saved} (or 0: the checkpoint's) to continue it exactly on any host count, or "
    f"data.restart_stream_on_reader_change=True to continue from step {step} with the stream restarted."
  )


# The data schedules a resume may change only after its step (data/phases.py): key -> its empty value's meaning.
_SCHEDULES = {"data.mixture_phases": "0: tau=1", "data.masking_phases": ""}


def _check_schedules(saved: dict, config, step: int) -> None:
  """A resume continues the checkpoint's mixture and data schedules: the same sources (by name, in order; a corpus
  may have moved), and every schedule the same up to `step`, so that the steps trained are the steps it describes. A
  schedule may change after `step` where it begins a phase there (`phases.same_before`)."""
  if config.data.source == "synthetic":
    return
  data, before = config.data, saved.get("data", {})
  names, saved_names = list(mixture.sources(data)), list(mixture.sources(_Keys(before)))
  if names != saved_names:
    raise ValueError(
      f"Checkpoint step {step} was trained on the mixture {saved_names or 'none'} (data.mixture_sources), this "
      f"config names {names or 'none'}: a resume reads the same sources (declare every source from the start, and "
      "leave it out of the phases where it is not drawn). Use a new workdir, or init_from the checkpoint."
    )
  batches = BatchSchedule.of(config)
  new_end = phases.end_step(config)
  old_end = phases.end_step(_Keys(saved)) or new_end  # A checkpoint that records neither: as this config.
  for key, empty in _SCHEDULES.items():
    name = key.split(".")[1]
    if name not in data or (not names and key == "data.mixture_phases"):
      continue
    new_text, old_text = data[name] or empty, before.get(name, "") or empty
    if new_text == old_text and new_end == old_end:
      continue
    new = phases.resolved(phases.parse(new_text, key), batches, new_end, key) if new_text else []
    old = phases.resolved(phases.parse(old_text, key), batches, old_end, key) if old_text else []
    if not phases.same_before(old, new, step):
      raise ValueError(
        f"{key} changes the steps before checkpoint step {step}: the checkpoint's {old_text!r} (ending at step "
        f"{old_end}) against {new_text!r} (ending at {new_end}). A resume may change a schedule only after its step, "
        f"where the schedule begins a phase (e.g. add '; {step}: ...'); an interpolated phase keeps its end."
      )


class _Keys(dict):
  """A checkpoint's recorded config or `config.data` (a dict) read as the config's keys are
  (`data.mixture_sources`); a key it lacks reads as empty."""

  def __getattr__(self, name):
    return self.get(name, "")


def run_readers(config, data_position: dict | None) -> int:
  """The run's reader count: the config's if set, else the resumed checkpoint's, else one per host of this (first)
  launch; refused unless it divides the batch, and every size of a batch-size warmup."""
  saved = saved_readers(data_position) if data_position is not None else None
  readers = config.data.num_readers or saved or jax.process_count()
  if config.data.source != "synthetic" and config.batch_size % readers:
    raise ValueError(f"batch_size={config.batch_size} does not split over the checkpoint's {readers} data readers.")
  if config.data.source != "synthetic" and config.batch_warmup_tokens and config.batch_warmup_start % readers:
    raise ValueError(
      f"batch_warmup_start={config.batch_warmup_start} does not split over the run's {readers} data readers "
      "(data.num_readers, else the checkpoint's, else one per host): each reader makes an equal part of every batch."
    )
  return readers


def find_origin(config, workdir: str, model_cfg: BertConfig, run: Run) -> tuple[Origin, Run]:
  """Before anything is written: the checkpoint this run will start from (the workdir's newest readable one, else
  `init_from`'s) exists where the config names it and fits the config; a resume has the checkpoint's objective and
  frozen inputs (`start_order.check_frozen`). Then the run's frozen inputs (a teacher) are read, and `init_from`'s
  weights or the objective's start for a new run: read, and so checked. Returns the origin and the run with its
  frozen inputs read."""
  newest = start_order.newest_saved(config, workdir)
  inputs = run_inputs(config)
  if newest is not None:
    step, saved, data_position = newest
    _check_compatible(saved, config, "the workdir")
    if saved.get("objective", "bert") != config.objective:  # Checkpoints before objectives were all BERT's.
      raise ValueError(
        f"{checkpoints.checkpoint_dir(workdir)}/{step} was trained with objective={saved.get('objective', 'bert')!r}; "
        f"this config's is {config.objective!r}. Resume with the checkpoint's, or use a new workdir."
      )
    start_order.check_inputs(workdir, step, inputs)
    start_order.check_frozen(workdir, step, run.frozen)  # A checkpoint older than its inputs' record.
    _check_readers(config, data_position, step)
    _check_schedules(saved, config, step)
    return Origin(run_readers(config, data_position), inputs=inputs), run.read_frozen()
  readers = run_readers(config, None)
  if not config.init_from:  # A new run: the objective may say from what.
    run = run.read_frozen()
    params, describes = registry.of(config.objective).initial_params(config, run) or (None, "")
    return Origin(readers, params=params, describes=describes, inputs=inputs), run
  where = f"init_from={config.init_from}"
  source = init_from.read_source(config.init_from, where)
  inputs = run_inputs(config, source)  # Fingerprinted from this description, not a second one.
  if source.format == "workdir":  # A previous phase: its optimizer state and step too.
    _check_compatible(source.info, config, where)
  else:  # Weights only: a fresh optimizer.
    formats.check_fits(source, model_cfg, where)
  tokenizer = init_from.source_tokenizer(config, source, where)
  run = run.read_frozen()
  params = None
  if source.format != "workdir":  # Read, and so checked, before any write.
    _, params = pretrained.read_weights(source, scan_layers=model_cfg.scan_layers, mesh=run.mesh, rules=run.rules)
  # A previous phase's stream is not continued.
  return Origin(readers, source=source, params=params, tokenizer=tokenizer, inputs=inputs), run


def run_inputs(config, init_source: formats.Source | None = None) -> tuple[start_order.Input, ...]:
  """The inputs a pretraining run is identified by, by content: the teacher (distillation), `init_from`
  (`init_source`: its description, where the start has read it)."""
  inputs = []
  if config.objective == "distillation":
    inputs.append(init_from.source_input("distill.teacher", config.distill.teacher))
  if config.init_from:
    inputs.append(init_from.source_input("init_from", config.init_from, optional=True, source=init_source))
  return tuple(inputs)


def _restore(manager, step: int, run: Run, model_cfg: BertConfig):
  """(state, data position) from `manager`'s `step` in `run.shardings`, converted to this model's layer layout
  (scanned or unrolled) if it was saved in the other one."""
  saved = reading.read_config(manager, step)  # Findings by `resolve` before anything ran.
  saved_scanned = saved["model"].get("scan_layers", False)
  if saved_scanned == model_cfg.scan_layers:
    return start_order.restore_state(manager, step, run.abstract, run.shardings)
  logging.info(
    "Converting step %d's %s layer layout to this model's.", step, "scanned" if saved_scanned else "unrolled"
  )
  saved_model = run.model.clone(config=dataclasses.replace(model_cfg, scan_layers=saved_scanned))
  ema = run.abstract.ema is not None
  saved_abstract, saved_shardings = step_lib.state_shardings(saved_model, run.tx, run.mesh, run.rules, ema=ema)
  state, data_position = start_order.restore_state(manager, step, saved_abstract, saved_shardings)
  convert = functools.partial(param_layout.convert, scanned=model_cfg.scan_layers)
  return jax.jit(convert, out_shardings=run.shardings)(state), data_position


def start(config, run: Run, model_cfg: BertConfig, manager, identity, origin: Origin) -> start_order.Start:
  """Pretraining's start (see the module docstring) from what `resolve` found: a resume must use the same tokenizer
  (`identity`, the corpus's)."""
  restore = functools.partial(_restore, run=run, model_cfg=model_cfg)
  source = origin.source

  def fresh() -> start_order.Start:
    if source is not None and source.format == "workdir":
      with checkpoints.reader(epath.Path(source.path).parent) as source_manager:
        state, _ = restore(source_manager, source.step)
      started = f"step {int(state.step)}: initialised from {config.init_from}; the data stream starts afresh"
      return start_order.Start(state, {"examples": 0}, False, started)
    if origin.params is not None:
      state = run.init_state(config.seed, origin.params)
      fresh = step_lib.overwrite_params(run.abstract.params, origin.params)[1]
      what = f"the {source.format} weights in {config.init_from}" if source is not None else origin.describes
      started = (
        f"step 0: initialised from {what} (heads initialised from seed {config.seed}: {fresh or 'none'}); a "
        "fresh optimizer"
      )
      return start_order.Start(state, {"examples": 0}, False, started)
    started = f"step 0: a new run from seed {config.seed}"
    return start_order.Start(run.init_state(config.seed), {"examples": 0}, False, started)

  begun = start_order.start(config, manager, restore, fresh)
  if not begun.resumed:
    return begun
  data_position = begun.data_position
  start_order.check_tokenizer(data_position, identity)
  begun.started += f" ({data_position['examples']:,} examples consumed)"
  if _other_stream(config, origin.num_readers, data_position):  # Allowed by `resolve`.
    begun.data_position = dict(data_position, examples=0)
  return begun


def history(manager, step: int, source: formats.Source | None) -> dict:
  """What the model has been trained on before this run's first step (examples and sequence positions, padding
  included, over every phase), and its latest metrics: the resumed checkpoint's record, else a previous phase's
  (a workdir's or a bundle's, as described: the source is not opened again)."""
  record = {}
  if manager is not None:
    record = reading.read_history(manager, step)
  elif source is not None and source.format in ("workdir", "bundle"):
    record = source.history
  return dict({"examples_seen": 0, "token_positions_seen": 0}, **record)
