"""The workdir lease (bert_jax/workdir/lease.py), on a local disk and on GCS (the emulator of `gcs_bucket`)."""

import datetime
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import uuid

import fsspec
import pytest
from etils import epath

from bert_jax.workdir import lease

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(params=["local", "gcs"])
def workdir(request, tmp_path) -> str:
  """A workdir that does not exist yet: under tmp_path, or under a fresh prefix of the emulator's bucket."""
  if request.param == "local":
    return str(tmp_path / "run")
  return f"{request.getfixturevalue('gcs_bucket')}/{uuid.uuid4().hex}/run"


def read_lease(workdir) -> dict:
  """The LEASE, read whole in one request (epath's reads of gs:// can straddle a rewrite)."""
  path = f"{workdir}/{lease.LEASE_NAME}"
  return json.loads(
    fsspec.filesystem("gs").cat_file(path) if path.startswith("gs://") else epath.Path(path).read_text()
  )


def write_lease(workdir, **fields) -> None:
  """A LEASE as another run would write it, with an unconditional write."""
  now = time.time()
  record = dict(host="otherhost", pid=4242, run_id="other", start_time=now, heartbeat_time=now, command="other")
  epath.Path(workdir).mkdir(parents=True, exist_ok=True)
  epath.Path(workdir, lease.LEASE_NAME).write_text(json.dumps(record | fields))


def wait_for(condition, seconds=10.0) -> None:
  deadline = time.monotonic() + seconds
  while not condition():
    assert time.monotonic() < deadline, "timed out"
    time.sleep(0.02)


def test_acquire_records_the_holder_and_release_removes_it(workdir):
  with lease.hold(workdir, timeout_seconds=60) as held:
    record = read_lease(workdir)
    assert record["host"] == socket.gethostname() and record["pid"] == os.getpid()
    assert record["run_id"] == held.record["run_id"] and record["command"]
    assert record["start_time"] <= record["heartbeat_time"] <= time.time()
    held.check()
  assert not epath.Path(workdir, lease.LEASE_NAME).exists()


def test_release_on_an_exception(workdir):
  with pytest.raises(ValueError), lease.hold(workdir, timeout_seconds=60):
    raise ValueError("the run failed")
  assert not epath.Path(workdir, lease.LEASE_NAME).exists()


def test_a_live_lease_refuses_a_second_run(workdir):
  with lease.hold(workdir, timeout_seconds=60):
    with pytest.raises(lease.LeaseHeldError) as refused:
      lease.WorkdirLease(workdir, timeout_seconds=60).acquire()
    message = str(refused.value)
    assert socket.gethostname() in message and f"pid {os.getpid()}" in message and lease.LEASE_NAME in message
    assert "delete" in message and "stale" in message


def test_a_live_lease_refuses_another_process(workdir):
  attempt = "import sys; from bert_jax.workdir import lease; lease.WorkdirLease(sys.argv[1], 60).acquire()"
  with lease.hold(workdir, timeout_seconds=60):
    second = subprocess.run([sys.executable, "-c", attempt, workdir], cwd=REPO, capture_output=True, text=True)
  assert second.returncode != 0
  assert "LeaseHeldError" in second.stderr and f"pid {os.getpid()}" in second.stderr, second.stderr


def test_a_stale_lease_is_taken_over_with_a_warning(workdir, caplog):
  write_lease(workdir, heartbeat_time=time.time() - 1000)
  with caplog.at_level(logging.WARNING), lease.hold(workdir, timeout_seconds=60) as held:
    assert read_lease(workdir)["run_id"] == held.record["run_id"]
  assert any(
    "stale" in r.getMessage() and "otherhost" in r.getMessage() and "4242" in r.getMessage() for r in caplog.records
  )
  assert not epath.Path(workdir, lease.LEASE_NAME).exists()


@pytest.mark.parametrize("content", ["", "not json", '{"host": "h"}'])
def test_an_empty_or_unreadable_lease_is_taken_over_at_once(workdir, content, caplog):
  epath.Path(workdir).mkdir(parents=True, exist_ok=True)
  epath.Path(workdir, lease.LEASE_NAME).write_text(content)  # What a write cut short (a full disk) leaves.
  with caplog.at_level(logging.WARNING), lease.hold(workdir, timeout_seconds=300) as held:
    assert read_lease(workdir)["run_id"] == held.record["run_id"]
  assert any("empty or unreadable" in r.getMessage() for r in caplog.records)


def test_the_lease_of_a_dead_process_on_this_machine_is_taken_over_at_once_and_a_live_ones_is_not(tmp_path, caplog):
  workdir = str(tmp_path / "run")
  killed = (
    "import os, sys; from bert_jax.workdir import lease; lease.WorkdirLease(sys.argv[1], 300).acquire(); os._exit(9)"
  )
  assert subprocess.run([sys.executable, "-c", killed, workdir], cwd=REPO).returncode == 9  # As after SIGKILL.
  left = read_lease(workdir)
  assert left["pid"] != os.getpid() and time.time() - left["heartbeat_time"] < 300  # Fresh: not stale by age.
  with caplog.at_level(logging.WARNING), lease.hold(workdir, timeout_seconds=300) as held:
    assert read_lease(workdir)["run_id"] == held.record["run_id"]
  assert any("its process is gone" in r.getMessage() for r in caplog.records)

  # A pid reused by another process is no holder either; a live holder's lease is refused as before.
  write_lease(
    workdir, host=socket.gethostname(), process=left["process"].replace(f"/{left['pid']}/", f"/{os.getpid()}/")
  )
  with lease.hold(workdir, timeout_seconds=300):
    pass
  with lease.hold(workdir, timeout_seconds=300), pytest.raises(lease.LeaseHeldError, match=f"pid {os.getpid()}"):
    lease.WorkdirLease(workdir, timeout_seconds=300).acquire()


def test_the_heartbeat_advances(workdir):
  with lease.hold(workdir, timeout_seconds=60, heartbeat_seconds=0.05):
    first = read_lease(workdir)
    wait_for(lambda: read_lease(workdir)["heartbeat_time"] > first["heartbeat_time"])
    assert read_lease(workdir)["start_time"] == first["start_time"]


def test_a_lease_replaced_by_another_run_is_lost(workdir):
  with lease.hold(workdir, timeout_seconds=60, heartbeat_seconds=0.05) as held:
    write_lease(workdir)
    wait_for(lambda: held.lost)
    with pytest.raises(lease.LeaseLostError, match="otherhost"):
      held.check()
  assert read_lease(workdir)["run_id"] == "other"  # Not deleted: it is not this run's.


def _lost_line(run: lease.WorkdirLease, taker: lease.WorkdirLease) -> str:
  """The line a run taken over by `taker` stops with."""
  record = read_lease(run.workdir)
  holder = lease._describe(record)  # noqa: SLF001 - the holder as every message names it.
  assert f"run {taker.record['run_id']} (generation 2, host {socket.gethostname()}, pid {os.getpid()}" in holder
  taken = datetime.datetime.fromtimestamp(record["taken_time"]).isoformat(timespec="seconds")
  return (
    f"The lease of {run.workdir} was taken over by {holder} at {taken} while this run was stopped; this run "
    "writes nothing more and exits."
  )


def test_a_stalled_run_loses_its_lease_to_a_takeover_and_its_heartbeat_leaves_the_new_lease_alone(workdir):
  stalled = lease.WorkdirLease(workdir, timeout_seconds=0.3, heartbeat_seconds=1.5)  # Silent past its timeout.
  stalled.acquire()
  time.sleep(0.5)
  with lease.hold(workdir, timeout_seconds=0.3, heartbeat_seconds=60) as taker:  # Its LEASE stays as written.
    taken = read_lease(workdir)
    wait_for(lambda: stalled.lost)  # Its heartbeat's next beat found the takeover...
    assert read_lease(workdir) == taken  # ... and did not write over it.
    with pytest.raises(lease.LeaseLostError) as lost:
      stalled.check()
    assert str(lost.value) == _lost_line(stalled, taker)
    stalled.release()
    taker.check()
    assert read_lease(workdir) == taken
  assert not epath.Path(workdir, lease.LEASE_NAME).exists()


def test_a_run_stopped_past_its_timeout_finds_the_takeover_at_its_next_check_before_its_heartbeat_does(workdir):
  # A process woken by SIGCONT: its main thread may write before its heartbeat thread beats. check() reads LEASE.
  stopped = lease.WorkdirLease(workdir, timeout_seconds=0.3, heartbeat_seconds=60)
  stopped.acquire()
  stopped.check()
  first = read_lease(workdir)
  assert first["generation"] == 1 and first["taken_time"] == first["heartbeat_time"]
  time.sleep(0.5)
  with lease.hold(workdir, timeout_seconds=0.3, heartbeat_seconds=60) as taker:
    taken = read_lease(workdir)
    assert taken["generation"] == 2 and taken["run_id"] == taker.record["run_id"] != first["run_id"]
    assert first["taken_time"] < taken["taken_time"] <= time.time()
    assert not stopped.lost  # Its heartbeat has not beaten since.
    with pytest.raises(lease.LeaseLostError) as lost:
      stopped.check()
    assert str(lost.value) == _lost_line(stopped, taker)
    assert not lease.Holder(stopped, "0").holds()
    stopped.release()
    assert read_lease(workdir) == taken
  # A LEASE deleted under a run is lost too.
  with lease.hold(workdir, timeout_seconds=60, heartbeat_seconds=60) as held:
    epath.Path(workdir, lease.LEASE_NAME).unlink()
    with pytest.raises(lease.LeaseLostError, match="was deleted while this run held it; this run writes nothing"):
      held.check()


def test_a_run_frozen_while_it_holds_the_lock_stops_no_check_and_a_taker_gives_up_saying_why(tmp_path):
  """Locally, changes of LEASE take a `flock` on the workdir. A run frozen (SIGSTOP, a hung host) inside one keeps
  it: the others' checks read LEASE without it, and a run that would take over waits the lease timeout, then stops
  with a line that says what holds it, instead of waiting for good (the CI run of 2026-11-29 hung there)."""
  import fcntl

  workdir = str(tmp_path / "run")
  with lease.hold(workdir, timeout_seconds=60, heartbeat_seconds=60) as held:
    frozen = os.open(workdir, os.O_RDONLY)  # Another open file description: flock conflicts as another run's.
    fcntl.flock(frozen, fcntl.LOCK_EX)
    try:
      checking = threading.Thread(target=held.check, daemon=True)  # Reads LEASE: no lock.
      checking.start()
      checking.join(timeout=5)
      assert not checking.is_alive(), "check() waits for the frozen run's lock"
      write_lease(workdir, heartbeat_time=time.time() - 1000)  # Stale: a taker would rewrite it, under the lock.
      started = time.monotonic()
      with pytest.raises(
        lease.LeaseHeldError, match=r"held the lock on .*run \(flock.* for more than 1 s: a run frozen"
      ):
        lease.WorkdirLease(workdir, timeout_seconds=1.0, heartbeat_seconds=60).acquire()
      assert 1.0 <= time.monotonic() - started < 5.0
    finally:
      os.close(frozen)
  assert read_lease(workdir)["run_id"] == "other"


@pytest.mark.parametrize("stale", [False, True])
def test_one_of_eight_concurrent_runs_wins(workdir, stale):
  if stale:  # They all find the same stale lease and race to take it over.
    write_lease(workdir, heartbeat_time=time.time() - 1000)
  runs = [lease.WorkdirLease(workdir, timeout_seconds=60) for _ in range(8)]
  barrier, outcomes = threading.Barrier(len(runs)), {}

  def start(run):
    barrier.wait()
    try:
      run.acquire()
      outcomes[run.record["run_id"]] = "won"
    except lease.LeaseHeldError:
      outcomes[run.record["run_id"]] = "refused"

  threads = [threading.Thread(target=start, args=(run,)) for run in runs]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  winners = [run for run in runs if outcomes[run.record["run_id"]] == "won"]
  assert len(winners) == 1, outcomes
  assert read_lease(workdir)["run_id"] == winners[0].record["run_id"]
  winners[0].release()


@pytest.mark.slow
def test_one_of_four_concurrent_processes_wins(workdir):
  # Each process tries at the same moment; the winner holds the lease until its stdin closes.
  attempt = (
    "import sys, time\n"
    "from bert_jax.workdir import lease\n"
    "run = lease.WorkdirLease(sys.argv[1], 60)\n"
    "time.sleep(max(0.0, float(sys.argv[2]) - time.time()))\n"
    "try:\n"
    "  run.acquire()\n"
    "except lease.LeaseHeldError:\n"
    "  print('refused', flush=True)\n"
    "  sys.exit()\n"
    "print('won', flush=True)\n"
    "sys.stdin.read()\n"
    "run.release()\n"
  )
  start_at = str(time.time() + 2)
  processes = [
    subprocess.Popen(
      [sys.executable, "-c", attempt, workdir, start_at], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    for _ in range(4)
  ]
  outcomes = sorted(process.stdout.readline().strip() for process in processes)
  for process in processes:
    process.stdin.close()
    assert process.wait(timeout=30) == 0
    process.stdout.close()
  assert outcomes == [b"refused"] * 3 + [b"won"]
  assert not epath.Path(workdir, lease.LEASE_NAME).exists()
