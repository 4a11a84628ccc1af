"""Reading a checkpoint step back, verified: each item restored on its own, then checked against the step's
checksums (`checksums.py`); any item that is missing, unreadable or different raises `CorruptCheckpointError` naming
the step, the item and its path. The train state restores straight into its shardings (with the parameters' moving
average where the run keeps one), the parameters (or their moving average) alone without the optimizer state, the
small JSON items (config, data position, history, tokenizer) one by one. The items of a step: `checkpoints.py`."""

import contextlib
import logging as pylogging

import jax
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from bert_jax import sharding
from bert_jax.workdir import checksums
from bert_jax.workdir.checkpoints import CHECKSUMS, EMA, LEGACY_STATE, CorruptCheckpointError, TokenizerRestore


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
  one line per item by the caller. The loggers' own levels ("absl" is absl's logger), not absl's verbosity, as
  `checkpoints._quiet_orbax_warnings` explains."""
  loggers = [pylogging.getLogger(name) for name in ("absl", "orbax", "tensorstore", "jax")]
  levels = [logger.level for logger in loggers]
  for logger in loggers:
    logger.setLevel(pylogging.CRITICAL + 1)
  try:
    yield
  finally:
    for logger, level in zip(loggers, levels, strict=True):
      logger.setLevel(level)


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
  if CHECKSUMS in present:
    return _restore_items(manager, step, **{CHECKSUMS: ocp.args.JsonRestore()})[CHECKSUMS]
  where = epath.Path(manager.directory) / str(step)
  item = "optimizer" if "optimizer" in present else LEGACY_STATE if LEGACY_STATE in present else None
  if item is None or _saved_guard(manager, step, item):
    raise CorruptCheckpointError(
      f"Checkpoint step {step}: item {CHECKSUMS} is missing ({where / CHECKSUMS}), and the step is of a format "
      "written with checksums (its optimizer holds the step guard's state): it is never read unverified."
    )
  logging.warning("Checkpoint step %d in %s has no checksums (an older format): not verified.", step, where)
  return None


def read_checksums(manager: ocp.CheckpointManager, step: int) -> dict | None:
  """The `checksums` item of `step` (a hash of every array and a SHA-256 of every other item); None for a step
  written before checksums."""
  return _checksums(manager, step)


def _saved_item(saved: dict | None, item: str) -> bool:
  """Whether the step's checksums record arrays of `item` (so the step was written with it)."""
  return any(name.startswith(f"{item}/") for name in (saved or {}).get("arrays", {}))


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
    if name in ("params", "optimizer", EMA, LEGACY_STATE):
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
  `_checksums`); `CorruptCheckpointError` names each item that is missing, unreadable or does not match. A step
  written before the step guard existed restores with `guard=None`, and a step without the parameters' moving
  average that `abstract_state` keeps (one of a run that kept none) with `ema=None`: the caller fills them in
  (`train/start_order.restore_state`). A step's moving average that `abstract_state` does not keep is not read."""
  target = sharding.with_shardings(abstract_state, shardings)
  saved = _checksums(manager, step)
  small = _small_items(manager, step, saved)
  present = items(manager, step)
  if LEGACY_STATE in present:
    with_guard = _saved_guard(manager, step, LEGACY_STATE)
    legacy = target.replace(ema=None) if with_guard else target.replace(guard=None, ema=None)
    restored = _restore_items(manager, step, state=ocp.args.StandardRestore(legacy), **small)
    mismatches = _small_mismatches(manager, step, restored, saved)
    if mismatches:
      raise CorruptCheckpointError(*mismatches)
    return restored["state"], restored["data"]
  optimizer_target = {"step": target.step, "opt_state": target.opt_state}
  with_guard = _saved_guard(manager, step)
  if with_guard:
    optimizer_target["guard"] = target.guard
  arrays = dict(params=ocp.args.StandardRestore(target.params), optimizer=ocp.args.StandardRestore(optimizer_target))
  if target.ema is not None and (EMA in present or _saved_item(saved, EMA)):  # A lost `ema` item is named.
    arrays[EMA] = ocp.args.StandardRestore(target.ema)
  restored = _restore_items(manager, step, **arrays, **small)
  optimizer = restored["optimizer"]
  mismatches = [
    *(_array_mismatch(manager, step, restored[name], name, saved) for name in arrays),
    *_small_mismatches(manager, step, restored, saved),
  ]
  if any(mismatches):
    raise CorruptCheckpointError(*[line for line in mismatches if line])
  state = type(abstract_state)(
    step=optimizer["step"],
    params=restored["params"],
    opt_state=optimizer["opt_state"],
    guard=optimizer.get("guard"),
    ema=restored.get(EMA),
  )
  return state, restored["data"]


def _beside(manager: ocp.CheckpointManager, step: int, target: dict, item: str) -> dict:
  """The top-level subtrees of step's `item` (`params`, or their moving average) that `target` lacks (a pretraining
  objective's own head beside the model's: SpanBERT's `span_boundary`), as ShapeDtypeStructs replicated where
  `target` lies; none where the item's metadata cannot be read: the restore that follows names what is wrong with
  the item."""
  directory = epath.Path(manager.directory) / str(step) / item
  try:
    with _quiet_libraries():
      saved = ocp.StandardCheckpointHandler().metadata(directory).tree
  except Exception:  # noqa: BLE001 - whatever a damaged item raises: `_restore_items` says it, naming the item.
    return {}
  placed = jax.tree.leaves(target)[0].sharding
  where = sharding.replicated(placed.mesh) if isinstance(placed, jax.sharding.NamedSharding) else placed
  return {
    name: jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=where), tree)
    for name, tree in saved.items()
    if name not in target
  }


def restore_params(manager: ocp.CheckpointManager, step: int, abstract_params, shardings, item: str = "params"):
  """The parameters of checkpoint `step` alone (`item`: "params", or "ema", their moving average), placed directly
  into `shardings` and verified against its checksums: the optimizer state is never read (from a legacy `state`
  item, only its `params` subtree is). A subtree the step holds beside those of `abstract_params` (an objective's
  own head, `_beside`) is read and verified with them, then left out."""
  target = sharding.with_shardings(abstract_params, shardings)
  if item == "params" and LEGACY_STATE in items(manager, step):
    restore_args = jax.tree.map(lambda t: ocp.ArrayRestoreArgs(sharding=t.sharding), target)
    restored = _restore_items(
      manager,
      step,
      state=ocp.args.PyTreeRestore(
        item={"params": target}, restore_args={"params": restore_args}, partial_restore=True
      ),
    )
    return restored["state"]["params"]
  beside = _beside(manager, step, target, item)
  params = _restore_items(manager, step, **{item: ocp.args.StandardRestore({**target, **beside})})[item]
  _verify_arrays(manager, step, params, item)
  if beside:
    logging.info("Checkpoint step %d: left %s out of the %s read.", step, sorted(beside), item)
  return {name: params[name] for name in target}
