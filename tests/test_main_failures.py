"""A run that cannot go on ends with one line and leaves nothing half-written: a full disk at each write before the
first step (the embedded corpus, the lease, the checkpoint directory, TensorBoard's files), and a run frozen mid-save
whose lease another run took over (`python -m bert_jax.main` processes)."""

import errno
import os
import pathlib
import re
import signal
import subprocess
import time

import jax
import orbax.checkpoint as ocp
import pytest
from etils import epath

from bert_jax import jobs
from bert_jax.workdir import checkpoints as checkpoints_lib
from bert_jax.workdir import reading
from tests.helpers import FAST_COMPILES, ROOT, final_params, main_command, main_env

# A run of seconds: configs/tiny.py on synthetic batches at conftest.py's small_config sizes, a save every step.
SMALL_RUN_STEPS = 10
SMALL_RUN = [
  "--config.data.source=synthetic",
  "--config.model.vocab_size=101",
  "--config.model.hidden_size=32",
  "--config.model.num_heads=4",
  "--config.model.intermediate_size=48",
  "--config.data.max_seq_length=32",
  "--config.data.max_predictions_per_seq=5",
  "--config.batch_size=8",
  f"--config.num_train_steps={SMALL_RUN_STEPS}",
  "--config.warmup_steps=2",
  "--config.log_every_steps=1",
  "--config.checkpoint_every_steps=1",
  f"--config.keep_checkpoints={SMALL_RUN_STEPS}",
  "--config.eval_every_steps=1000",
  "--config.eval_steps=1",
]


def _in_flight(directory: pathlib.Path) -> str | None:
  """A step's temporary directory in `directory` whose items are still being written (an item's own temporary is
  still inside it: the save has not reached its commit, where the lease is checked), or None."""
  suffix = ocp.path.atomicity.TMP_DIR_SUFFIX
  try:
    for name in os.listdir(directory):
      if suffix in name and any(suffix in item for item in os.listdir(directory / name)):
        return name
  except FileNotFoundError:  # Not created yet, or committed (renamed) while it was listed.
    pass
  return None


@pytest.mark.slow
def test_a_run_stopped_mid_save_and_taken_over_commits_nothing_when_woken_and_exits_with_one_line(tmp_path):
  """A run frozen (SIGSTOP) mid-save past its `lease_timeout_seconds`; a second run on the workdir takes the lease
  over and saves the step the first had in flight; the first is woken (SIGCONT). The first commits nothing and
  exits 1 with one line; every step committed after the takeover is the second run's (its config records its own
  lease timeout), each whole and verified; the second finishes."""
  workdir, env = tmp_path / "run", dict(main_env(), XLA_FLAGS=FAST_COMPILES)
  directory = workdir / "checkpoints"
  logs = {name: tmp_path / f"{name}.log" for name in ("first", "second")}  # Files: a pipe nobody reads fills up.

  def launch(name: str, lease_timeout: float) -> subprocess.Popen:
    command = [*main_command(workdir), *SMALL_RUN, f"--config.lease_timeout_seconds={lease_timeout}"]
    with open(logs[name], "w") as log:
      return subprocess.Popen(command, cwd=ROOT, env=env, stderr=log, stdout=subprocess.DEVNULL)

  first = launch("first", 2.0)
  while True:  # Stopped during a save after one was committed, before that save's commit.
    assert first.poll() is None, logs["first"].read_text()[-3000:]
    if checkpoints_lib.committed_steps(directory) and _in_flight(directory):
      first.send_signal(signal.SIGSTOP)
      time.sleep(0.05)
      in_flight = _in_flight(directory)
      if in_flight:
        break
      first.send_signal(signal.SIGCONT)
    time.sleep(0.005)
  committed = checkpoints_lib.committed_steps(directory)
  step = int(in_flight.split(".")[0])
  assert step == committed[-1] + 1, (in_flight, committed)
  time.sleep(3.2)  # Past both runs' lease timeouts: the first's heartbeat stopped with it.
  second = launch("second", 3.0)
  while f"step {step}/{SMALL_RUN_STEPS} |" not in logs["second"].read_text():  # It saves step `step` next.
    assert second.poll() is None, logs["second"].read_text()[-3000:]
    time.sleep(0.05)
  first.send_signal(signal.SIGCONT)
  assert first.wait(timeout=120) == 1
  assert second.wait(timeout=300) == 0, logs["second"].read_text()[-3000:]

  first_log, second_log = logs["first"].read_text(), logs["second"].read_text()
  last = first_log.strip().splitlines()[-1]
  line = rf"ERROR The lease of {workdir} was taken over by run \w+ \(generation 2, .+\) at [\d\-T:]+ while this run "
  assert re.search(line + r"was stopped; this run writes nothing more and exits\.$", last), first_log[-3000:]
  assert first_log.count("The lease of ") == 1 and "Traceback" not in first_log, first_log[-3000:]
  assert "Taking over the lease" in second_log and "(stale)" in second_log
  assert f"Resumed from step {committed[-1]}" in second_log
  assert f"Training finished at step {SMALL_RUN_STEPS}" in second_log
  steps = checkpoints_lib.committed_steps(directory)
  assert steps == list(range(1, SMALL_RUN_STEPS + 1)), os.listdir(directory)
  reader = checkpoints_lib.read_only_manager(str(workdir))
  one_device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  for saved in steps:  # Every item there and matching the step's checksums; the runs told apart by their configs.
    assert reading.items(reader, saved) == {"params", "optimizer", "data", "config", "history", "checksums"}
    assert reading.read_data_position(reader, saved)["step"] == saved
    assert reading.read_history(reader, saved)["train"]["step"] == saved
    assert reading.read_config(reader, saved)["lease_timeout_seconds"] == (2.0 if saved <= committed[-1] else 3.0)
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), final_params(workdir, saved))
    reading.restore_params(reader, saved, abstract, jax.tree.map(lambda _: one_device, abstract))
  assert not (workdir / "LEASE").exists()  # The second gave it back; the first never wrote it again.


def _full_disk(*args):
  """What a write on a full disk raises, with no path (a write to an open file)."""
  raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class _FullFile:
  """An open file on a full disk: each write fails."""

  def __init__(self, fd):
    self._fd = fd

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    os.close(self._fd)

  write = staticmethod(_full_disk)


def _fill_the_disk(where: str, workdir: pathlib.Path, monkeypatch) -> pathlib.Path:
  """Makes the start of a run meet a full disk at `where`; returns the path the run should name."""
  gpath = type(epath.Path(workdir))
  if where in ("lease", "lease taken over"):  # The new LEASE's temporary file is on the full disk.
    from bert_jax.workdir import lease

    if where == "lease taken over":  # An empty LEASE (a run that met a full disk before this fix) is taken over.
      workdir.mkdir()
      (workdir / "LEASE").write_bytes(b"")

    def opened(path, mode="r"):
      return _FullFile(os.open(path, os.O_WRONLY | os.O_CREAT)) if path.endswith(".tmp") else open(path, mode)

    monkeypatch.setattr(lease, "open", opened, raising=False)
    return workdir / "LEASE"
  if where == "checkpoints":
    mkdir = gpath.mkdir
    monkeypatch.setattr(
      gpath, "mkdir", lambda path, *a, **k: _full_disk() if path.name == where else mkdir(path, *a, **k)
    )
    return workdir / "checkpoints"
  if where == "tensorboard":
    from bert_jax.tensorflow_cpu import tf

    def create_file_writer(logdir, *args, **kwargs):
      message = f"{logdir}/events.out.tfevents.1.v2; No space left on device\n\tCreating writable file [Op:Create]"
      raise tf.errors.ResourceExhaustedError(None, None, message)

    monkeypatch.setattr(tf.summary, "create_file_writer", create_file_writer)
    return workdir / "tensorboard" / "train" / "events.out.tfevents.1.v2"
  assert where == "corpus"
  monkeypatch.setattr(gpath, "write_text", _full_disk)
  return workdir / "corpus" / "python_docs.txt"


@pytest.mark.parametrize("where", ["corpus", "lease", "lease taken over", "checkpoints", "tensorboard"])
def test_a_full_disk_at_the_start_of_a_run_ends_with_one_line_naming_the_path(
  small_config, tmp_path, monkeypatch, caplog, where
):
  """Each write before the first step (the embedded corpus, the lease, the checkpoint directory, TensorBoard's
  files) on a full disk: exit 1 with one line naming the path and the cause (was a bare `OSError: [Errno 28] No
  space left on device` after a 38-line traceback), no LEASE or partial file left behind."""
  from bert_jax import main as main_module

  if where == "corpus":
    small_config.data.source = "pretraining"  # configs/tiny.py's embedded corpus, prepared in the workdir.
  workdir = tmp_path / "run"
  named = _fill_the_disk(where, workdir, monkeypatch)

  def exit_now(code):
    raise SystemExit(code)

  monkeypatch.setattr(os, "_exit", exit_now)
  checked = jobs.check(small_config, "pretrain")
  with pytest.raises(SystemExit) as exited:
    main_module._train(small_config, str(workdir), checked)
  assert exited.value.code == 1
  errors = [record.getMessage() for record in caplog.records if record.levelname == "ERROR"]
  assert errors == [f"Cannot write {named}: No space left on device."]
  left = [path for path in workdir.rglob("*") if path.is_file()]  # No LEASE of this run's, nothing cut short.
  assert left == ([workdir / "LEASE"] if where == "lease taken over" else [])
