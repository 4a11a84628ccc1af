"""Orbax checkpoints in the workdir (a local path or `gs://...`).

Each checkpoint step, `<workdir>/checkpoints/<step>/`, holds these items:

* `params`: the model parameters (sharded arrays), on their own so that a fine-tuning job, an export or
  `bert_jax.handoff.pretrained.load` reads them without ever reading the optimizer moments (2x their bytes);
* `optimizer`: the optimizer state and step;
* `ema`: the exponential moving average of the parameters, the same tree, for a run that keeps one (`ema_decay`);
  read alone by `--mode=merge`, as `params` is;
* `data`: the data position (examples consumed) and the tokenizer's identity (JSON);
* `config`: the run's config (JSON);
* `history`: examples and sequence positions trained on over every phase, latest train and eval metrics (JSON);
* `tokenizer`: the tokenizer file itself (`vocab.txt`, the SentencePiece `.model` or a byte-level BPE's
  `tokenizer.json`) with its identity, when the run has a tokenizer, so that a step directory is complete on its own;
* `checksums`: a hash of every array of `params`, `optimizer` and `ema` and a SHA-256 of every other item
  (`workdir/checksums.py`). Every read (`workdir/reading.py`) verifies what it read against them and raises
  `CorruptCheckpointError` naming the array or item, the step and the directory; so does any other failure to read
  an item. A save refuses parameters
  that are not finite, and refuses to replace an existing step (Orbax would delete it).

Checkpoints written before `params` and `optimizer` were separate hold one `state` item (the whole TrainState);
they still resume, and their parameters still load alone.

Orbax writes each step to a temporary directory and commits it by rename (or a commit marker on GCS), so a step
that is listed is whole; leftover temporaries from a killed run are removed when the manager opens. Only listed
(committed) steps are ever read.

A run's manager (`make_manager` with the run's `lease.Holder`) commits a step only while the run still holds the
workdir's lease: the commit checks it first, so a save that was in flight when the run was stopped and taken over
is never committed. Its temporary directory is the run's own (`<step>.orbax-checkpoint-tmp-<token>`), so what
that save still writes when the process wakes lands there, never in the temporary of the run that took over.
Locally, such a manager removes every other run's step temporaries when it opens and again before each save
(`remove_other_temporaries`): the lost run may still be writing into its own while they are removed, and what it
writes after a removal is removed by the next save; a removal that fails never fails this run's save.
"""

import asyncio
import contextlib
import copy
import dataclasses
import json
import logging as std_logging
import time
import traceback

import jax
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from bert_jax import paths
from bert_jax.workdir import checksums, lease

CHECKPOINTS = "checkpoints"
BEST = "best"  # A fine-tuning run's best step by its task's main metric, kept apart from rotation.
LEGACY_STATE = "state"
CHECKSUMS = "checksums"
EMA = "ema"  # The parameters' moving average, in a step of a run that keeps one.


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


@contextlib.contextmanager
def _quiet_orbax_warnings():
  """Orbax's warnings (it logs through absl's logger) are dropped inside the block. The logger's own level, not absl's
  verbosity: setting the verbosity, even back to what it was, marks --verbosity as given, and a program that imports
  this module before app.run parses its flags (every benchmark) then kept absl's default, warnings only, instead of
  INFO: its jobs' progress lines never showed."""
  logger = logging.get_absl_logger()
  previous = logger.level
  logger.setLevel(std_logging.ERROR)
  try:
    yield
  finally:
    logger.setLevel(previous)


def _write_small_arrays_from_one_replica() -> None:
  """Registers Orbax's jax.Array handler (its default, metadata store included) with MIN_REPLICA_SLICE_BYTES."""
  handler = copy.copy(ocp.type_handlers.get_type_handler(jax.Array))
  if not hasattr(handler, "_min_slice_bytes_for_replica_parallel"):  # Another Orbax: keep its default, say so.
    logging.warning("orbax-checkpoint's ArrayHandler has no replica-slice threshold; small arrays are sliced.")
    return
  handler._min_slice_bytes_for_replica_parallel = MIN_REPLICA_SLICE_BYTES  # noqa: SLF001 - its constructor's argument.
  with _quiet_orbax_warnings():  # "... overriding jax.Array": what this asks for, not a warning for the console.
    ocp.type_handlers.register_type_handler(jax.Array, handler, override=True)


_write_small_arrays_from_one_replica()


def _unretrieved_read_errors_at_debug(record: std_logging.LogRecord) -> bool:
  """asyncio's "Task exception was never retrieved" (or Future's) for Orbax's reads and writes, at DEBUG and in one
  line. When an item cannot be read, Orbax's gather raises the first of its tasks' errors (a reader reports it, one
  line an item) and leaves the others unretrieved; asyncio logs each, with its traceback, whenever the garbage
  collector frees it: at no fixed time, often long after the reader's line."""
  message = str(record.msg)
  if record.levelno >= std_logging.ERROR and message.split("\n")[0].endswith("exception was never retrieved"):
    frames = traceback.extract_tb(record.exc_info[2]) if record.exc_info else []
    where = record.getMessage() + "".join(frame.filename for frame in frames)
    if "/orbax/" in where or "tensorstore" in where:
      record.levelno, record.levelname = std_logging.DEBUG, "DEBUG"
      record.msg, record.args = message.split("\n")[0], ()
      record.exc_info, record.exc_text = None, None
  return True


std_logging.getLogger("asyncio").addFilter(_unretrieved_read_errors_at_debug)


def _leased_temporary_path(directory: epath.Path, held: lease.Holder) -> type:
  """Orbax's temporary path of the steps in `directory` (a rename locally, a commit marker on GCS), for a run
  holding `held`: a step commits only after `held.check()` (else `LeaseLostError` fails the save, and the step is
  neither committed nor are older steps rotated out), and locally its temporary directory is named for the run's
  token. On GCS a step is written in place: what a stopped save still writes when its process wakes lands in the
  step's own directory, and is committed only by the run that writes the step's commit marker."""
  base = ocp.path.atomicity_defaults.get_default_temporary_path_class(directory)

  class LeasedTemporaryPath(base):
    @classmethod
    def from_final(cls, final_path, **kwargs):
      if not final_path.name.isdigit() or base is not ocp.path.atomicity.AtomicRenameTemporaryPath:
        return super().from_final(final_path, **kwargs)  # An item, inside its step's temporary; or GCS's in place.
      temporary = final_path.parent / f"{final_path.name}{ocp.path.atomicity.TMP_DIR_SUFFIX}-{held.token}"
      return cls(temporary, final_path, **kwargs)

    async def create(self):
      if self.get_final().name.isdigit():  # A step (on the primary host alone), not one of its items.
        await asyncio.to_thread(remove_other_temporaries, directory, held)
      return await super().create()

    async def finalize(self):
      if self.get_final().name.isdigit():  # A step, not one of its items.
        await asyncio.to_thread(held.check)
      await super().finalize()

  return LeasedTemporaryPath


# How often a removal of another run's temporary directory is tried before it is left for the next save: that run
# (stopped and taken over, then woken) may still be adding files to it, and a directory that gains a file while it is
# removed fails the removal ("Directory not empty").
REMOVAL_TRIES = 3


def remove_other_temporaries(directory: epath.Path, held: lease.Holder) -> None:
  """Removes the step temporaries in a local checkpoints `directory` (`<step>.orbax-checkpoint-tmp[-<token>]`) that
  are not this run's (`held.token`): a killed run's, or the late writes of a run that lost the lease. Only while
  `held` holds the lease: a lost run removes nothing (its save then fails at its commit's check; raising here, inside
  Orbax's creation of the step, would leave Orbax's other threads waiting for it). A temporary that still cannot be
  removed after REMOVAL_TRIES is left, in one warning line, for the next save; it never stops this run, whose own
  temporaries have another name."""
  if not held.holds():
    return
  own = f"{ocp.path.atomicity.TMP_DIR_SUFFIX}-{held.token}"
  try:
    found = list(directory.iterdir())
  except FileNotFoundError:  # Not created yet.
    found = []
  for path in found:
    if ocp.path.atomicity.TMP_DIR_SUFFIX not in path.name or path.name.endswith(own):
      continue
    for attempt in range(REMOVAL_TRIES):
      try:
        path.rmtree()
        break
      except FileNotFoundError:  # Gone meanwhile (its writer, or another remover).
        break
      except OSError as error:
        if attempt == REMOVAL_TRIES - 1:
          logging.warning("Left %s in place for the next save to remove: %s", path, error)


def make_manager(
  workdir: str, keep: int, name: str = CHECKPOINTS, held: lease.Holder | None = None
) -> ocp.CheckpointManager:
  """Keeps the newest `keep` steps in `<workdir>/<name>`; saves run in the background (`wait_until_finished`
  before exit). With `held` (a run's hold on the workdir), each step commits only while the run holds the lease
  (see the module docstring); without (a benchmark's scratch directory), as Orbax does."""
  directory = paths.absolute(workdir) / name
  leased = None if held is None else _leased_temporary_path(directory, held)
  # Orbax's own removal at open fails the first save when another run still writes into a temporary it removes.
  ours = leased is not None and issubclass(leased, ocp.path.atomicity.AtomicRenameTemporaryPath)
  options = ocp.CheckpointManagerOptions(
    max_to_keep=keep,
    create=True,
    cleanup_tmp_directories=not ours,
    enable_async_checkpointing=True,
    temporary_path_class=leased,
  )
  manager = ocp.CheckpointManager(directory, options=options)
  if ours and jax.process_index() == 0:
    remove_other_temporaries(directory, held)
  return manager


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
  if state.ema is not None:  # The parameters' moving average, where the run keeps one.
    items[EMA] = ocp.args.StandardSave(state.ema)
    arrays.update(checksums.arrays(state.ema, EMA)[0])
  items[CHECKSUMS] = ocp.args.JsonSave({"arrays": arrays, "items": digests})
  try:
    manager.save(step, force=True, args=ocp.args.Composite(**items))
  except Exception as error:  # noqa: BLE001 - whatever the storage raised.
    raise _save_error(manager, step, error, None) from None


def _cause(error: Exception) -> str:
  """The last line of a storage error: what the file system said (e.g. "... File too large [os_error_code='27']")."""
  return str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__


def _save_error(
  manager: ocp.CheckpointManager, step: int | None, error: Exception, held: lease.Holder | None
) -> lease.LeaseLostError | SaveError:
  """The error a failed save stops the run with: the loss of the lease if the run (`held`) no longer holds the
  workdir, whatever failed (a refused commit, a save woken into a directory the new holder had removed); else a
  `SaveError` naming the step, the path and the cause."""
  if held is not None:
    try:
      held.check()
    except lease.LeaseLostError as lost:
      return lost
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


def check_saves(
  manager: ocp.CheckpointManager, step: int | None, held: lease.Holder | None, wait: bool = False
) -> None:
  """Raises `SaveError` if the background save of `step` (the newest started) has failed, `LeaseLostError` if the
  run (`held`) has lost the workdir meanwhile; returns at once while it is still running, unless `wait`. Called
  after every train step, so a failed save stops the run a step later, and with `wait` before the next save."""
  if step is None or (manager.is_saving_in_progress() and not wait):
    return
  try:
    manager.wait_until_finished()  # Finished: returns at once, or raises the save's error.
  except Exception as error:  # noqa: BLE001 - whatever the storage raised.
    raise _save_error(manager, step, error, held) from None


# A write still in flight at the end of a run is announced, then said to go on every this many seconds: a final
# checkpoint of a large sweep takes minutes on a slow disk, and the console must not fall silent meanwhile.
STILL_WRITING_EVERY_SECONDS = 30.0


def _say_while_writing(manager: ocp.CheckpointManager, poll_seconds: float = 0.5) -> None:
  """Returns when `manager` has no save in flight; if one is, says so on the console (which step, where), again every
  STILL_WRITING_EVERY_SECONDS, and how long it took."""
  if not manager.is_saving_in_progress():
    return
  step, started = manager.latest_step(), time.monotonic()
  where = epath.Path(manager.directory) / str(step) if step is not None else manager.directory
  logging.info("Writing checkpoint step %s to %s ...", step, where)
  said = started
  while manager.is_saving_in_progress():
    time.sleep(poll_seconds)
    if time.monotonic() - said >= STILL_WRITING_EVERY_SECONDS:
      said = time.monotonic()
      logging.info("... still writing checkpoint step %s (%.0f s so far).", step, said - started)
  logging.info("Checkpoint step %s written in %.1f s.", step, time.monotonic() - started)


def finish(
  manager: ocp.CheckpointManager, step: int | None, held: lease.Holder | None = None, raise_errors: bool = True
) -> None:
  """Waits for the save in flight (never exit with a checkpoint half-written) and closes the manager (`held`: None for
  a manager made without one). A failed save raises as in `check_saves`, or, with `raise_errors=False` (the run is
  already failing with another error), is logged if it is a `SaveError`; a lost lease is not (when the run's own
  check raised it, it is the error on its way out, which main shows once). Closing waits again, and a background
  error that surfaces only there is handled the same way: it never replaces the error on its way out."""
  failure = None
  _say_while_writing(manager)
  for wait in (manager.wait_until_finished, manager.close):  # `close` even when the wait failed.
    try:
      wait()
    except Exception as error:  # noqa: BLE001 - whatever the storage raised.
      failure = failure or _save_error(manager, step, error, held)
  if failure is None:
    return
  if raise_errors:
    raise failure
  if isinstance(failure, SaveError):
    logging.error("%s", failure)


def reader(directory) -> ocp.CheckpointManager:
  """A manager that reads the checkpoint steps in `directory` (and never deletes or writes any)."""
  options = ocp.CheckpointManagerOptions(read_only=True, save_interval_steps=0, create=False)
  with _quiet_orbax_warnings():  # "Given directory is read only": what a reader asks for.
    return ocp.CheckpointManager(paths.absolute(directory), options=options)


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
