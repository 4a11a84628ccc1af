"""Where a run starts, in this order, for every job (one place, so the order is never in doubt):

1. the workdir's newest committed checkpoint: state, data position and history (a resume);
2. else `config.init_from`, as the job's policy says: pretraining's (`train/pretraining_start.py`) takes a
   workdir's (a previous phase's) state and step with the data stream afresh, or any other source's (bundle,
   Hugging Face, Google) weights, heads it lacks from the seed and a fresh optimizer; fine-tuning's
   (`finetune/job.py`) takes the encoder only, with one head per sweep member from its own seed;
3. else a fresh initialisation from `config.seed`.

Each job checks its start before anything is written (a checkpoint that does not fit the config is refused). A
workdir with checkpoints never reads `init_from` again, so phase 2 resumes even once phase 1's checkpoints are gone.

The inputs a run's meaning depends on (fine-tuning's data files, a teacher, `init_from`) are identified by content,
not path (`Input`): each checkpoint's history records their fingerprints under `inputs`, and a resume compares them
(`check_inputs`). Content changed under the same path is refused, naming the file and what changed; the same content
under another path resumes, with a line saying so. `init_from` is compared only while a resume still names it (its
weights are not read again; a source that is gone is not checked). A checkpoint written before inputs were recorded
resumes with a warning, its inputs compared by path as before. The tokenizer is matched by its SHA-256 the same way
(`check_tokenizer`).

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
from collections.abc import Callable

import jax
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from bert_jax.train import step as step_lib
from bert_jax.train.run import Frozen
from bert_jax.workdir import checkpoints, reading

CORRUPT = "corrupt_checkpoints"
# The history key under which every checkpoint records its inputs' content: {config key: {"path", "content"}}.
INPUTS = "inputs"


class Input:
  """An input whose content a run's meaning depends on (fine-tuning's data files, a teacher, `init_from`), named by
  the config key that names it and its path. `fingerprint()` gives its content (`paths.fingerprint`'s dict, what a
  model source records of itself, or {file: fingerprint} of a task's files); it runs once, when `content` is first
  asked for. `optional`: read at a first start only (`init_from`): a resume may leave it out, and it is compared only
  while a resume names it and it can still be read."""

  def __init__(self, key: str, path: str, fingerprint: Callable[[], dict], optional: bool = False):
    self.key, self.path, self.optional = key, path, optional
    self._fingerprint = fingerprint

  @functools.cached_property
  def content(self) -> dict:
    return self._fingerprint()


def record_inputs(inputs, resumed: dict | None = None) -> dict:
  """What a checkpoint's history records under `INPUTS`: each input's path and content (computed here; an optional
  one marked so). On a resume, `resumed` is the checkpoint's record: an optional input keeps it (read at the first
  start only, if at all), the others are recorded as now named (`check_inputs` found the same content)."""
  current = [input for input in inputs if resumed is None or not input.optional]
  return dict(
    resumed or {},
    **{
      input.key: dict(path=input.path, content=input.content, **({"optional": True} if input.optional else {}))
      for input in current
    },
  )


def _short(content: dict) -> str:
  """A fingerprint in a few words: "27,356 bytes, sha256 0a1b2c3d4e5f" (hashes cut to 12 characters)."""
  words = []
  for name, value in content.items():
    if name in ("bytes", "files"):
      words.append(f"{value:,} {name}")
    else:
      words.append(f"{name} {str(value)[:12]}")
  return ", ".join(words) or "nothing"


def _changes(recorded: dict, input: Input) -> list[str]:
  """What differs between the content a checkpoint `recorded` ({"path", "content"}) and `input`'s: per file where
  both map file names to fingerprints (a task's files), else the whole (a model source)."""
  before, now = recorded["content"], input.content
  changed = "changed since the checkpoint" if input.path == recorded["path"] else f"differs from {recorded['path']}'s"
  if not all(isinstance(value, dict) for value in (*before.values(), *now.values())):
    return [f"its content {changed} ({_short(before)} -> {_short(now)})"]
  changes = []
  for name in sorted(set(before) | set(now)):
    if name not in now:
      changes.append(f"{name} is missing (the checkpoint read {_short(before[name])})")
    elif name not in before:
      changes.append(f"{name} is new ({_short(now[name])}; the checkpoint read none)")
    elif before[name] != now[name]:
      changes.append(f"{name} {changed} ({_short(before[name])} -> {_short(now[name])})")
  return changes


def _current(input: Input) -> dict | None:
  """`input`'s content; None for an optional input that can no longer be read (then not compared, with a line)."""
  try:
    return input.content
  except (FileNotFoundError, ValueError) as error:
    if not input.optional:
      raise
    logging.info("%s=%s is not read on a resume and is not compared: %s", input.key, input.path, error)
    return None


def check_inputs(workdir: str, step: int, inputs) -> dict | None:
  """Before anything is written: checkpoint `step` resumes only with the inputs it was trained with, compared by
  content (see the module docstring). Raises ValueError naming each input whose content differs (a task's files one
  by one), that the checkpoint was trained with and this run does not name, or that this run adds; logs one line per
  input whose content is found under another path. Returns the checkpoint's record; None for a checkpoint written
  before inputs were recorded, with a warning: the callers' path comparisons then stand."""
  with checkpoints.read_only_manager(workdir) as manager:
    recorded = reading.read_history(manager, step).get(INPUTS)
  where = f"{checkpoints.checkpoint_dir(workdir)}/{step}"
  if recorded is None:
    if inputs:
      logging.warning(
        "%s was written before checkpoints recorded their inputs' content: %s compared by path only.",
        where,
        ", ".join(input.key for input in inputs),
      )
    return None
  named = {input.key: input for input in inputs}
  problems = [
    f"it was trained with {key}={before['path']}, which this run does not name"
    for key, before in recorded.items()
    if key not in named and not before.get("optional")
  ]
  for key, input in named.items():
    before = recorded.get(key)
    if before is None:
      if not input.optional:
        problems.append(f"it was trained without {key}; this run names {input.path}")
      continue
    now = _current(input)
    if now is None:
      continue
    if now != before["content"]:
      problems += [f"{key}={input.path}: {change}" for change in _changes(before, input)]
    elif input.path != before["path"]:
      logging.info("%s=%s has the same content as %s, which trained the checkpoint.", key, input.path, before["path"])
  if problems:
    raise ValueError(
      f"{where} was trained with other inputs: {'; '.join(problems)}. Name what it was trained with (the same content "
      "at any path), or use a new workdir."
    )
  return recorded


def _usable_steps(config, directory) -> list[int]:
  """The committed steps to try, newest first: all with `restore_fallback`, else the newest alone."""
  steps = sorted(checkpoints.committed_steps(directory), reverse=True)
  return steps if config.restore_fallback else steps[:1]


def newest_saved(config, workdir: str) -> tuple[int, dict, dict] | None:
  """(step, config, data position) of the workdir's newest step whose config, data and history items read (any step
  with `restore_fallback`, else the newest alone), read before anything is written; None without a checkpoint."""
  if not checkpoints.has_checkpoint(workdir):
    return None
  with checkpoints.read_only_manager(workdir) as manager:
    for step in _usable_steps(config, checkpoints.checkpoint_dir(workdir)):
      try:
        reading.read_history(manager, step)  # Its inputs are checked (`check_inputs`).
        return step, reading.read_config(manager, step), reading.read_data_position(manager, step)
      except checkpoints.CorruptCheckpointError as error:
        if not config.restore_fallback:
          raise
        logging.info("Checking the previous step: %s", error.lines[0])  # The restore warns, per item.
  raise checkpoints.CorruptCheckpointError(f"No readable checkpoint in {checkpoints.checkpoint_dir(workdir)}.")


def check_same_run(config, workdir: str, keys: tuple[str, ...], absent: dict | None = None, inputs=()) -> None:
  """Before anything is written: a workdir's checkpoint resumes only the run it belongs to. Its `inputs` (`Input`s)
  are compared by content (`check_inputs`); then raises ValueError naming each of `keys` (dotted) whose value differs
  between the newest readable checkpoint's config and `config`, both values given, but for the keys of inputs the
  checkpoint recorded by content: their paths may differ. `absent`: for keys added after checkpoints were first
  written, the value a checkpoint that does not record them ran with."""
  newest = newest_saved(config, workdir)
  if newest is None:
    return
  step, saved, _ = newest
  by_content = check_inputs(workdir, step, inputs) or {}
  different = []
  for key in keys:
    if key in by_content:
      continue
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
  """A resume reads the frozen inputs (a teacher) that trained its checkpoint. A checkpoint that records its inputs'
  content has them compared by `check_inputs`; an older one by where they came from: raises ValueError naming both
  if checkpoint `step`'s history records another identity (path, format, step) than `frozen`'s (or none)."""
  if frozen is None:
    return
  with checkpoints.read_only_manager(workdir) as manager:
    history = reading.read_history(manager, step)
  if INPUTS in history:
    return
  recorded = history.get(frozen.name)
  if recorded != frozen.identity:
    raise ValueError(
      f"{checkpoints.checkpoint_dir(workdir)}/{step} was trained with the {frozen.name} {recorded}; this run's is "
      f"{frozen.identity}. Name the same {frozen.name} (a workdir's checkpoint step names one step), or use a new "
      "workdir."
    )


def same_tokenizer(a: dict | None, b: dict | None) -> bool:
  """Whether two tokenizer identities name the same tokenizer: kind, content and casing; the path is informative
  only (a moved, copied or symlinked workdir keeps its tokenizer)."""
  if a is None or b is None:
    return a is b
  return {k: v for k, v in a.items() if k != "path"} == {k: v for k, v in b.items() if k != "path"}


def check_tokenizer(data_position: dict, identity: dict | None) -> None:
  """A resume tokenizes as its checkpoint did: raises ValueError naming both unless the tokenizer the checkpoint's
  `data_position` records is `identity` (by kind, SHA-256 and casing; `same_tokenizer`); one line when it is, under
  another path."""
  recorded = data_position.get("tokenizer")
  if not same_tokenizer(recorded, identity):
    raise ValueError(
      f"The checkpoint was trained with tokenizer {recorded}; the config's is {identity}. Use the same tokenizer, "
      "or a new workdir."
    )
  if recorded is not None and recorded.get("path") != identity.get("path"):
    logging.info(
      "The tokenizer %s has the same content as %s, which trained the checkpoint.", identity["path"], recorded["path"]
    )


def restore_state(manager, step: int, abstract, shardings):
  """`reading.restore` of `step` in `shardings`, with a fresh step guard where the checkpoint predates the guard
  (its state then has none), and the parameters' moving average starting at the step's parameters where the run
  keeps one and the checkpoint holds none (`ema_decay` was 0 when it was written, or it predates the average)."""
  state, data_position = reading.restore(manager, step, abstract, shardings)
  if state.guard is None:
    state = state.replace(guard=jax.device_put(step_lib.initial_guard(), shardings.guard))
  if abstract.ema is not None and state.ema is None:
    logging.info("Checkpoint step %d keeps no moving average of the parameters: it starts at its parameters.", step)
    state = state.replace(ema=jax.jit(lambda params: params, out_shardings=shardings.ema)(state.params))
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
  return Start(state, data_position, True, f"Resumed from step {state.host_step()}")


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
