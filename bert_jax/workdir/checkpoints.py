"""Orbax checkpoints in the workdir (a local path or `gs://...`).

Each checkpoint step, `<workdir>/checkpoints/<step>/`, holds these items:

* `params`: the model parameters (sharded arrays), on their own so that a fine-tuning job, an export or
  `bert_jax.handoff.pretrained.load` reads them without ever reading the optimizer moments (2x their bytes);
* `optimizer`: the optimizer state and step;
* `data`: the data position (examples consumed) and the tokenizer's identity (JSON);
* `config`: the run's config (JSON);
* `history`: examples and sequence positions trained on over every phase, latest train and eval metrics (JSON);
* `tokenizer`: the tokenizer file itself (`vocab.txt`, the SentencePiece `.model` or a byte-level BPE's
  `tokenizer.json`) with its identity, when the run has a tokenizer, so that a step directory is complete on its own;
* `checksums`: a hash of every array of `params` and `optimizer` and a SHA-256 of every other item
  (`workdir/checksums.py`). Every read verifies what it read against them and raises `CorruptCheckpointError` naming the
  array or item, the step and the directory; so does any other failure to read an item. A save refuses parameters
  that are not finite, and refuses to replace an existing step (Orbax would delete it).

Checkpoints written before `params` and `optimizer` were separate hold one `state` item (the whole TrainState);
they still resume, and their parameters still load alone.

Orbax writes each step to a temporary directory and commits it by rename (or a commit marker on GCS), so a step
that is listed is whole; leftover temporaries from a killed run are removed when the manager opens. Only listed
(committed) steps are ever read.
"""

import contextlib
import copy
import dataclasses
import json
import logging as pylogging

import jax
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from bert_jax import paths, sharding
from bert_jax.train.step import initial_guard
from bert_jax.workdir import checksums

CHECKPOINTS = "checkpoints"
BEST = "best"  # A fine-tuning run's best step by its task's main metric, kept apart from rotation.
_LEGACY_STATE = "state"
_CHECKSUMS = "checksums"


class CorruptCheckpointError(ValueError):
  """Checkpoint items that cannot be read, are missing, or do not match their checksums; one line per item (`lines`),
  each naming the step, the item and its path."""

  def __init__(self, *lines: str):
    super().__init__("\n".join(lines))
    self.lines = list(lines)


class SaveError(RuntimeError):
  """A checkpoint save failed (disk full, permission, ...); the message names the step, the path and the cause."""


def checkpoint_dir(workdir: str) -> epath.Path:
  return paths.absolute(workdir) / CHECKPOINTS


def data_state_dir(workdir: str, step: int) -> str:
  """Where the input pipeline's readers keep their state for checkpoint `step` (beside Orbax's steps), each in a
  directory of its own that the host running it writes."""
  return f"{workdir}/pipeline_state/{step}"


def remove_stale_data_states(workdir: str, current: int) -> None:
  """Process 0 deletes the pipeline states whose checkpoint step is gone from disk (keeps `current`).

  Orbax drops an old step from `all_steps()` when a new save starts but deletes it only once the new step is
  committed: the directory on disk, not the manager's list, says whether a state can still be needed. A stale
  state is never read again, whichever host wrote it.
  """
  root = epath.Path(workdir) / "pipeline_state"
  if jax.process_index() != 0 or not root.exists():
    return
  try:
    on_disk = {int(p.name) for p in checkpoint_dir(workdir).iterdir() if p.name.isdigit()}
  except FileNotFoundError:  # On GCS a directory is its objects: none yet while the first save is under way.
    on_disk = set()
  for step_dir in root.iterdir():
    if step_dir.name.isdigit() and int(step_dir.name) not in on_disk | {current}:
      step_dir.rmtree()


class TokenizerCheckpointHandler(ocp.handlers.JsonCheckpointHandler):
  """The tokenizer file, byte for byte, under its own name, and its identity in `identity.json` (process 0)."""

  async def _save_fn(self, item, directory):
    if jax.process_index() == 0:
      (directory / item["identity"]["filename"]).write_bytes(item["content"])
      (directory / "identity.json").write_text(json.dumps(item["identity"]))

  def restore(self, directory: epath.Path, item=None, args=None) -> dict:
    """The identity, plus `file`: the path of the tokenizer file inside the checkpoint."""
    identity = json.loads((directory / "identity.json").read_text())
    return dict(identity, file=str(directory / identity["filename"]))


@ocp.args.register_with_handler(TokenizerCheckpointHandler, for_save=True)
@dataclasses.dataclass
class TokenizerSave(ocp.args.CheckpointArgs):
  item: dict  # {"identity": {..., "filename": ...}, "content": bytes}


@ocp.args.register_with_handler(TokenizerCheckpointHandler, for_restore=True)
@dataclasses.dataclass
class TokenizerRestore(ocp.args.CheckpointArgs):
  item: None = None


def tokenizer_item(tokenizer) -> dict:
  """What the `tokenizer` item saves of a bert_jax Tokenizer: its identity and its file's bytes (a byte-level BPE:
  its canonical `tokenizer.json`, whatever files it was read from)."""
  return {"identity": dict(tokenizer.identity(), filename=tokenizer.file_name), "content": tokenizer.file_content()}


# Orbax writes an array that several devices hold whole (replicated) from every replica at once, each a slice of it.
# For a slice under this size the parallel write gains nothing and costs a compiled slicing program per array shape
# and device (200 programs in the first saves of a small fine-tuning run on 8 devices): such an array is written
# whole by one replica. A large model's big arrays are still written in parallel.
MIN_REPLICA_SLICE_BYTES = 1 << 20


def _write_small_arrays_from_one_replica() -> None:
  """Registers Orbax's jax.Array handler (its default, metadata store included) with MIN_REPLICA_SLICE_BYTES."""
  handler = copy.copy(ocp.type_handlers.get_type_handler(jax.Array))
  if not hasattr(handler, "_min_slice_bytes_for_replica_parallel"):  # Another Orbax: keep its default, say so.
    logging.warning("orbax-checkpoint's ArrayHandler has no replica-slice threshold; small arrays are sliced.")
    return
  handler._min_slice_bytes_for_replica_parallel = MIN_REPLICA_SLICE_BYTES  # noqa: SLF001 - its constructor's argument.
  ocp.type_handlers.register_type_handler(jax.Array, handler, override=True)


_write_small_arrays_from_one_replica()


def make_manager(workdir: str, keep: int, name: str = CHECKPOINTS) -> ocp.CheckpointManager:
  """Keeps the newest `keep` steps in `<workdir>/<name>`; saves run in the background (`wait_until_finished`
  before exit)."""
  options = ocp.CheckpointManagerOptions(
    max_to_keep=keep, create=True, cleanup_tmp_directories=True, enable_async_checkpointing=True
  )
  return ocp.CheckpointManager(paths.absolute(workdir) / name, options=options)


def save(
  manager: ocp.CheckpointManager,
  step: int,
  state,
  data_position: dict,
  config,
  tokenizer: dict | None = None,
  history: dict | None = None,
) -> None:
  """Starts saving `step` in the background; device buffers are copied before this returns. `tokenizer` (a
  `tokenizer_item`, or None for a run without one) is written into the step as a file; `history` (examples and
  tokens seen over every phase, latest train and eval metrics) as JSON. Raises before writing anything if a parameter
  is not finite or if `step` is already on disk."""
  existing = epath.Path(manager.directory) / str(step)
  if existing.exists():
    raise FileExistsError(f"Checkpoint step {step} already exists in {manager.directory}; it is never replaced.")
  optimizer = {"step": state.step, "opt_state": state.opt_state, "guard": state.guard}
  params_hashes, nonfinite = checksums.arrays(state.params, "params")
  if nonfinite:
    raise ValueError(f"Not saving step {step}: these parameters are not finite: {nonfinite[:10]}.")
  small = dict(
    data=data_position, config=json.loads(config.to_json_best_effort()), history=json.loads(json.dumps(history or {}))
  )
  digests = {name: checksums.digest(value) for name, value in small.items()}
  items = dict(
    params=ocp.args.StandardSave(state.params),
    optimizer=ocp.args.StandardSave(optimizer),
    **{name: ocp.args.JsonSave(value) for name, value in small.items()},
  )
  if tokenizer is not None:
    items["tokenizer"] = TokenizerSave(tokenizer)
    digests["tokenizer"] = checksums.digest(tokenizer["content"])
  arrays = dict(params_hashes, **checksums.arrays(optimizer, "optimizer")[0])
  items[_CHECKSUMS] = ocp.args.JsonSave({"arrays": arrays, "items": digests})
  try:
    manager.save(step, force=True, args=ocp.args.Composite(**items))
  except Exception as error:  # noqa: BLE001 - whatever the storage raised.
    raise _save_error(manager, step, error) from None


def _cause(error: Exception) -> str:
  """The last line of a storage error: what the file system said (e.g. "... File too large [os_error_code='27']")."""
  return str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__


def _save_error(manager: ocp.CheckpointManager, step: int | None, error: Exception) -> SaveError:
  cause = _cause(error)
  where = epath.Path(manager.directory) / str(step) if step is not None else manager.directory
  kept = manager.latest_step()
  return SaveError(
    f"Saving checkpoint step {step} to {where} failed: {cause}. The run stops; "
    + (f"its newest checkpoint is step {kept}." if kept is not None else "it has no checkpoint.")
  )


def save_data_state(source, state_dir: str, step: int) -> None:
  """`source.save_state(state_dir)` (written now, not in the background); a failure raises `SaveError`."""
  try:
    source.save_state(state_dir)
  except Exception as error:  # noqa: BLE001 - whatever the storage raised.
    raise SaveError(
      f"Saving the input pipeline's state for step {step} to {state_dir} failed: {_cause(error)}"
    ) from None


def check_saves(manager: ocp.CheckpointManager, step: int | None, wait: bool = False) -> None:
  """Raises `SaveError` if the background save of `step` (the newest started) has failed; returns at once while it
  is still running, unless `wait`. Called after every train step, so a failed save stops the run a step later, and
  with `wait` before the next save."""
  if step is None or (manager.is_saving_in_progress() and not wait):
    return
  try:
    manager.wait_until_finished()  # Finished: returns at once, or raises the save's error.
  except Exception as error:  # noqa: BLE001 - whatever the storage raised.
    raise _save_error(manager, step, error) from None


def finish(manager: ocp.CheckpointManager, step: int | None, raise_errors: bool = True) -> None:
  """Waits for the save in flight (never exit with a checkpoint half-written) and closes the manager. A failed save
  raises `SaveError`, or, with `raise_errors=False` (the run is already failing with another error), is logged."""
  try:
    manager.wait_until_finished()
  except Exception as error:  # noqa: BLE001
    if raise_errors:
      raise _save_error(manager, step, error) from None
    logging.error("%s", _save_error(manager, step, error))
  finally:
    manager.close()


def reader(directory) -> ocp.CheckpointManager:
  """A manager that reads the checkpoint steps in `directory` (and never deletes or writes any)."""
  options = ocp.CheckpointManagerOptions(read_only=True, save_interval_steps=0, create=False)
  with _quiet_orbax_warnings():  # "Given directory is read only": what a reader asks for.
    return ocp.CheckpointManager(paths.absolute(directory), options=options)


@contextlib.contextmanager
def _quiet_orbax_warnings():
  previous = logging.get_verbosity()
  logging.set_verbosity(logging.ERROR)
  try:
    yield
  finally:
    logging.set_verbosity(previous)


def read_only_manager(workdir: str) -> ocp.CheckpointManager:
  """A reader of another run's checkpoints, `<workdir>/checkpoints/<step>`."""
  return reader(checkpoint_dir(workdir))


def committed_steps(directory) -> list[int]:
  """The steps in a checkpoints `directory` that Orbax has committed, from the directory alone: no manager and
  no collective, so any host may ask at any time (a read-only manager syncs all hosts when it opens, and hosts
  that disagreed on whether `checkpoints/` existed yet failed in that sync)."""
  directory = epath.Path(directory)
  if not directory.exists():
    return []
  candidates = [path for path in directory.iterdir() if path.name.isdigit()]
  return sorted(int(path.name) for path in candidates if ocp.utils.is_checkpoint_finalized(path))


def has_checkpoint(workdir: str) -> bool:
  """Whether `workdir` holds at least one complete checkpoint step (reads only)."""
  return bool(committed_steps(checkpoint_dir(workdir)))


def items(manager: ocp.CheckpointManager, step: int) -> set[str]:
  """The items checkpoint `step` holds (see the module docstring)."""
  return {path.name for path in (epath.Path(manager.directory) / str(step)).iterdir() if path.is_dir()}


def _summary(error: Exception) -> str:
  """One line of what a library raised (its messages can run to pages)."""
  lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
  text = lines[0] if lines else ""
  return f"{type(error).__name__}: {text[:300]}" if text else type(error).__name__


@contextlib.contextmanager
def _quiet_libraries():
  """While a restore is attempted, the libraries' own error logs (Orbax and tensorstore log a traceback per
  damaged file, about a thousand lines for a truncated item) are dropped: the failure is raised, then named in
  one line per item by the caller."""
  previous = logging.get_verbosity()
  loggers = [pylogging.getLogger(name) for name in ("absl", "orbax", "tensorstore", "jax")]
  levels = [logger.level for logger in loggers]
  logging.set_verbosity(logging.FATAL)
  for logger in loggers:
    logger.setLevel(pylogging.CRITICAL + 1)
  try:
    yield
  finally:
    for logger, level in zip(loggers, levels, strict=True):
      logger.setLevel(level)
    logging.set_verbosity(previous)


def _restore_items(manager: ocp.CheckpointManager, step: int, **args) -> dict:
  """`manager.restore` of the named items, each on its own; raises `CorruptCheckpointError` with one line per item
  that is missing or cannot be read, naming the step, the item and its path."""
  restored, damaged = {}, []
  where = epath.Path(manager.directory) / str(step)
  for name, arg in args.items():
    if not (where / name).exists():
      damaged.append(f"Checkpoint step {step}: item {name} is missing ({where / name}).")
      continue
    try:
      with _quiet_libraries():
        restored[name] = manager.restore(step, args=ocp.args.Composite(**{name: arg}))[name]
    except Exception as error:  # noqa: BLE001 - whatever a damaged file raises, say which one.
      damaged.append(f"Checkpoint step {step}: cannot read item {name} ({where / name}): {_summary(error)}")
  if damaged:
    raise CorruptCheckpointError(*damaged)
  return restored


def _checksums(manager: ocp.CheckpointManager, step: int) -> dict | None:
  """The `checksums` item of `step`; None for a step written before checksums (with a warning).

  A step is told to be older than checksums by its `optimizer` (or legacy `state`) item lacking the step guard's
  state: the guard and the checksums came in with the same change, so a step whose optimizer holds the guard was
  written with checksums, and without its `checksums` item it is corrupt (never read unverified)."""
  present = items(manager, step)
  if _CHECKSUMS in present:
    return _restore_items(manager, step, **{_CHECKSUMS: ocp.args.JsonRestore()})[_CHECKSUMS]
  where = epath.Path(manager.directory) / str(step)
  item = "optimizer" if "optimizer" in present else _LEGACY_STATE if _LEGACY_STATE in present else None
  if item is None or _saved_guard(manager, step, item):
    raise CorruptCheckpointError(
      f"Checkpoint step {step}: item {_CHECKSUMS} is missing ({where / _CHECKSUMS}), and the step is of a format "
      "written with checksums (its optimizer holds the step guard's state): it is never read unverified."
    )
  logging.warning("Checkpoint step %d in %s has no checksums (an older format): not verified.", step, where)
  return None


def _item_mismatch(manager: ocp.CheckpointManager, step: int, name: str, value, saved: dict | None) -> str | None:
  """A line naming item `name` if `value` (what was read of it) does not match its saved digest, else None."""
  if saved is not None and saved["items"].get(name) != checksums.digest(value):
    where = epath.Path(manager.directory) / str(step) / name
    return f"Checkpoint step {step}: item {name}: {where} does not match its checksum."
  return None


def _verify_item(manager: ocp.CheckpointManager, step: int, name: str, value, saved: dict | None = None) -> None:
  mismatch = _item_mismatch(manager, step, name, value, saved or _checksums(manager, step))
  if mismatch:
    raise CorruptCheckpointError(mismatch)


def _array_mismatch(manager: ocp.CheckpointManager, step: int, tree, prefix: str, saved: dict | None) -> str | None:
  """A line naming the first array of `tree` (read from item `prefix`) whose hash is not the saved one, else None."""
  if saved is None:
    return None
  found = checksums.arrays(tree, prefix)[0]
  for name, value in found.items():
    if saved["arrays"].get(name) != value:
      return (
        f"Checkpoint step {step}: array {name} read from {epath.Path(manager.directory) / str(step) / prefix} does "
        f"not match its checksum (saved {saved['arrays'].get(name)}, read {value}): the checkpoint is corrupt."
      )
  return None


def _verify_arrays(manager: ocp.CheckpointManager, step: int, tree, prefix: str, saved: dict | None = None) -> None:
  """Raises naming the first array of `tree` (read from item `prefix`) whose hash is not the saved one."""
  mismatch = _array_mismatch(manager, step, tree, prefix, saved or _checksums(manager, step))
  if mismatch:
    raise CorruptCheckpointError(mismatch)


def _tokenizer_bytes(step: int, tokenizer: dict) -> bytes:
  try:
    return epath.Path(tokenizer["file"]).read_bytes()
  except Exception as error:  # noqa: BLE001
    raise CorruptCheckpointError(
      f"Checkpoint step {step}: cannot read item tokenizer ({tokenizer['file']}): {_summary(error)}"
    ) from None


def _small_items(manager: ocp.CheckpointManager, step: int, saved: dict | None) -> dict:
  """Restore args of every item of `step` besides the arrays: `data` and `config` always, the others if the step
  holds them or its checksums name them (a missing one is then named)."""
  names = {"data", "config"} | ({"history", "tokenizer"} & items(manager, step)) | set((saved or {}).get("items", {}))
  return {name: TokenizerRestore() if name == "tokenizer" else ocp.args.JsonRestore() for name in sorted(names)}


def _small_mismatches(manager: ocp.CheckpointManager, step: int, restored: dict, saved: dict | None) -> list[str]:
  """A line per item of `restored` besides the arrays that does not match its saved digest."""
  found = []
  for name, value in restored.items():
    if name in ("params", "optimizer", _LEGACY_STATE):
      continue
    if name == "tokenizer":
      value = _tokenizer_bytes(step, value)
    found.append(_item_mismatch(manager, step, name, value, saved))
  return [line for line in found if line]


def _read_json(manager: ocp.CheckpointManager, step: int, name: str) -> dict:
  value = _restore_items(manager, step, **{name: ocp.args.JsonRestore()})[name]
  _verify_item(manager, step, name, value)
  return value


def read_config(manager: ocp.CheckpointManager, step: int) -> dict:
  """The config checkpoint `step` was written with, as a plain dict."""
  return _read_json(manager, step, "config")


def read_data_position(manager: ocp.CheckpointManager, step: int) -> dict:
  """The data position (examples consumed, tokenizer identity) saved with checkpoint `step`."""
  return _read_json(manager, step, "data")


def read_history(manager: ocp.CheckpointManager, step: int) -> dict:
  """The training history saved with checkpoint `step` (see `save`); empty for steps written without one."""
  if "history" not in items(manager, step):
    return {}
  return _read_json(manager, step, "history")


def read_tokenizer(manager: ocp.CheckpointManager, step: int) -> dict | None:
  """The tokenizer item of checkpoint `step` (identity and `file`), or None if the step has none."""
  if "tokenizer" not in items(manager, step):
    return None
  tokenizer = _restore_items(manager, step, tokenizer=TokenizerRestore())["tokenizer"]
  _verify_item(manager, step, "tokenizer", _tokenizer_bytes(step, tokenizer))
  return tokenizer


def _saved_guard(manager: ocp.CheckpointManager, step: int, item: str = "optimizer") -> bool:
  """Whether step's `item` holds the step guard's state (steps written before the guard do not)."""
  directory = epath.Path(manager.directory) / str(step) / item
  try:
    with _quiet_libraries():
      return isinstance(ocp.StandardCheckpointHandler().metadata(directory).tree.get("guard"), dict)
  except Exception as error:  # noqa: BLE001
    raise CorruptCheckpointError(
      f"Checkpoint step {step}: cannot read item {item} ({directory}), its metadata: {_summary(error)}"
    ) from None


def restore(manager: ocp.CheckpointManager, step: int, abstract_state, shardings):
  """(state, data_position) of checkpoint `step`, placed directly into `shardings`. Every item of the step is read
  and verified against its checksums (a step without them is refused unless it is older than checksums, see
  `_checksums`); `CorruptCheckpointError` names each item that is missing, unreadable or does not match."""
  target = sharding.with_shardings(abstract_state, shardings)
  saved = _checksums(manager, step)
  small = _small_items(manager, step, saved)
  if _LEGACY_STATE in items(manager, step):
    with_guard = _saved_guard(manager, step, _LEGACY_STATE)
    legacy = target if with_guard else target.replace(guard=None)
    restored = _restore_items(manager, step, state=ocp.args.StandardRestore(legacy), **small)
    mismatches = _small_mismatches(manager, step, restored, saved)
    if mismatches:
      raise CorruptCheckpointError(*mismatches)
    state = restored["state"]
    if not with_guard:
      state = state.replace(guard=jax.device_put(initial_guard(), shardings.guard))
    return state, restored["data"]
  optimizer_target = {"step": target.step, "opt_state": target.opt_state}
  with_guard = _saved_guard(manager, step)
  if with_guard:
    optimizer_target["guard"] = target.guard
  restored = _restore_items(
    manager,
    step,
    params=ocp.args.StandardRestore(target.params),
    optimizer=ocp.args.StandardRestore(optimizer_target),
    **small,
  )
  optimizer = restored["optimizer"]
  mismatches = [
    _array_mismatch(manager, step, restored["params"], "params", saved),
    _array_mismatch(manager, step, optimizer, "optimizer", saved),
    *_small_mismatches(manager, step, restored, saved),
  ]
  if any(mismatches):
    raise CorruptCheckpointError(*[line for line in mismatches if line])
  guard = optimizer["guard"] if with_guard else jax.device_put(initial_guard(), shardings.guard)
  state = type(abstract_state)(
    step=optimizer["step"], params=restored["params"], opt_state=optimizer["opt_state"], guard=guard
  )
  return state, restored["data"]


def restore_params(manager: ocp.CheckpointManager, step: int, abstract_params, shardings):
  """The parameters of checkpoint `step` alone, placed directly into `shardings` and verified against its
  checksums: the optimizer state is never read (from a legacy `state` item, only its `params` subtree is)."""
  target = sharding.with_shardings(abstract_params, shardings)
  if _LEGACY_STATE in items(manager, step):
    restore_args = jax.tree.map(lambda t: ocp.ArrayRestoreArgs(sharding=t.sharding), target)
    restored = _restore_items(
      manager,
      step,
      state=ocp.args.PyTreeRestore(
        item={"params": target}, restore_args={"params": restore_args}, partial_restore=True
      ),
    )
    return restored["state"]["params"]
  params = _restore_items(manager, step, params=ocp.args.StandardRestore(target))["params"]
  _verify_arrays(manager, step, params, "params")
  return params


def restore_config(workdir: str, step: int | None = None) -> dict:
  """The config a checkpoint was written with (newest step by default), as a plain dict."""
  with read_only_manager(workdir) as manager:
    step = manager.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"No checkpoint under {checkpoint_dir(workdir)}.")
    return read_config(manager, step)
