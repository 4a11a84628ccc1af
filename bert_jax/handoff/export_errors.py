"""How an export fails and stops (`export.py`): one line for a failed write (`ExportError`: the target, the path, the
cause, what is left) or a SIGTERM (`ExportStopped`), the SIGTERM guard that writers defer, and Orbax's storage errors
read as the OSError they report (its own 130 error lines of a full disk at DEBUG)."""

import contextlib
import errno
import logging as std_logging
import os
import re
import signal
import threading

from etils import epath


class ExportError(RuntimeError):
  """A write failed (a full disk, a refused write); the message is one line: the target, the path being written, the
  cause, and what is left. `--mode=export` exits with `exit_code`."""

  exit_code = 1


class ExportStopped(BaseException):
  """SIGTERM stopped the export; the message is one line saying what is left. `--mode=export` exits with
  `exit_code` (128 + SIGTERM)."""

  exit_code = 128 + signal.SIGTERM


class Sigterm(BaseException):
  """Raised in the main thread by SIGTERM during an export."""


class StopOnSigterm:
  """While entered in the main thread (Python runs signal handlers there only; entered elsewhere it does nothing),
  SIGTERM raises `Sigterm` in the main thread, once: another one while the first unwinds is ignored. Within
  `deferred()` it is raised at the block's end; after `hold()`, a SIGTERM only sets `received`."""

  active: "StopOnSigterm | None" = None  # The one entered, for writers to defer it.

  def __enter__(self) -> "StopOnSigterm":
    self.received, self._held, self._deferring = False, False, False
    self._installed = threading.current_thread() is threading.main_thread()
    if self._installed:
      self._previous = signal.signal(signal.SIGTERM, self._handle)
      StopOnSigterm.active = self
    return self

  def _handle(self, signum, frame) -> None:
    first, self.received = not self.received, True
    if first and not self._held and not self._deferring:
      raise Sigterm()

  def hold(self) -> None:
    self._held = True

  @contextlib.contextmanager
  def deferred(self):
    self._deferring = True
    try:
      yield
    finally:
      self._deferring = False
    if self.received and not self._held:
      raise Sigterm()

  def __exit__(self, *exc_info) -> None:
    if self._installed:
      signal.signal(signal.SIGTERM, self._previous)
      StopOnSigterm.active = None


def sigterm_deferred():
  """A block that SIGTERM does not interrupt, but stops at its end (Orbax's background threads write until the
  checkpointer closes: cut short, they would write into a partial directory being removed)."""
  guard = StopOnSigterm.active
  return guard.deferred() if guard is not None else contextlib.nullcontext()


@contextlib.contextmanager
def writing(path):
  """Names `path` in an OSError raised while it is written, if the error names no file (a full disk's ENOSPC, raised
  by a write to an open file, does not)."""
  try:
    yield
  except OSError as error:
    if error.filename is None:
      error.filename = str(path)
    raise


def _orbax_error_lines_at_debug(record: std_logging.LogRecord) -> bool:
  """Orbax's own error lines of a failed save (one per thread of the save, 130 on a full disk) at DEBUG: the export's
  one line says the failure (`storage_errors_as_os_errors`)."""
  if "/orbax/" in record.pathname.replace(os.sep, "/") and record.levelno >= std_logging.ERROR:
    record.levelno, record.levelname = std_logging.DEBUG, "DEBUG"
  return True


@contextlib.contextmanager
def storage_errors_as_os_errors(path: epath.Path):
  """An Orbax save into `path` whose storage failed (tensorstore's error, a ValueError ending in the system's error
  code: "... Failed to write ...: No space left on device [os_error_code='28']") raises the OSError it reports, naming
  `path`, as every other write of an export does; Orbax's own error lines meanwhile at DEBUG."""
  absl_logger = std_logging.getLogger("absl")
  absl_logger.addFilter(_orbax_error_lines_at_debug)
  try:
    yield
  except (ValueError, RuntimeError) as error:
    code = re.search(r"os_error_code='(\d+)'", str(error))
    if code is None:
      raise
    raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), str(path)) from None
  finally:
    absl_logger.removeFilter(_orbax_error_lines_at_debug)


def cause(error: OSError) -> str:
  name = errno.errorcode.get(error.errno)
  return f"{error.strerror} ({name})" if error.strerror and name else str(error)


def one_line(error: BaseException, target: epath.Path, left: str) -> BaseException:
  """The error `export` raises for a SIGTERM or a failed write: one line with the target, the path, the cause and
  `left` (what is left)."""
  if isinstance(error, Sigterm):
    return ExportStopped(f"Export to {target} stopped by SIGTERM; {left}.")
  return ExportError(f"Export to {target} failed writing {error.filename or target}: {cause(error)}; {left}.")
