"""A lease on a workdir, so that one training run at a time writes to it.

Process 0 of a run takes the lease before it writes anything else (creating the workdir directory is the one
exception) and gives it back when the run ends:

- Take: create `<workdir>/LEASE`, a JSON record of the holder (host, pid, a random run id, start time, heartbeat
  time, command line), only if it does not exist: on a local disk a written temporary file linked into place
  (`os.link` refuses an existing LEASE), on GCS an upload with the precondition `ifGenerationMatch=0` (the server
  answers 412 if the object exists).
- If a LEASE exists and its heartbeat is younger than `timeout_seconds`, the run is refused (`LeaseHeldError`, naming
  the holder). If it is older (the holder was killed, or hangs), the run takes it over, with a warning. A holder on
  this machine (same host name, boot and PID namespace) whose process is gone, or is another process under a reused
  pid (its start time differs), is dead at once: after SIGKILL, an out-of-memory kill or an abort, the same command
  starts without waiting. A LEASE that is empty or cannot be read (a write cut short by a full disk) is stale too:
  a holder's LEASE is written whole (an exclusive create under the lock, or an atomic rename; one upload on GCS).
- Each taking writes a new record: a new run id (the token `check()` compares), the next `generation` (1 for a
  LEASE created, the previous holder's plus 1 for a takeover) and `taken_time`.
- Keep: a daemon thread rewrites the heartbeat every `heartbeat_seconds`, each time a compare-and-swap against the
  LEASE this run last wrote, so it never rewrites a LEASE another run has taken over. If it finds one, it sets
  `lost`.
- Check: `check()`, called before every write into the workdir (the loop's saves and logs, a job's files, and the
  commit of every checkpoint step, see `checkpoints.make_manager`), reads LEASE and raises `LeaseLostError` unless
  it still names this run. So a run that was stopped (SIGSTOP, a hung host) past the timeout and taken over learns
  it before its next write, not at its heartbeat's next beat. What it cannot close: a process stopped between a
  check and the write after it (a rename, one file) still makes that one write when it wakes.
- Give back: delete LEASE if it is still this run's. A run that is killed (SIGKILL) leaves it; it goes stale after
  `timeout_seconds`.

Every change after the creation is a compare-and-swap against the LEASE as last read: on GCS a precondition on the
object's generation, checked by the server; locally a rewrite (temporary file, `os.replace`) or deletion after
re-reading the file under an exclusive `flock` on the workdir directory, which every change here takes. So of
runs that start together, or that find one stale lease together, exactly one wins. Locally a LEASE only ever
appears whole (the creation links a written temporary file into place, which fails if LEASE exists; a rewrite is
an `os.replace`), so reading it (`check()`, before every write) takes no lock: a run frozen (SIGSTOP, a hung host)
while it held the lock would otherwise leave every other run waiting on it for good. The lock is held only for a
change (the heartbeat's, every `heartbeat_seconds`); a run that finds it held for longer than `timeout_seconds`
stops with `LeaseHeldError` instead of waiting. Limits: locally, `flock` excludes processes of one machine; a
workdir on a network file system shared by several machines relies on that file system's lock emulation. Ages
compare the reader's clock with the holder's: keep the timeout well above the clock skew between hosts, and above
the longest pause of a whole process (which stops its heartbeat too).
"""

import contextlib
import datetime
import fcntl
import json
import math
import os
import socket
import sys
import threading
import time
import uuid

import fsspec
from absl import logging

from bert_jax import paths

LEASE_NAME = "LEASE"
_CHANGED = (FileExistsError, FileNotFoundError)  # What a compare-and-swap raises when the lease is not as last read.


class LeaseError(RuntimeError):
  """The run cannot hold its workdir (see the subclasses)."""


class LeaseHeldError(LeaseError):
  """Another live run holds the workdir's lease."""


class LeaseLostError(LeaseError):
  """This run's lease was taken over by another run: it must stop writing to the workdir."""


class _LocalStore:
  """LEASE on a local disk. A version is the file's bytes; changes compare it under an exclusive `flock` on the
  directory, waited for at most `lock_wait_seconds`."""

  def __init__(self, path: str, lock_wait_seconds: float):
    self.path = path
    self.lock_wait_seconds = lock_wait_seconds

  @contextlib.contextmanager
  def _locked(self):
    directory = os.open(os.path.dirname(self.path), os.O_RDONLY)
    try:
      deadline = time.monotonic() + self.lock_wait_seconds
      while True:
        try:
          fcntl.flock(directory, fcntl.LOCK_EX | fcntl.LOCK_NB)
          break
        except BlockingIOError:
          if time.monotonic() > deadline:
            raise LeaseHeldError(
              f"Another process has held the lock on {os.path.dirname(self.path)} (flock, for changes of "
              f"{self.path}) for more than {self.lock_wait_seconds:.0f} s: a run frozen (SIGSTOP, a hung host) "
              "while it changed the lease. Stop or wake that run, then start again."
            ) from None
          time.sleep(0.01)
      yield
    finally:
      os.close(directory)  # Releases the lock.

  def _read(self):
    try:
      with open(self.path, "rb") as f:
        return f.read(), os.fstat(f.fileno()).st_mtime
    except FileNotFoundError:
      return None, None

  def read(self):
    """(content, version, modification time), or None if there is no LEASE. No lock: a LEASE appears whole."""
    data, mtime = self._read()
    return None if data is None else (data, data, mtime)

  def create(self, data: bytes) -> bytes:
    """Writes LEASE if there is none (FileExistsError otherwise): a temporary file, linked into place whole."""
    temporary = f"{self.path}.{uuid.uuid4().hex}.tmp"
    try:
      with paths.writing(self.path):
        with open(temporary, "wb") as f:  # Outside the lock: it is held for the link alone.
          f.write(data)
        with self._locked():
          os.link(temporary, self.path)  # FileExistsError if it exists.
    finally:
      if os.path.exists(temporary):
        os.remove(temporary)  # Linked, or a write cut short (a full disk): no empty LEASE is left.
    return data

  def replace(self, data: bytes, version: bytes) -> bytes:
    with self._locked():
      self._check(version)
      temporary = f"{self.path}.{uuid.uuid4().hex}.tmp"
      try:
        with paths.writing(self.path), open(temporary, "wb") as f:
          f.write(data)
        os.replace(temporary, self.path)
      finally:
        if os.path.exists(temporary):  # A write cut short (a full disk).
          os.remove(temporary)
    return data

  def delete(self, version: bytes) -> None:
    with self._locked():
      self._check(version)
      os.remove(self.path)

  def _check(self, version: bytes) -> None:
    data, _ = self._read()
    if data is None:
      raise FileNotFoundError(self.path)
    if data != version:
      raise FileExistsError(self.path)


class _GcsStore:
  """LEASE on GCS through gcsfs. A version is the object's generation, which the server checks."""

  def __init__(self, path: str):
    self.path, self.fs = path, fsspec.filesystem("gs")
    self.bucket, self.key, _ = self.fs.split_path(path)

  def read(self):
    while True:
      try:
        meta = self.fs.call("GET", "b/{}/o/{}", self.bucket, self.key, json_out=True)
      except FileNotFoundError:
        return None
      try:
        _, data = self.fs.call("GET", "b/{}/o/{}", self.bucket, self.key, alt="media", generation=meta["generation"])
      except FileNotFoundError:
        continue  # Replaced between its metadata and its content: read both again.
      return data, meta["generation"], datetime.datetime.fromisoformat(meta["updated"]).timestamp()

  def create(self, data: bytes) -> str:
    return self.replace(data, 0)

  def replace(self, data: bytes, version) -> str:
    """Uploads `data` if the object's generation is `version` (0: if there is no object); 412 -> FileExistsError.

    A multipart upload, like gcsfs's `pipe_file(..., mode="create")`, which only has `ifGenerationMatch=0`: the
    emulator of the tests ignores preconditions on media uploads."""
    metadata = json.dumps({"name": self.key}).encode()
    body = b"\r\n".join(
      [b"--lease", b"Content-Type: application/json", b"", metadata, b"--lease", b"", data, b"--lease--"]
    )
    written = self.fs.call(
      "POST",
      f"{self.fs._location}/upload/storage/v1/b/{{}}/o",
      self.bucket,
      uploadType="multipart",
      ifGenerationMatch=version,
      headers={"Content-Type": 'multipart/related; boundary="lease"'},
      data=body,
      json_out=True,
    )
    return written["generation"]

  def delete(self, version) -> None:
    # GCS checks the precondition; the emulator ignores it on deletions, so look first too.
    meta = self.fs.call("GET", "b/{}/o/{}", self.bucket, self.key, json_out=True)
    if meta["generation"] != version:
      raise FileExistsError(self.path)
    self.fs.call("DELETE", "b/{}/o/{}", self.bucket, self.key, ifGenerationMatch=version)


def _process_identity(pid: int) -> str | None:
  """ "boot id/PID namespace/pid/start time" of process `pid` of this machine, None if it is gone (or /proc does not
  tell): equal for the same living process, different for a process that reuses its pid."""
  try:
    with open("/proc/sys/kernel/random/boot_id") as f:
      boot = f.read().strip()
    with open(f"/proc/{pid}/stat") as f:
      start = f.read().rsplit(")", 1)[1].split()[19]  # Field 22, the start time in clock ticks after boot.
    return f"{boot}/{os.readlink('/proc/self/ns/pid')}/{pid}/{start}"
  except (OSError, IndexError):
    return None


def _dead_here(holder: dict) -> bool:
  """Whether `holder` ran on this machine (host, boot, PID namespace) in a process that is gone."""
  recorded = holder.get("process")
  if holder.get("host") != socket.gethostname() or not isinstance(recorded, str) or recorded.count("/") != 3:
    return False
  mine = _process_identity(os.getpid())
  if mine is None or mine.split("/")[:2] != recorded.split("/")[:2]:
    return False  # Another boot or PID namespace: its pids mean nothing here.
  return _process_identity(int(recorded.split("/")[2])) != recorded


def _decode(data: bytes) -> dict | None:
  """The holder's record, or None if `data` is not one."""
  try:
    record = json.loads(data)
    return record if isinstance(record, dict) and isinstance(record.get("heartbeat_time"), int | float) else None
  except ValueError:
    return None


def _generation(holder: dict | None) -> int:
  """The generation `holder` records (0: none, or not a record)."""
  generation = (holder or {}).get("generation")
  return generation if isinstance(generation, int) else 0


def _describe(holder: dict | None) -> str:
  if holder is None:
    return "an unreadable lease"
  started = datetime.datetime.fromtimestamp(holder.get("start_time", 0)).isoformat(timespec="seconds")
  generation = f"generation {holder['generation']}, " if "generation" in holder else ""
  return (
    f"run {holder.get('run_id')} ({generation}host {holder.get('host')}, pid {holder.get('pid')}, started {started}, "
    f"command {holder.get('command')!r})"
  )


class WorkdirLease:
  """The lease on `workdir` (local or gs://) of this run; a context manager (acquire, then release)."""

  def __init__(self, workdir, timeout_seconds: float, heartbeat_seconds: float | None = None):
    self.path = os.fspath(paths.absolute(workdir) / LEASE_NAME)
    self.timeout_seconds = timeout_seconds
    self.heartbeat_seconds = heartbeat_seconds or timeout_seconds / 10
    now = time.time()
    self.workdir = os.fspath(paths.absolute(workdir))
    self.record = dict(
      host=socket.gethostname(), pid=os.getpid(), run_id=uuid.uuid4().hex, start_time=now, heartbeat_time=now
    )
    self.record["command"] = " ".join(sys.argv)
    self.record["process"] = _process_identity(os.getpid())
    self._store = _LocalStore(self.path, timeout_seconds) if paths.is_local(self.path) else _GcsStore(self.path)
    self._version = None  # Of the LEASE this run last wrote; None while it holds none.
    self._renewed = now
    self._lost = ""  # Why the lease was lost: said once, by the LeaseLostError that `check()` raises.
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._keep, name="workdir-lease", daemon=True)

  def acquire(self) -> None:
    """Takes the lease, or raises LeaseHeldError naming the live run that holds it (paths.WriteError naming the
    path that cannot be written: a full disk leaves no LEASE)."""
    if paths.is_local(self.path):
      with paths.writing(os.path.dirname(self.path)):
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
    for _ in range(5):  # Each pass wins, refuses, or finds that the lease changed since it looked, and looks again.
      self.record["heartbeat_time"] = self.record["taken_time"] = self._renewed = time.time()
      self.record["generation"] = 1
      try:
        self._version = self._store.create(json.dumps(self.record).encode())
        break
      except FileExistsError:
        pass
      found = self._store.read()
      if found is None:
        continue  # Given back meanwhile.
      data, version, _ = found
      holder = _decode(data)
      age = time.time() - holder["heartbeat_time"] if holder else math.inf
      dead = holder is not None and _dead_here(holder)
      if age < self.timeout_seconds and not dead:
        raise LeaseHeldError(
          f"The workdir is in use: {self.path} is held by {_describe(holder)}, last heartbeat {age:.0f} s ago "
          f"(stale after {self.timeout_seconds:.0f} s). Wait for that run to end, or stop it; if it is dead, delete "
          f"{self.path} or wait {self.timeout_seconds - age:.0f} s for the lease to go stale."
        )
      why = "its process is gone" if dead else "it is empty or unreadable" if holder is None else "stale"
      logging.warning(
        "Taking over the lease %s of %s (%s): last heartbeat %.0f s ago.", self.path, _describe(holder), why, age
      )
      self.record["generation"] = _generation(holder) + 1
      try:
        self._version = self._store.replace(json.dumps(self.record).encode(), version)
        break
      except _CHANGED:
        continue  # Another run took it over first, or it was given back: look again.
    else:
      raise LeaseHeldError(f"{self.path} kept changing while this run tried to take it; is another run starting?")
    logging.info("Holding the lease %s as run %s.", self.path, self.record["run_id"])
    self._thread.start()

  def _keep(self) -> None:
    """The heartbeat thread: renews the lease until it is released or lost."""
    while not self._lost and not self._stop.wait(self.heartbeat_seconds):
      try:
        self._renew()
      except Exception as e:  # The storage may answer again at the next beat.
        logging.warning("Could not renew the lease %s: %s", self.path, e)
        self._lose_if_silent(e)

  def _lose_if_silent(self, error: Exception) -> None:
    """After a renewal or a read that failed: the lease is lost once it has not been renewed for the timeout
    (another run may have taken it over)."""
    silent = time.time() - self._renewed
    if silent > self.timeout_seconds:
      self._lost = (
        f"The lease of {self.workdir} was not renewed for {silent:.0f} s ({error}), so another run may have taken "
        "it over; this run writes nothing more and exits."
      )

  def _renew(self) -> None:
    record = dict(self.record, heartbeat_time=time.time())
    try:
      self._version = self._store.replace(json.dumps(record).encode(), self._version)
      self._renewed = record["heartbeat_time"]
    except _CHANGED:
      found = self._store.read()
      if found and self._names_this_run(found[0]):  # A retried write had landed: go on from it.
        self._version = found[1]
      else:
        self._lose_to(found)

  def _names_this_run(self, data: bytes) -> bool:
    holder = _decode(data)
    return holder is not None and holder.get("run_id") == self.record["run_id"]

  def _lose_to(self, found) -> None:
    """The lease is lost to what LEASE now holds (`found`, as `read` returns it; None: deleted)."""
    holder = _decode(found[0]) if found else None
    if holder is not None:
      taken = datetime.datetime.fromtimestamp(holder.get("taken_time", holder["heartbeat_time"]))
      why = f"was taken over by {_describe(holder)} at {taken.isoformat(timespec='seconds')} while this run was stopped"
    else:
      why = "was deleted while this run held it" if found is None else "was replaced by an unreadable one"
    self._lost = f"The lease of {self.workdir} {why}; this run writes nothing more and exits."

  @property
  def lost(self) -> bool:
    return bool(self._lost)

  def check(self) -> None:
    """Raises LeaseLostError unless LEASE still names this run (its run id, the token of this taking), read now.

    If LEASE cannot be read, the heartbeat's last renewal decides: younger than the timeout, no run can have taken
    it over (as long as clocks agree); older, it is lost."""
    if not self._lost:
      try:
        found = self._store.read()
      except Exception as error:  # noqa: BLE001 - whatever the storage raised.
        self._lose_if_silent(error)
      else:
        if not (found and self._names_this_run(found[0])):
          self._lose_to(found)
    if self._lost:
      raise LeaseLostError(self._lost)

  def release(self) -> None:
    """Stops the heartbeat and deletes LEASE if it is still this run's."""
    self._stop.set()
    if self._thread.is_alive():
      self._thread.join()
    if self._version is None or self._lost:
      return
    try:
      self._store.delete(self._version)
    except _CHANGED:
      logging.warning("Not deleting the lease %s: it is no longer this run's.", self.path)
    self._version = None

  def __enter__(self) -> "WorkdirLease":
    self.acquire()
    return self

  def __exit__(self, *exc_info) -> None:
    self.release()


def hold(workdir, timeout_seconds: float, heartbeat_seconds: float | None = None) -> WorkdirLease:
  """`with hold(workdir, timeout_seconds) as lease:` holds the workdir's lease for the block (process 0 only)."""
  return WorkdirLease(workdir, timeout_seconds, heartbeat_seconds)


class Holder:
  """What every process of a run holds while it writes to the workdir: process 0 the lease itself, the others
  nothing; `check()` raises `LeaseLostError` on process 0 once another run has taken the lease over. `token`, the
  same on every process, names this taking of the lease (the start of its run id): a checkpoint step's temporary
  directory is named for it (`checkpoints.make_manager`)."""

  def __init__(self, lease: WorkdirLease | None, token: str):
    self.lease, self.token = lease, token

  def check(self) -> None:
    if self.lease is not None:
      self.lease.check()

  def holds(self) -> bool:
    """`check()` as a yes or no."""
    try:
      self.check()
    except LeaseLostError:
      return False
    return True


_TOKEN_DIGITS = 7  # Hex digits of the run id in a token: 28 bits, which one int32 carries to the other processes.


@contextlib.contextmanager
def claim(workdir, timeout_seconds: float, directories=()):
  """`with claim(workdir, timeout) as held:` the run's hold on `workdir`, on every process. Process 0 takes the
  lease, then creates `directories` (so that every process finds them when it looks), and then tells the others
  whether it got the lease, and its token (a collective): a refused run stops on every process, with the holder
  named on process 0 and a pointer to it on the others."""
  import jax
  import numpy as np
  from jax.experimental import multihost_utils

  lease, refused, token = None, None, "0"
  if jax.process_index() == 0:
    lease = WorkdirLease(workdir, timeout_seconds)
    token = lease.record["run_id"][:_TOKEN_DIGITS]
    try:
      lease.acquire()
      for directory in directories:
        with paths.writing(directory):
          paths.absolute(directory).mkdir(parents=True, exist_ok=True)
    except LeaseHeldError as error:
      refused = error
    except paths.WriteError:
      lease.release()  # A run that cannot create its directories leaves no lease behind.
      raise
  if jax.process_count() > 1:
    told = multihost_utils.broadcast_one_to_all(np.array([refused is None, int(token, 16)], np.int32))
    held, token = bool(told[0]), f"{int(told[1]):0{_TOKEN_DIGITS}x}"
    if not held and refused is None:
      refused = LeaseHeldError(f"Process 0 could not take the lease of {workdir}; its log names the run holding it.")
  if refused is not None:
    raise refused
  try:
    yield Holder(lease, token)
  finally:
    if lease is not None:
      lease.release()
