"""Where a run starts, in this order, for every job (one place, so the order is never in doubt):

1. the workdir's newest committed checkpoint: state, data position and history (a resume);
2. else `config.init_from`, as the job's policy says: pretraining's (`train/pretraining_start.py`) takes a
   workdir's (a previous phase's) state and step with the data stream afresh, or any other source's (bundle,
   Hugging Face, Google) weights, heads it lacks from the seed and a fresh optimizer; fine-tuning's
   (`finetune/job.py`) takes the encoder only, with one head per sweep member from its own seed;
3. else a fresh initialisation from `config.seed`.

Each job checks its start before anything is written (a checkpoint that does not fit the config is refused). A
workdir with checkpoints never reads `init_from` again, so phase 2 resumes even once phase 1's checkpoints are gone.

A checkpoint that fails its checksums (`checkpoints.CorruptCheckpointError`) stops the run, or with
`restore_fallback` the previous committed step is restored instead: the bad step is moved aside to
`<workdir>/corrupt_checkpoints/<step>` (`<step>.1`, `<step>.2`, ... if that step number was moved aside before; kept
for inspection, and never deleted or overwritten by the new saves).
Every item of a step takes part: any that is missing, cannot be read or does not match its checksum makes the step
corrupt, each named in one warning line.
Every host takes the same decisions: they read the same files, and the checksums are verified by one jitted
computation over the global arrays.
"""

import dataclasses
import functools

import jax
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from bert_jax.train import step as step_lib
from bert_jax.train.run import Frozen
from bert_jax.workdir import checkpoints, verified

CORRUPT = "corrupt_checkpoints"


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
        return step, verified.read_config(manager, step), verified.read_data_position(manager, step)
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
    recorded = verified.read_history(manager, step).get(frozen.name)
  if recorded != frozen.identity:
    raise ValueError(
      f"{checkpoints.checkpoint_dir(workdir)}/{step} was trained with the {frozen.name} {recorded}; this run's is "
      f"{frozen.identity}. Name the same {frozen.name} (a workdir's checkpoint step names one step), or use a new "
      "workdir."
    )


def restore_state(manager, step: int, abstract, shardings):
  """`verified.restore` of `step` in `shardings`, with a fresh step guard where the checkpoint predates the guard
  (its state then has none)."""
  state, data_position = verified.restore(manager, step, abstract, shardings)
  if state.guard is None:
    state = state.replace(guard=jax.device_put(step_lib.initial_guard(), shardings.guard))
  return state, data_position


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
