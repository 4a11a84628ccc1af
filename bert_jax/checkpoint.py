"""Orbax checkpoints in the workdir (a local path or `gs://...`).

Each checkpoint step holds three items: `state` (the sharded TrainState), `data` (the data position, JSON) and
`config` (the run's config, JSON), under `<workdir>/checkpoints/<step>/`. Orbax writes each step to a
temporary directory and commits it by rename (or a commit marker on GCS), so a step that is listed is whole;
leftover temporaries from a killed run are removed when the manager opens.
"""

import json

import orbax.checkpoint as ocp
from etils import epath

from bert_jax import sharding


def checkpoint_dir(workdir: str) -> epath.Path:
  return epath.Path(workdir) / "checkpoints"


def data_state_dir(workdir: str, step: int, process_index: int) -> str:
  """Where host `process_index` keeps its input-pipeline state for checkpoint `step` (beside Orbax's steps)."""
  return f"{workdir}/pipeline_state/{step}/process_{process_index}"


def remove_stale_data_states(workdir: str, process_index: int, current: int) -> None:
  """Deletes this host's pipeline states whose checkpoint step is gone from disk (keeps `current`).

  Orbax drops an old step from `all_steps()` when a new save starts but deletes it only once the new step is
  committed: the directory on disk, not the manager's list, says whether a state can still be needed.
  """
  root = epath.Path(workdir) / "pipeline_state"
  if not root.exists():
    return
  on_disk = {int(p.name) for p in checkpoint_dir(workdir).iterdir() if p.name.isdigit()}
  for step_dir in root.iterdir():
    mine = step_dir / f"process_{process_index}"
    if step_dir.name.isdigit() and int(step_dir.name) not in on_disk | {current} and mine.exists():
      mine.rmtree()


def make_manager(workdir: str, keep: int) -> ocp.CheckpointManager:
  """Keeps the newest `keep` steps; saves run in the background (`wait_until_finished` before exit)."""
  options = ocp.CheckpointManagerOptions(
    max_to_keep=keep, create=True, cleanup_tmp_directories=True, enable_async_checkpointing=True
  )
  return ocp.CheckpointManager(checkpoint_dir(workdir), options=options)


def save(manager: ocp.CheckpointManager, step: int, state, data_position: dict, config) -> None:
  """Starts saving `step` in the background; device buffers are copied before this returns."""
  manager.save(
    step,
    force=True,
    args=ocp.args.Composite(
      state=ocp.args.StandardSave(state),
      data=ocp.args.JsonSave(data_position),
      config=ocp.args.JsonSave(json.loads(config.to_json_best_effort())),
    ),
  )


def read_only_manager(workdir: str) -> ocp.CheckpointManager:
  """A manager that reads another run's checkpoints (and never deletes or writes any)."""
  return ocp.CheckpointManager(checkpoint_dir(workdir), options=ocp.CheckpointManagerOptions(read_only=True))


def has_checkpoint(workdir: str) -> bool:
  """Whether `workdir` holds at least one complete checkpoint step (reads only)."""
  if not checkpoint_dir(workdir).exists():
    return False
  with read_only_manager(workdir) as manager:
    return manager.latest_step() is not None


def read_config(manager: ocp.CheckpointManager, step: int) -> dict:
  """The config checkpoint `step` was written with, as a plain dict."""
  return manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))["config"]


def restore(manager: ocp.CheckpointManager, step: int, abstract_state, shardings):
  """(state, data_position) of checkpoint `step`, placed directly into `shardings`."""
  restored = manager.restore(
    step,
    args=ocp.args.Composite(
      state=ocp.args.StandardRestore(sharding.with_shardings(abstract_state, shardings)), data=ocp.args.JsonRestore()
    ),
  )
  return restored["state"], restored["data"]


def restore_config(workdir: str, step: int | None = None) -> dict:
  """The config a checkpoint was written with (newest step by default), as a plain dict."""
  with read_only_manager(workdir) as manager:
    step = manager.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"No checkpoint under {checkpoint_dir(workdir)}.")
    return read_config(manager, step)
