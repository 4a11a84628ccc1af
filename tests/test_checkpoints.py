"""What a checkpoint must survive: a flipped bit, a damaged file, a garbage JSON item, each named with its step and
file, with the previous step restored instead when `restore_fallback` is set; and the format of today's checkpoints
still restoring bitwise (a committed golden checkpoint)."""

import gc
import json
import logging
import os
import re
import shutil
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from etils import epath

from bert_jax import jobs, paths
from bert_jax.train import pretraining, start_order
from bert_jax.workdir import checkpoints, lease, reading
from configs import default
from tests.helpers import flip_a_bit_through_orbax, logged_by, state_params


def _truncate_files(step_dir) -> None:
  """Cuts every data file of `params` in half, as a copy that ran out of space would."""
  for path in paths.files(epath.Path(step_dir) / "params"):
    if path.parent.name == "d":
      path.write_bytes(path.read_bytes()[: path.stat().length // 2])


_TRAINED = {}


def _trained(config, tmp_path_factory) -> tuple[str, dict]:
  """(workdir, final parameters) of one uninterrupted run with checkpoints 3 and 6, trained once per session (and
  worker): the tests below damage copies of it."""
  config.update(eval_steps=0, schedule_end_step=9)  # test_train.py's schedule: its train step, compiled.
  if not _TRAINED:
    workdir = str(tmp_path_factory.mktemp("corrupt") / "original")
    _TRAINED.update(workdir=workdir, params=state_params(jobs.run(config, workdir, "pretrain")))
  return _TRAINED["workdir"], _TRAINED["params"]


def _resume_over(config, tmp_path, original: str, damage, name: str = "damaged") -> tuple[epath.Path, dict]:
  """A copy of `original` with step 6 damaged, resumed with `restore_fallback`: (the workdir, its final params)."""
  workdir = tmp_path / name
  shutil.copytree(original, workdir)
  damage(workdir / "checkpoints" / "6")
  config.restore_fallback = True
  return workdir, state_params(jobs.run(config, str(workdir), "pretrain"))


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # tensorstore, after a failed read.
@pytest.mark.slow
def test_a_corrupt_checkpoint_is_named_and_the_previous_step_restored_when_asked(
  small_config, tmp_path, tmp_path_factory, caplog
):
  original, uninterrupted = _trained(small_config, tmp_path_factory)

  faults = {
    "flipped bit": (
      flip_a_bit_through_orbax,
      r"array params/bert/layer_1/attention/query/kernel read from .*/6/params",
    ),
    "truncated files": (_truncate_files, r"Checkpoint step 6: cannot read item params \(.*/6/params\)"),
    "garbage JSON": (lambda d: (epath.Path(d) / "data" / "metadata").write_text("{garbage"), r"step 6.*data.*/6/data"),
  }
  for name, (damage, named) in faults.items():
    workdir = tmp_path / name.replace(" ", "_")
    shutil.copytree(original, workdir)
    damage(workdir / "checkpoints" / "6")
    small_config.restore_fallback = False
    with pytest.raises(checkpoints.CorruptCheckpointError, match=named):
      jobs.run(small_config, str(workdir), "pretrain")
    assert sorted(os.listdir(workdir / "checkpoints")) == ["3", "6"]  # Nothing written, nothing deleted.

  # With the fallback: step 3 is restored, the damaged step is kept aside, and the run ends where it would have.
  small_config.restore_fallback = True
  workdir = tmp_path / "flipped_bit"
  run = pretraining.make_run(small_config)
  with checkpoints.read_only_manager(str(workdir)) as manager:  # pretrained.load's (and fine-tuning's) reader.
    with pytest.raises(checkpoints.CorruptCheckpointError, match="query/kernel"):
      reading.restore_params(manager, 6, run.abstract.params, run.shardings.params)
  resumed = state_params(jobs.run(small_config, str(workdir), "pretrain"))
  assert "Restored step 3 instead of step 6; moving step 6 to" in caplog.text
  assert os.listdir(workdir / "corrupt_checkpoints") == ["6"]
  assert sorted(os.listdir(workdir / "checkpoints")) == ["3", "6"]
  jax.tree.map(np.testing.assert_array_equal, resumed, uninterrupted)


@pytest.mark.slow
def test_a_corrupt_checkpoint_without_its_checksums_item_is_never_read_unverified(
  small_config, tmp_path, tmp_path_factory, caplog
):
  """A step of today's format (its optimizer holds the guard's state, written since checksums) whose `checksums`
  item is gone is corrupt: never trained on unverified, the previous step restored instead."""
  original, uninterrupted = _trained(small_config, tmp_path_factory)

  def damage(step_dir):
    shutil.rmtree(step_dir / "checksums")
    flip_a_bit_through_orbax(step_dir)  # What the checksums would have caught.

  small_config.restore_fallback = False
  workdir = tmp_path / "refused"
  shutil.copytree(original, workdir)
  damage(workdir / "checkpoints" / "6")
  with pytest.raises(checkpoints.CorruptCheckpointError, match=r"step 6: item checksums is missing \(.*/6/checksums\)"):
    jobs.run(small_config, str(workdir), "pretrain")
  workdir, resumed = _resume_over(small_config, tmp_path, original, damage)
  assert "Restored step 3 instead of step 6" in caplog.text
  assert os.listdir(workdir / "corrupt_checkpoints") == ["6"]
  jax.tree.map(np.testing.assert_array_equal, resumed, uninterrupted)


@pytest.mark.slow
def test_a_corrupt_checkpoint_with_a_garbage_history_item_falls_back_like_any_other_item(
  small_config, tmp_path, tmp_path_factory, caplog
):
  """Every item takes part in the fallback: a garbage `history` restores step 3, not an exit on every restart."""
  original, uninterrupted = _trained(small_config, tmp_path_factory)
  workdir, resumed = _resume_over(
    small_config, tmp_path, original, lambda d: (d / "history" / "metadata").write_text("{garbage")
  )
  assert re.search(r"Checkpoint step 6: cannot read item history \(.*/6/history\)", caplog.text)
  assert os.listdir(workdir / "corrupt_checkpoints") == ["6"]
  jax.tree.map(np.testing.assert_array_equal, resumed, uninterrupted)


@pytest.mark.slow
def test_a_corrupt_checkpoint_whose_step_was_moved_aside_before_is_moved_under_a_fresh_name(
  small_config, tmp_path, tmp_path_factory
):
  """Step 6 corrupted a second time (it was already moved aside once, twice): `6.2`, the earlier ones kept."""
  original, uninterrupted = _trained(small_config, tmp_path_factory)

  def damage(step_dir):
    for earlier in ("6", "6.1"):
      (step_dir.parent.parent / "corrupt_checkpoints" / earlier).mkdir(parents=True)
      (step_dir.parent.parent / "corrupt_checkpoints" / earlier / "earlier").write_text(earlier)
    (step_dir / "config" / "metadata").write_text("{garbage")

  workdir, resumed = _resume_over(small_config, tmp_path, original, damage)
  aside = workdir / "corrupt_checkpoints"
  assert sorted(os.listdir(aside)) == ["6", "6.1", "6.2"]
  assert [(aside / name / "earlier").read_text() for name in ("6", "6.1")] == ["6", "6.1"]
  assert "config" in os.listdir(aside / "6.2")
  jax.tree.map(np.testing.assert_array_equal, resumed, uninterrupted)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # tensorstore, after a failed read.
@pytest.mark.slow
def test_a_corrupt_checkpoint_with_a_truncated_file_is_logged_in_one_line_per_damaged_item(
  small_config, tmp_path, tmp_path_factory, caplog, capfd
):
  """No library tracebacks: one warning per damaged item (step, item, path), then the step restored instead."""
  original, uninterrupted = _trained(small_config, tmp_path_factory)
  capfd.readouterr()
  caplog.clear()
  with caplog.at_level(logging.INFO):
    _, resumed = _resume_over(small_config, tmp_path, original, _truncate_files)
    gc.collect()  # Orbax's failed read tasks, freed now rather than whenever: asyncio logs each one it frees.
  jax.tree.map(np.testing.assert_array_equal, resumed, uninterrupted)
  captured = capfd.readouterr()
  printed = (captured.out + captured.err).splitlines()
  logged = [line for record in caplog.records for line in caplog.handler.format(record).splitlines()]
  assert not [line for line in printed + logged if "Traceback" in line]
  warnings = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
  about_6 = [message for message in warnings if "step 6" in message]
  assert len(about_6) == 2, about_6
  assert re.fullmatch(r"Checkpoint step 6: cannot read item params \(.*/6/params\): [^\n]*", about_6[0])
  assert about_6[1].startswith("Restored step 3 instead of step 6; moving step 6 to")


GOLDEN = os.path.join(os.path.dirname(__file__), "golden")


def _todays_config(saved: dict):
  """Today's default config with the saved config's values for every key both have (keys come and go)."""
  config = default.get_config()
  known = {}

  def flatten(tree, prefix=""):
    for key, value in tree.items():
      if isinstance(value, dict) and key != "mesh":
        flatten(value, f"{prefix}{key}.")
      else:
        known[f"{prefix}{key}"] = value

  flatten(saved)
  for key, value in known.items():
    *parents, leaf = key.split(".")
    node = config
    for parent in parents:
      node = node.get(parent) if node is not None else None
    if node is not None and leaf in node:
      node[leaf] = tuple(map(tuple, value)) if key == "logical_axis_rules" else value
  return config


def test_a_checkpoint_in_todays_format_restores_bitwise():
  """tests/golden: step 2 of a tiny synthetic run (its config is in the checkpoint) written by this format, and the
  state it held (`expected_state.npz`). A dependency upgrade that cannot read it fails here, not in a user's
  resume. Rewrite both only with a deliberate format change that still reads the old ones."""
  with checkpoints.read_only_manager(GOLDEN) as manager:
    assert manager.all_steps() == [2]
    config = _todays_config(reading.read_config(manager, 2))
    config.mesh.update(data=1, fsdp=1, tensor=1)
    run = pretraining.make_run(config, jax.devices()[:1])
    state, position = reading.restore(manager, 2, run.abstract, run.shardings)  # Checksums verified too.
  assert position["examples"] == 2 * config.batch_size and position["step"] == 2
  expected = np.load(os.path.join(GOLDEN, "expected_state.npz"))
  restored = {jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_flatten_with_path(state)[0]}
  assert sorted(restored) == sorted(expected.files)
  for name in expected.files:
    np.testing.assert_array_equal(restored[name], expected[name], err_msg=name)


def test_the_moving_average_is_an_item_restored_with_the_state_started_where_a_step_has_none_and_named_when_lost(
  tmp_path, caplog
):
  """A run keeping the parameters' moving average (ema_decay) resumes the golden step, which has none: it starts at
  the step's parameters. Saved, the step holds it as an item of its own with its checksums: restored bitwise, read
  alone by `restore_params`, left unread by a run that keeps none, and named when it is lost."""
  with checkpoints.read_only_manager(GOLDEN) as manager:
    config = _todays_config(reading.read_config(manager, 2))
    config.mesh.update(data=1, fsdp=1, tensor=1)
    config.ema_decay = 0.5
    run = pretraining.make_run(config, jax.devices()[:1])
    caplog.set_level(logging.INFO, logger="absl")
    state, position = start_order.restore_state(manager, 2, run.abstract, run.shardings)
  assert "Checkpoint step 2 keeps no moving average of the parameters: it starts at its parameters." in caplog.text
  jax.tree.map(np.testing.assert_array_equal, state_params(state), jax.device_get(state.ema))
  state = state.replace(ema=jax.tree.map(lambda x: x + 1, state.ema))  # Not the parameters: what was saved is read.
  workdir = tmp_path / "ema"
  manager = checkpoints.make_manager(str(workdir), 2)
  checkpoints.save(manager, 2, state, position, config)
  checkpoints.finish(manager, 2)
  assert "ema" in os.listdir(workdir / "checkpoints" / "2")
  with checkpoints.read_only_manager(str(workdir)) as manager:
    restored, _ = start_order.restore_state(manager, 2, run.abstract, run.shardings)
    alone = reading.restore_params(manager, 2, run.abstract.params, run.shardings.params, "ema")
    config.ema_decay = 0.0
    without = pretraining.make_run(config, jax.devices()[:1])
    assert reading.restore(manager, 2, without.abstract, without.shardings)[0].ema is None
  for tree in (restored.ema, alone):
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(tree), jax.device_get(state.ema))
  jax.tree.map(np.testing.assert_array_equal, state_params(restored), state_params(state))
  shutil.rmtree(workdir / "checkpoints" / "2" / "ema")
  with checkpoints.read_only_manager(str(workdir)) as manager:
    with pytest.raises(
      checkpoints.CorruptCheckpointError, match=r"Checkpoint step 2: item ema is missing \(.*/2/ema\)"
    ):
      reading.restore(manager, 2, run.abstract, run.shardings)


def test_small_replicated_arrays_are_saved_whole_by_one_replica(tmp_path, caplog):
  """Orbax would write an array held whole by 8 devices as 8 slices, compiling a slicing program per shape and device;
  under checkpoints.MIN_REPLICA_SLICE_BYTES per slice one replica writes it, and the save compiles nothing."""
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  tree = {"kernel": np.arange(64 * 24, dtype=np.float32).reshape(64, 24), "bias": np.ones(24, np.float32)}
  on_devices = jax.device_put(tree, replicated)
  jax.block_until_ready(on_devices)
  with caplog.at_level(logging.WARNING), jax.log_compiles():
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "tree", on_devices)
    checkpointer.wait_until_finished()
  compiled = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Compiling")]
  assert compiled == [], compiled[:3]
  restored = ocp.StandardCheckpointer().restore(tmp_path / "tree")
  jax.tree.map(np.testing.assert_array_equal, restored, tree)


def test_small_arrays_hash_on_the_host_to_what_the_device_program_gives_and_every_bit_counts():
  """`checksums.arrays` hashes small arrays this process holds whole with numpy, larger ones (and any spanning
  processes) with a jitted program where they lie: both give the same value for every dtype, layout and sharding,
  so a checkpoint verifies whichever path wrote its checksums."""
  from jax.sharding import NamedSharding, PartitionSpec

  from bert_jax.workdir import checksums

  rng = np.random.default_rng(0)
  mesh = jax.make_mesh((8,), ("x",))
  values = {
    "float32": rng.normal(size=(16, 24)).astype(np.float32),
    "bfloat16": rng.normal(size=(8, 3)).astype(jax.numpy.bfloat16),
    "float16 with inf": np.array([1.0, np.inf, -2.0], np.float16),
    "int32": rng.integers(-(2**31), 2**31 - 1, (40,), dtype=np.int32),
    "uint8": rng.integers(0, 255, (5, 7), dtype=np.uint8),
    "bool": rng.random(9) < 0.5,
    "empty": np.zeros((0, 4), np.float32),
    "scalar nan": np.float32(np.nan),
  }
  arrays = {name: jax.numpy.asarray(value) for name, value in values.items()}
  arrays["key"] = jax.random.key(3)
  arrays["float32 sharded"] = jax.device_put(values["float32"], NamedSharding(mesh, PartitionSpec("x")))
  arrays["float32 transposed"] = arrays["float32"].T
  for name, array in arrays.items():
    on_host = checksums._hash_on_host(array)
    on_device = jax.device_get(checksums._hash_one(array))
    assert (int(on_host[0]), bool(on_host[1])) == (int(on_device[0]), bool(on_device[1])), name
  with jax.enable_x64(True):  # 8-byte elements: two words each.
    for value in (rng.normal(size=(6, 5)), rng.integers(-(2**60), 2**60, (11,))):
      on_host, on_device = checksums._hash_on_host(jax.numpy.asarray(value)), checksums._hash(jax.numpy.asarray(value))
      assert int(on_host[0]) == int(on_device[0]) and bool(on_host[1]) == bool(on_device[1])
  hashes, nonfinite = checksums.arrays(arrays, "tree")
  assert nonfinite == ["tree/float16 with inf", "tree/scalar nan"]
  assert hashes["tree/float32 sharded"] == hashes["tree/float32"] != hashes["tree/float32 transposed"]
  # A flipped bit, a swapped pair, a large array (the jitted path) agreeing with its host hash.
  flipped = values["float32"].copy()
  flipped.reshape(-1).view(np.uint32)[5] ^= 1
  swapped = values["float32"].copy()
  swapped[0, [0, 1]] = swapped[0, [1, 0]]
  large = jax.numpy.asarray(rng.normal(size=(checksums.HOST_ELEMENTS + 1,)).astype(np.float32))
  others, _ = checksums.arrays(dict(flipped=flipped, swapped=swapped, large=large), "tree")
  assert len({hashes["tree/float32"], others["tree/flipped"], others["tree/swapped"]}) == 3
  assert others["tree/large"] == int(checksums._hash_on_host(large)[0])


def test_a_read_error_asyncio_finds_unretrieved_is_one_debug_line_and_any_other_stays_an_error(caplog):
  """Orbax's gather raises the first failed read of an item and leaves the others' errors unretrieved, which asyncio
  logs with their tracebacks whenever it frees them; those are one DEBUG line. Anyone else's stays an ERROR."""
  import asyncio

  def unretrieved(error: Exception) -> None:
    loop = asyncio.new_event_loop()
    loop.create_future().set_exception(error)  # Freed at once, never retrieved: asyncio logs it.
    loop.close()
    gc.collect()

  with caplog.at_level(logging.DEBUG, logger="asyncio"):
    unretrieved(ValueError('OUT_OF_RANGE: Error opening "zarr" driver [tensorstore_spec=...]'))
    unretrieved(ValueError("a user's own coroutine failed"))
  records = [record for record in caplog.records if "never retrieved" in record.getMessage()]
  assert [(record.levelname, record.exc_info is None) for record in records] == [("DEBUG", True), ("ERROR", False)]
  assert records[0].getMessage() == "Future exception was never retrieved"


def test_an_error_that_surfaces_only_when_the_manager_closes_never_replaces_the_one_on_its_way_out(
  tmp_path, monkeypatch, caplog
):
  """Orbax may raise a background save's error again, or for the first time, when the manager closes: `finish`
  turns it into the run's one line (a `SaveError` naming the step, or the lost lease) and never lets the storage's
  own exception escape (main would show it as a traceback)."""
  workdir = tmp_path / "run"
  item = {"kernel": np.arange(6, dtype=np.float32)}
  manager = checkpoints.make_manager(str(workdir), 1)
  manager.save(1, args=ocp.args.Composite(params=ocp.args.StandardSave(item)))
  close = manager.close

  def close_and_raise():
    close()
    raise FileNotFoundError("No such file or directory: '.../1.orbax-checkpoint-tmp/params/commit_success.txt'")

  monkeypatch.setattr(manager, "close", close_and_raise)
  with pytest.raises(checkpoints.SaveError, match=r"Saving checkpoint step 1 to .*/1 failed: No such file"):
    checkpoints.finish(manager, 1)
  with caplog.at_level(logging.ERROR):
    checkpoints.finish(manager, 1, raise_errors=False)  # Another error is on its way out: this one is logged.
  assert [record.getMessage()[:27] for record in caplog.records] == ["Saving checkpoint step 1 to"]


def test_a_save_whose_run_was_taken_over_before_its_commit_is_never_committed(tmp_path):
  """A run stopped past the lease's timeout after its check before a save and taken over: its save, woken, reaches
  its commit, which checks the lease and is refused (no step, nothing rotated out); the save fails with the lease's
  one line, and what the save wrote lies in a temporary directory named for this run, never in the new holder's."""
  workdir = tmp_path / "run"
  item = {"kernel": np.arange(6, dtype=np.float32)}
  with lease.claim(str(workdir), timeout_seconds=60) as held:
    manager = checkpoints.make_manager(str(workdir), 1, held=held)
    manager.save(1, args=ocp.args.Composite(params=ocp.args.StandardSave(item)))
    checkpoints.check_saves(manager, 1, held, wait=True)
    held.check()
    record = json.loads((workdir / lease.LEASE_NAME).read_text())
    taker = dict(record, run_id="taker", generation=2, pid=4242, taken_time=record["heartbeat_time"] + 400)
    (workdir / lease.LEASE_NAME).write_text(json.dumps(taker))  # The takeover, while this run slept.
    manager.save(2, args=ocp.args.Composite(params=ocp.args.StandardSave(item)))
    with pytest.raises(lease.LeaseLostError) as lost:
      checkpoints.check_saves(manager, 2, held, wait=True)
    assert str(lost.value).startswith(f"The lease of {workdir} was taken over by run taker (generation 2, ")
    assert str(lost.value).endswith("while this run was stopped; this run writes nothing more and exits.")
    checkpoints.finish(manager, 2, held, raise_errors=False)
  assert checkpoints.committed_steps(workdir / "checkpoints") == [1]  # Step 2 never committed; step 1 not rotated.
  temporary = f"2{ocp.path.atomicity.TMP_DIR_SUFFIX}-{held.token}"
  assert sorted(os.listdir(workdir / "checkpoints")) == ["1", temporary]
  assert json.loads((workdir / lease.LEASE_NAME).read_text()) == taker  # Neither rewritten nor deleted.


def test_a_new_holder_removes_the_lost_holders_temporaries_while_it_still_writes_and_its_late_ones_at_the_next_save(
  tmp_path, monkeypatch, caplog
):
  """A run taken over while its save of step 50 was in flight, woken as the new holder opens: its temporary
  (`50.orbax-checkpoint-tmp-<its token>`) gains a file while the new holder removes it ("Directory not empty", which
  Orbax's own removal raised at the new holder's first save). The new holder tries again, saves step 50, and removes
  what the lost run writes later (a temporary that appears between saves) at its next save; a temporary it cannot
  remove at all is left, in one warning line, and never fails its save."""
  workdir = tmp_path / "run"
  directory = workdir / "checkpoints"
  stale = directory / f"50{ocp.path.atomicity.TMP_DIR_SUFFIX}-2b80555"
  (stale / "params" / "d").mkdir(parents=True)
  (stale / "params" / "d" / "chunk").write_bytes(b"written by the lost run")
  late_writes = {"left": 1}
  rmdir = os.rmdir

  def rmdir_while_the_lost_run_writes(path, *args, **kwargs):
    if os.fspath(path) == str(stale) and late_writes["left"]:
      late_writes["left"] -= 1
      (stale / "late").write_bytes(b"x")  # The woken save's next file, just before its directory goes.
    return rmdir(path, *args, **kwargs)

  monkeypatch.setattr(os, "rmdir", rmdir_while_the_lost_run_writes)
  item = {"kernel": np.arange(6, dtype=np.float32)}
  with lease.claim(str(workdir), timeout_seconds=60) as held:
    manager = checkpoints.make_manager(str(workdir), 2, held=held)
    manager.save(50, args=ocp.args.Composite(params=ocp.args.StandardSave(item)))
    checkpoints.check_saves(manager, 50, held, wait=True)
    assert sorted(os.listdir(directory)) == ["50"]
    late = directory / f"50{ocp.path.atomicity.TMP_DIR_SUFFIX}-2b80555"
    (late / "params").mkdir(parents=True)  # What the lost run wrote after the removal.
    stuck = directory / f"40{ocp.path.atomicity.TMP_DIR_SUFFIX}"  # And one that gains a file at every try.
    stuck.mkdir()
    stale, late_writes["left"] = stuck, 1000
    with caplog.at_level(logging.WARNING):
      manager.save(60, args=ocp.args.Composite(params=ocp.args.StandardSave(item)))
      checkpoints.check_saves(manager, 60, held, wait=True)
    checkpoints.finish(manager, 60, held)
  assert sorted(os.listdir(directory)) == ["40.orbax-checkpoint-tmp", "50", "60"]
  assert [r.getMessage()[:70] for r in caplog.records if r.levelno == logging.WARNING] == [
    f"Left {stuck} in place for the next save to remove: [Errno 39] Directory not empty"[:70]
  ]


def test_a_write_still_in_flight_at_the_end_of_a_run_is_said_and_said_again_until_it_ends(monkeypatch):
  """The end of a run waits for its last checkpoint (a large sweep's final state and best/ took minutes on a loaded
  machine, with nothing on the console): the wait says which step it writes and where, again every
  STILL_WRITING_EVERY_SECONDS (here every poll), and how long it took."""

  class Manager:  # A save that is in flight for four polls.
    directory = "/runs/a/checkpoints"

    def __init__(self):
      self.polls = 0

    def is_saving_in_progress(self):
      self.polls += 1
      return self.polls <= 5

    def latest_step(self):
      return 7

    def wait_until_finished(self):
      pass

    def close(self):
      pass

  monkeypatch.setattr(checkpoints, "STILL_WRITING_EVERY_SECONDS", 0.0)
  monkeypatch.setattr(checkpoints.time, "sleep", lambda seconds: None)
  said = logged_by(checkpoints, monkeypatch)
  checkpoints.finish(Manager(), 7)
  assert said[0] == "Writing checkpoint step 7 to /runs/a/checkpoints/7 ..."
  assert sum(line.startswith("... still writing checkpoint step 7 (") for line in said) == 4
  assert said[-1].startswith("Checkpoint step 7 written in ") and len(said) == 6
  said.clear()
  checkpoints.finish(_Idle(), 7)  # Nothing in flight: nothing said.
  assert not said


class _Idle:
  directory = "/runs/a/checkpoints"

  def is_saving_in_progress(self):
    return False

  def wait_until_finished(self):
    pass

  def close(self):
    pass


@pytest.mark.slow  # A fresh interpreter.
def test_a_program_that_imports_checkpoints_before_parsing_its_flags_still_logs_at_info():
  """Every benchmark imports bert_jax before app.run parses its flags: the quieting of Orbax's handler registration
  at import marked --verbosity as given (-1, warnings only), and the jobs' progress lines never showed."""
  code = "\n".join(
    [
      "from absl import app, logging",
      "import bert_jax.workdir.checkpoints",
      "app.run(lambda argv: logging.info('a progress line'))",
    ]
  )
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "a progress line" in result.stderr
  assert "Type handler registry overriding" not in result.stderr  # Orbax's warning stays out.
