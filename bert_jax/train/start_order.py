"""Where a run starts, in this order, for every job (one place, so the order is never in doubt):

1. the workdir's newest committed checkpoint: state, data position and history (a resume);
2. else `config.init_from`, as the job's policy says: pretraining takes a workdir's (a previous phase's) state and
   step with the data stream afresh, or any other source's (bundle, Hugging Face, Google) weights, heads it lacks
   from the seed and a fresh optimizer; fine-tuning takes the encoder only, with one head per sweep member from its
   own seed (`finetune/job.py`);
3. else a fresh initialisation from `config.seed`.

`check_start` runs before anything is written; it refuses a checkpoint that does not fit the config, or whose data
stream was defined over another number of readers (unless `data.restart_stream_on_reader_change`; any host count
continues the same stream, see `data/pipeline.py`). A workdir with checkpoints never
reads `init_from` again, so phase 2 resumes even once phase 1's checkpoints are gone.

A checkpoint that fails its checksums (`checkpoints.CorruptCheckpointError`) stops the run, or with
`restore_fallback` the previous committed step is restored instead: the bad step is moved aside to
`<workdir>/corrupt_checkpoints/<step>` (`<step>.1`, `<step>.2`, ... if that step number was moved aside before; kept
for inspection, and never deleted or overwritten by the new saves).
Every item of a step takes part: any that is missing, cannot be read or does not match its checksum makes the step
corrupt, each named in one warning line.
Every host takes the same decisions: they read the same files, and the checksums are verified by one jitted
computation over the global arrays.
"""

import copy
import dataclasses
import functools

import jax
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from bert_jax.data.tokenizer import load_tokenizer
from bert_jax.handoff import pretrained
from bert_jax.model import param_layout
from bert_jax.model.bert_config import ARCHITECTURE_FIELDS, SIZE_FIELDS, BertConfig
from bert_jax.model.encoder import BertForPretraining
from bert_jax.train import step as step_lib
from bert_jax.train.run import Frozen, Run
from bert_jax.workdir import checkpoints


def _check_compatible(saved: dict, config, where: str) -> None:
  """Raises if the checkpoint's config (a dict) has other parameter or optimizer-state shapes, or another
  architecture, than `config`. Keys a checkpoint predates take their defaults (BERT's)."""
  ours, theirs = BertConfig(**config.model.to_dict()), BertConfig(**saved["model"])
  different = [
    f"model.{name}: {getattr(theirs, name)!r} vs {getattr(ours, name)!r}"
    for name in SIZE_FIELDS + ARCHITECTURE_FIELDS
    if getattr(theirs, name) != getattr(ours, name)
  ]
  if saved.get("optimizer", "adamw") != config.optimizer:
    different.append(f"optimizer: {saved.get('optimizer', 'adamw')!r} vs {config.optimizer!r}")
  if different:
    raise ValueError(f"The checkpoint in {where} does not fit this config (checkpoint vs config): {different}.")


CORRUPT = "corrupt_checkpoints"


def same_tokenizer(a: dict | None, b: dict | None) -> bool:
  """Whether two tokenizer identities name the same tokenizer: kind, content and casing; the path is informative
  only (a moved, copied or symlinked workdir keeps its tokenizer)."""
  if a is None or b is None:
    return a is b
  return {k: v for k, v in a.items() if k != "path"} == {k: v for k, v in b.items() if k != "path"}


def saved_readers(data_position: dict) -> int | None:
  """The number of readers a checkpoint's data stream was defined over; before readers existed, each host was one."""
  return data_position.get("readers", data_position.get("hosts"))


def _other_stream(config, data_position: dict) -> bool:
  """Whether the checkpoint's stream was defined over another number of readers than the config names (0 names
  none: the checkpoint's; the synthetic source is one stream whatever the readers)."""
  readers = config.data.num_readers
  return bool(readers) and config.data.source != "synthetic" and saved_readers(data_position) not in (None, readers)


def _check_readers(config, data_position: dict, step: int) -> None:
  """A checkpoint continues the same stream on any host count, but only over the same number of readers."""
  if not _other_stream(config, data_position):
    return
  saved = saved_readers(data_position)
  if config.data.restart_stream_on_reader_change:
    logging.warning(
      "Checkpoint step %d's data stream was defined over %d reader(s), this run's over data.num_readers=%d: the "
      "stream restarts from its beginning (data.restart_stream_on_reader_change).",
      step,
      saved,
      config.data.num_readers,
    )
    return
  raise ValueError(
    f"Checkpoint step {step}'s data stream was defined over {saved} reader(s) (one per host before readers existed); "
    f"this run's over data.num_readers={config.data.num_readers}, a different stream that would repeat and skip "
    f"examples. Set data.num_readers={saved} (or 0: the checkpoint's) to continue it exactly on any host count, or "
    f"data.restart_stream_on_reader_change=True to continue from step {step} with the stream restarted."
  )


def resolve_readers(config, data_position: dict | None):
  """A copy of `config` whose `data.num_readers` is the run's: the config's if set, else the resumed checkpoint's,
  else one per host of this (first) launch. Checkpoints and pipeline states record the resolved count."""
  resolved = copy.deepcopy(config)
  saved = saved_readers(data_position) if data_position is not None else None
  resolved.data.num_readers = config.data.num_readers or saved or jax.process_count()
  if config.data.source != "synthetic" and config.batch_size % resolved.data.num_readers:
    raise ValueError(
      f"batch_size={config.batch_size} does not split over the checkpoint's {resolved.data.num_readers} data readers."
    )
  return resolved


def _usable_steps(config, directory) -> list[int]:
  """The committed steps to try, newest first: all with `restore_fallback`, else the newest alone."""
  steps = sorted(checkpoints.committed_steps(directory), reverse=True)
  return steps if config.restore_fallback else steps[:1]


def newest_saved(config, workdir: str) -> tuple[int, dict, dict] | None:
  """(step, config, data position) of the workdir's newest step whose config and data items read (any step with
  `restore_fallback`, else the newest alone), read before anything is written; None without a checkpoint."""
  if not checkpoints.has_checkpoint(workdir):
    return None
  with checkpoints.read_only_manager(workdir) as manager:
    for step in _usable_steps(config, checkpoints.checkpoint_dir(workdir)):
      try:
        return step, checkpoints.read_config(manager, step), checkpoints.read_data_position(manager, step)
      except checkpoints.CorruptCheckpointError as error:
        if not config.restore_fallback:
          raise
        logging.info("Checking the previous step: %s", error.lines[0])  # The restore warns, per item.
  raise checkpoints.CorruptCheckpointError(f"No readable checkpoint in {checkpoints.checkpoint_dir(workdir)}.")


def check_same_run(config, workdir: str, keys: tuple[str, ...], absent: dict | None = None) -> None:
  """Before anything is written: a workdir's checkpoint resumes only the run it belongs to. Raises ValueError naming
  each of `keys` (dotted) whose value differs between the newest readable checkpoint's config and `config`, both
  values given. `absent`: for keys added after checkpoints were first written, the value a checkpoint that does
  not record them ran with."""
  newest = newest_saved(config, workdir)
  if newest is None:
    return
  step, saved, _ = newest
  different = []
  for key in keys:
    *parents, name = key.split(".")
    mine = functools.reduce(lambda node, parent: node[parent], parents, config)[name]
    theirs = functools.reduce(lambda node, parent: node.get(parent, {}), parents, saved).get(
      name, (absent or {}).get(key)
    )
    if theirs != mine:
      different.append(f"{key}={theirs!r} in the checkpoint, {mine!r} in the config")
  if different:
    raise ValueError(
      f"{checkpoints.checkpoint_dir(workdir)}/{step} is a checkpoint of another run: {'; '.join(different)}. "
      "Resume with the checkpoint's settings, or use a new workdir."
    )


def check_frozen(workdir: str, step: int, frozen: Frozen | None) -> None:
  """A resume reads the frozen inputs (a teacher) that trained its checkpoint: raises ValueError naming both if
  checkpoint `step`'s history records another identity than `frozen`'s (or none)."""
  if frozen is None:
    return
  with checkpoints.read_only_manager(workdir) as manager:
    recorded = checkpoints.read_history(manager, step).get(frozen.name)
  if recorded != frozen.identity:
    raise ValueError(
      f"{checkpoints.checkpoint_dir(workdir)}/{step} was trained with the {frozen.name} {recorded}; this run's is "
      f"{frozen.identity}. Name the same {frozen.name} (a workdir's checkpoint step names one step), or use a new "
      "workdir."
    )


def check_start(config, workdir: str, model_cfg: BertConfig, frozen: Frozen | None = None) -> tuple:
  """Before anything is written: the checkpoint this run will start from (the workdir's newest readable one, else
  `init_from`'s) exists where the config names it and fits the config; a resume has the checkpoint's objective and
  frozen inputs (`check_frozen`). Returns the run's config (`resolve_readers`), `init_from`'s source when the run
  will start from it (else None: `init_from` is described here, once) and the config's tokenizer when checking the
  source needed it (else None: the corpus loads it)."""
  newest = newest_saved(config, workdir)
  if newest is not None:
    step, saved, data_position = newest
    _check_compatible(saved, config, "the workdir")
    if saved.get("objective", "bert") != config.objective:  # Checkpoints before objectives were all BERT's.
      raise ValueError(
        f"{checkpoints.checkpoint_dir(workdir)}/{step} was trained with objective={saved.get('objective', 'bert')!r}; "
        f"this config's is {config.objective!r}. Resume with the checkpoint's, or use a new workdir."
      )
    check_frozen(workdir, step, frozen)
    _check_readers(config, data_position, step)
    return resolve_readers(config, data_position), None, None
  if not config.init_from:
    return resolve_readers(config, None), None, None
  where = f"init_from={config.init_from}"
  source = describe(config.init_from, where)
  if source.format == "workdir":  # A previous phase: its optimizer state and step too.
    _check_compatible(source.info, config, where)
  else:  # Weights only: a fresh optimizer.
    pretrained.check_fits(source, model_cfg, where)
  # A previous phase's stream is not continued.
  return resolve_readers(config, None), source, source_tokenizer(config, source, where)


def describe(path: str, where: str) -> pretrained.Source:
  """`pretrained.describe(path)`, its errors prefixed with `where` (the config key that names it)."""
  try:
    return pretrained.describe(path)
  except (FileNotFoundError, ValueError) as error:
    raise type(error)(f"{where}: {error}") from None


def source_tokenizer(config, source: pretrained.Source, where: str):
  """The config's tokenizer, refused unless it is the one `source` was trained with; None for synthetic data."""
  if config.data.source == "synthetic":
    return None
  if not config.tokenizer.path:
    raise ValueError(
      f"{where} was trained with the tokenizer {source.tokenizer_file}; set tokenizer.path to it (the run would "
      "train a new one)."
    )
  tokenizer = load_tokenizer(config.tokenizer.kind, config.tokenizer.path, config.tokenizer.lower_case)
  pretrained.check_tokenizer(source, tokenizer.identity(), where)
  return tokenizer


def _restore(manager, step: int | None, run: Run, model_cfg: BertConfig):
  """(state, data position) from `manager`'s `step` in `run.shardings`, converted to this model's layer layout
  (scanned or unrolled) if it was saved in the other one; None if `step` is None (no checkpoint)."""
  if step is None:
    return None
  saved = checkpoints.read_config(manager, step)  # Checked by check_start before anything ran.
  saved_scanned = saved["model"].get("scan_layers", False)
  if saved_scanned == model_cfg.scan_layers:
    return checkpoints.restore(manager, step, run.abstract, run.shardings)
  logging.info(
    "Converting step %d's %s layer layout to this model's.", step, "scanned" if saved_scanned else "unrolled"
  )
  saved_model = BertForPretraining(dataclasses.replace(model_cfg, scan_layers=saved_scanned))
  saved_abstract, saved_shardings = step_lib.state_shardings(saved_model, run.tx, run.mesh, run.rules)
  state, data_position = checkpoints.restore(manager, step, saved_abstract, saved_shardings)
  convert = functools.partial(param_layout.convert, scanned=model_cfg.scan_layers)
  return jax.jit(convert, out_shardings=run.shardings)(state), data_position


@dataclasses.dataclass
class Start:
  """Where a launch starts: the state, the data position to read from, whether it resumed this workdir's own
  checkpoint, and a line for the run's header."""

  state: object
  data_position: dict
  resumed: bool
  started: str


def start(config, manager, restore, fresh) -> Start:
  """The start order, for every job: the workdir's newest step that reads back whole (`restore(manager, step)` ->
  (state, data position), in the run's shardings; see the module docstring for `restore_fallback`), else
  `fresh()`: the job's policy for `init_from`, else for a fresh seed."""
  restored = _restore_newest(config, manager, restore)
  if restored is None:
    return fresh()
  state, data_position = restored
  step = int(jax.device_get(state.step).reshape(-1)[0])
  return Start(state, data_position, True, f"Resumed from step {step}")


def pretraining_start(
  config,
  run: Run,
  model_cfg: BertConfig,
  manager,
  identity,
  init_source: pretrained.Source | None,
  init_params: dict | None,
  init_origin: str = "",
) -> Start:
  """Pretraining's start: a resume must use the same tokenizer; `init_from` a workdir (a previous phase) gives
  its state and step, other sources their weights (heads they lack from the seed) and a fresh optimizer.
  `init_params` are `init_source`'s weights when it is not a workdir (read before anything was written), or,
  without `init_source`, what the objective starts a new run from (`init_origin` says what: a distillation
  student's layers from its teacher)."""
  restore = functools.partial(_restore, run=run, model_cfg=model_cfg)

  def fresh() -> Start:
    if init_source is not None and init_source.format == "workdir":
      with checkpoints.reader(epath.Path(init_source.path).parent) as source_manager:
        state, _ = restore(source_manager, init_source.step)
      started = f"step {int(state.step)}: initialised from {config.init_from}; the data stream starts afresh"
      return Start(state, {"examples": 0}, False, started)
    if init_params is not None:
      state = run.init_state(config.seed, init_params)
      fresh = step_lib.overwrite_params(run.abstract.params, init_params)[1]
      origin = f"the {init_source.format} weights in {config.init_from}" if init_source is not None else init_origin
      started = (
        f"step 0: initialised from {origin} (heads initialised from seed {config.seed}: {fresh or 'none'}); a "
        "fresh optimizer"
      )
      return Start(state, {"examples": 0}, False, started)
    return Start(run.init_state(config.seed), {"examples": 0}, False, f"step 0: a new run from seed {config.seed}")

  begun = start(config, manager, restore, fresh)
  if not begun.resumed:
    return begun
  data_position = begun.data_position
  if not same_tokenizer(data_position.get("tokenizer"), identity):
    raise ValueError(
      f"The checkpoint was trained with tokenizer {data_position.get('tokenizer')}; the config's is {identity}. "
      "Use the same tokenizer, or a new workdir."
    )
  begun.started += f" ({data_position['examples']:,} examples consumed)"
  if _other_stream(config, data_position):  # Allowed by check_start.
    begun.data_position = dict(data_position, examples=0)
  return begun


def warn_damaged(error: checkpoints.CorruptCheckpointError) -> None:
  """One warning line per damaged item of a step (the error's lines), the last saying the previous step is tried."""
  lines = getattr(error, "lines", None) or [str(error)]
  for line in lines[:-1]:
    logging.warning("%s", line)
  logging.warning("%s Trying the previous step (restore_fallback).", lines[-1])


def aside_path(directory, step: int) -> epath.Path:
  """Where damaged step `step` of the checkpoints `directory` is moved: `<workdir>/corrupt_checkpoints/<step>`, or
  `<step>.1`, `<step>.2`, ... when that step number was moved aside before (an earlier one is never replaced)."""
  root = epath.Path(directory).parent / CORRUPT
  aside, suffix = root / str(step), 0
  while aside.exists():
    suffix += 1
    aside = root / f"{step}.{suffix}"
  return aside


def _restore_newest(config, manager, restore):
  """`restore` of the newest step that reads back whole (see the module docstring), None if there is no step. The
  newer steps that did not are moved aside only once an older one has restored: if none does, the cause is more
  likely this code or its libraries than the storage, and nothing is moved."""
  steps, failed = _usable_steps(config, manager.directory), []
  for step in steps:
    try:
      state, data_position = restore(manager, step)
      if data_position.get("step", step) != step:
        raise checkpoints.CorruptCheckpointError(
          f"Checkpoint step {step}: its data item is from step {data_position['step']} "
          f"({epath.Path(manager.directory) / str(step) / 'data'})."
        )
    except checkpoints.CorruptCheckpointError as error:
      if not config.restore_fallback:
        raise
      warn_damaged(error)
      failed.append((step, error))
      continue
    for bad, _ in failed:
      aside = aside_path(manager.directory, bad)
      multihost_utils.sync_global_devices(f"bert_jax: checkpoint {bad} aside name chosen")  # The same on every host.
      logging.warning("Restored step %d instead of step %d; moving step %d to %s.", step, bad, bad, aside)
      if jax.process_index() == 0:
        aside.parent.mkdir(parents=True, exist_ok=True)
        (epath.Path(manager.directory) / str(bad)).rename(aside)
      multihost_utils.sync_global_devices(f"bert_jax: checkpoint {bad} moved aside")
    if failed:
      manager.reload()
    return state, data_position
  if failed:
    raise checkpoints.CorruptCheckpointError(
      f"No checkpoint in {manager.directory} reads back whole (nothing was moved); the newest: {failed[0][1]}"
    )
  return None


def history(manager, step: int, init_source: pretrained.Source | None) -> dict:
  """What the model has been trained on before this run's first step (examples and sequence positions, padding
  included, over every phase), and its latest metrics: the resumed checkpoint's record, else a previous phase's."""
  record = {}
  if manager is not None:
    record = checkpoints.read_history(manager, step)
  elif init_source is not None and init_source.format == "workdir":
    with checkpoints.reader(epath.Path(init_source.path).parent) as source_manager:
      record = checkpoints.read_history(source_manager, init_source.step)
  elif init_source is not None and init_source.format == "bundle":
    record = init_source.info.get("history", {})
  return dict({"examples_seen": 0, "token_positions_seen": 0}, **record)
