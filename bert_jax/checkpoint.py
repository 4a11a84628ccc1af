"""Orbax checkpoints in the workdir (a local path or `gs://...`).

Each checkpoint step, `<workdir>/checkpoints/<step>/`, holds these items:

* `params`: the model parameters (sharded arrays), on their own so that a fine-tuning job, an export or
  `bert_jax.pretrained.load` reads them without ever reading the optimizer moments (2x their bytes);
* `optimizer`: the optimizer state and step;
* `data`: the data position (examples consumed) and the tokenizer's identity (JSON);
* `config`: the run's config (JSON);
* `history`: examples and sequence positions trained on over every phase, latest train and eval metrics (JSON);
* `tokenizer`: the tokenizer file itself (`vocab.txt` or the SentencePiece `.model`) with its identity, when the
  run has a tokenizer, so that a step directory is complete on its own.

Checkpoints written before `params` and `optimizer` were separate hold one `state` item (the whole TrainState);
they still resume, and their parameters still load alone.

Orbax writes each step to a temporary directory and commits it by rename (or a commit marker on GCS), so a step
that is listed is whole; leftover temporaries from a killed run are removed when the manager opens. Only listed
(committed) steps are ever read.
"""

import contextlib
import dataclasses
import json

import jax
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from bert_jax import paths, sharding

CHECKPOINTS = "checkpoints"
BEST = "best"  # A fine-tuning run's best step by its task's main metric, kept apart from rotation.
_LEGACY_STATE = "state"


def checkpoint_dir(workdir: str) -> epath.Path:
  return paths.absolute(workdir) / CHECKPOINTS


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
  """What the `tokenizer` item saves of a bert_jax Tokenizer: its identity and its file's bytes."""
  path = epath.Path(tokenizer.path)
  return {"identity": dict(tokenizer.identity(), filename=path.name), "content": path.read_bytes()}


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
  tokens seen over every phase, latest train and eval metrics) as JSON."""
  items = dict(
    params=ocp.args.StandardSave(state.params),
    optimizer=ocp.args.StandardSave({"step": state.step, "opt_state": state.opt_state}),
    data=ocp.args.JsonSave(data_position),
    config=ocp.args.JsonSave(json.loads(config.to_json_best_effort())),
    history=ocp.args.JsonSave(history or {}),
  )
  if tokenizer is not None:
    items["tokenizer"] = TokenizerSave(tokenizer)
  manager.save(step, force=True, args=ocp.args.Composite(**items))


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


def read_config(manager: ocp.CheckpointManager, step: int) -> dict:
  """The config checkpoint `step` was written with, as a plain dict."""
  return manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))["config"]


def read_data_position(manager: ocp.CheckpointManager, step: int) -> dict:
  """The data position (examples consumed, tokenizer identity) saved with checkpoint `step`."""
  return manager.restore(step, args=ocp.args.Composite(data=ocp.args.JsonRestore()))["data"]


def read_history(manager: ocp.CheckpointManager, step: int) -> dict:
  """The training history saved with checkpoint `step` (see `save`); empty for steps written without one."""
  if "history" not in items(manager, step):
    return {}
  return manager.restore(step, args=ocp.args.Composite(history=ocp.args.JsonRestore()))["history"]


def read_tokenizer(manager: ocp.CheckpointManager, step: int) -> dict | None:
  """The tokenizer item of checkpoint `step` (identity and `file`), or None if the step has none."""
  if "tokenizer" not in items(manager, step):
    return None
  return manager.restore(step, args=ocp.args.Composite(tokenizer=TokenizerRestore()))["tokenizer"]


def restore(manager: ocp.CheckpointManager, step: int, abstract_state, shardings):
  """(state, data_position) of checkpoint `step`, placed directly into `shardings`."""
  target = sharding.with_shardings(abstract_state, shardings)
  if _LEGACY_STATE in items(manager, step):
    restored = manager.restore(
      step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target), data=ocp.args.JsonRestore())
    )
    return restored["state"], restored["data"]
  restored = manager.restore(
    step,
    args=ocp.args.Composite(
      params=ocp.args.StandardRestore(target.params),
      optimizer=ocp.args.StandardRestore({"step": target.step, "opt_state": target.opt_state}),
      data=ocp.args.JsonRestore(),
    ),
  )
  optimizer = restored["optimizer"]
  state = type(abstract_state)(step=optimizer["step"], params=restored["params"], opt_state=optimizer["opt_state"])
  return state, restored["data"]


def restore_params(manager: ocp.CheckpointManager, step: int, abstract_params, shardings):
  """The parameters of checkpoint `step` alone, placed directly into `shardings`: the optimizer state is never
  read (from a legacy `state` item, only its `params` subtree is)."""
  target = sharding.with_shardings(abstract_params, shardings)
  if _LEGACY_STATE in items(manager, step):
    restore_args = jax.tree.map(lambda t: ocp.ArrayRestoreArgs(sharding=t.sharding), target)
    restored = manager.restore(
      step,
      args=ocp.args.Composite(
        state=ocp.args.PyTreeRestore(
          item={"params": target}, restore_args={"params": restore_args}, partial_restore=True
        )
      ),
    )
    return restored["state"]["params"]
  return manager.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore(target)))["params"]


def restore_config(workdir: str, step: int | None = None) -> dict:
  """The config a checkpoint was written with (newest step by default), as a plain dict."""
  with read_only_manager(workdir) as manager:
    step = manager.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"No checkpoint under {checkpoint_dir(workdir)}.")
    return read_config(manager, step)
