"""What a person sees in the terminal: one short line format (`HH:MM:SS message`, `WARNING`/`ERROR` named), and
the known noise of the libraries under bert_jax left out, so the progress lines stand alone.

Left out unless verbose: TensorFlow's and XLA's native start-up lines (written to file descriptor 2 by their C++
logging while TensorFlow is imported and its GPUs are hidden: the oneDNN notice, "Could not find cuda drivers",
"failed call to cuInit" on a machine without a GPU, CPU-feature notices, absl's "before InitializeLog" banner);
JAX's INFO probes of platforms the machine lacks ("Unable to initialize backend 'tpu'"); TensorFlow's INFO timing
of each input-pipeline save ("Sharding callback duration"); Orbax's INFO lines of each checkpoint. Everything
else, every warning and error included, is shown. Verbose (`main.py --verbose`, or `BERT_JAX_VERBOSE=1` in the
environment, which worker processes inherit) shows everything in absl's own format; `--log_dir` keeps absl's full
log in a file whatever the console shows.
"""

import contextlib
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time

from absl import flags
from absl import logging as absl_logging

VERBOSE_ENV = "BERT_JAX_VERBOSE"

# Whole lines the native libraries print at start-up that say nothing about the run (INFO-level ones are matched
# with their level, so an error or fatal line from the same place is kept).
_NATIVE_NOISE = re.compile(
  "|".join(
    [
      r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$",
      r"^I\d{4} [\d:. ]+\d+ port\.cc:\d+\] oneDNN custom operations are on\.",
      r"^I\d{4} [\d:. ]+\d+ cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine, GPU will not be used\.",
      # No CUDA driver at all on a CPU machine (303); any other cuInit failure is shown.
      r"^E\d{4} [\d:. ]+\d+ cuda_platform\.cc:\d+\] failed call to cuInit: .*\(303\)$",
      # "This TensorFlow binary is optimized to use available CPU instructions ..." and its second line.
      r"^I\d{4} [\d:. ]+\d+ cpu_feature_guard\.cc:\d+\] ",
      r"^To enable the following instructions: .*, in other operations, rebuild TensorFlow with the appropriate "
      r"compiler flags\.$",
      r"^E\d{4} [\d:. ]+\d+ \S+\] Unable to register cu(DNN|FFT|BLAS) factory: ",  # TensorFlow and JAX, both.
      r"^E\d{4} [\d:. ]+\d+ \S+\] computation placer already registered\.",
      # libtpu installed (bert_jax[tpu], to compile for TPU topologies) on a machine that is not a TPU VM: JAX's
      # backend probe finds no accelerator type, no workers and no TPU (a TPU VM names all three).
      r"^Failed to find host bounds for accelerator type: WARNING: could not determine TPU accelerator type",
      r"^WARNING: Logging before InitGoogle\(\) is written to STDERR$",
      r"^E\d{4} [\d:. ]+\d+ common_lib\.cc:\d+\] INVALID_ARGUMENT: Error: unexpected worker hostname 'WARNING: "
      r"could not determine TPU worker hostnames",
      r"^=== Source Location Trace: === ?$",
      r"^learning/\w+/tfrc/runtime/libtpu_init_utils\.cc:\d+$",
    ]
  )
)

# (where the record comes from, the start of its message) of third-party INFO records; "" matches any message.
_LIBRARY_NOISE = (
  # JAX probing for libtpu on a machine without it; a TPU that is there but fails says why in another message.
  ("/jax/_src/xla_bridge.py", "Unable to initialize backend 'tpu': INTERNAL: Failed to open libtpu.so"),
  # ... and with libtpu installed (to compile for TPU topologies) on a machine with no TPU chip.
  ("/jax/_src/xla_bridge.py", "Unable to initialize backend 'tpu': NOT_FOUND: TPU initialization failed: No jellyfish"),
  ("/tensorflow/python/checkpoint/functional_saver.py", "Sharding callback duration"),
  ("/orbax/", ""),
)

# The filter between file descriptor 2 and the console while native noise is left out: a process of its own, so
# that what a crashing import prints (an abort message, a fatal log line, a faulthandler traceback) still reaches
# the console after the process is gone.
_FILTER = """
import re, sys
noise = re.compile(sys.argv[1])
for line in sys.stdin.buffer:
  if not noise.search(line.decode("utf-8", "replace").rstrip("\\n")):
    sys.stdout.buffer.write(line)
    sys.stdout.buffer.flush()
"""


def native_noise(line: str) -> bool:
  """Whether `line` is one of the known native start-up lines."""
  return bool(_NATIVE_NOISE.search(line.rstrip("\n")))


def verbose() -> bool:
  return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


@contextlib.contextmanager
def native_noise_left_out():
  """Runs the block with file descriptor 2 (where native libraries log) going through a filter process that
  writes every line that is not known start-up noise to the console, as it comes. Verbose, or without a
  descriptor 2 or a filter process: the block runs as it is."""
  if verbose() or sys.stderr is None:
    yield
    return
  try:
    sys.stderr.flush()
    saved = os.dup(2)
  except (OSError, ValueError):  # No descriptor 2 (or a closed sys.stderr): nothing to filter.
    yield
    return
  try:
    command = [sys.executable, "-I", "-S", "-c", _FILTER, _NATIVE_NOISE.pattern]
    filter_process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=saved, stderr=saved)
  except OSError:
    os.close(saved)
    yield
    return
  os.dup2(filter_process.stdin.fileno(), 2)
  try:
    yield
  finally:
    sys.stderr.flush()
    os.dup2(saved, 2)
    os.close(saved)
    filter_process.stdin.close()  # Its end of file: it writes what it holds, then ends.
    filter_process.wait()


def is_library_noise(record: logging.LogRecord) -> bool:
  if record.levelno > logging.INFO:
    return False
  pathname = record.pathname.replace(os.sep, "/")
  return any(place in pathname and record.getMessage().startswith(start) for place, start in _LIBRARY_NOISE)


def _one_line_storage_errors(record: logging.LogRecord) -> bool:
  # Orbax logs a failed background save with its traceback; the loop reports it once, with its step, path and
  # cause, as the run's last line (see main.py), so Orbax's own error keeps its first line only.
  if "/orbax/" in record.pathname and record.levelno >= logging.ERROR:
    record.exc_info, record.exc_text = None, None
    record.msg = str(record.msg).split("\n")[0]
  return True


def _left_in(record: logging.LogRecord) -> bool:
  return not is_library_noise(record)


class ConsoleFormatter(logging.Formatter):
  """`HH:MM:SS message`; warnings and errors name their level; a process other than 0 of several names itself;
  the lines after a message's first are indented under it."""

  def __init__(self):
    super().__init__()
    self.process = ""

  def format(self, record: logging.LogRecord) -> str:
    level = "" if record.levelno < logging.WARNING else f"{logging.getLevelName(record.levelno)} "
    prefix = f"{time.strftime('%H:%M:%S', time.localtime(record.created))} {self.process}{level}"
    text = record.getMessage()
    if record.exc_info and not record.exc_text:
      record.exc_text = self.formatException(record.exc_info)
    if record.exc_text:
      text = f"{text}\n{record.exc_text}"
    first, *rest = text.split("\n")
    return "\n".join([prefix + first, *(" " * len(prefix) + line for line in rest)])


_FORMATTER = ConsoleFormatter()


def configure(verbose_flag: bool = False, log_dir: str = "") -> None:
  """Sets up the console on absl's handler (main.py: once flags are parsed and before TensorFlow is imported, the
  import being where native noise is left out; a notebook: before training). `log_dir`: also absl's full log, in
  absl's format, in `<log_dir>/bert_jax.<host>.<pid>.log`. Call once per process."""
  if verbose_flag:
    os.environ[VERBOSE_ENV] = "1"
  if not flags.FLAGS.is_parsed():  # A notebook, or a script without absl's app.run: set up as app.run does.
    flags.FLAGS.mark_as_parsed()
    absl_logging.use_absl_handler()  # In place of the stderr handler absl's first log line added (basicConfig).
    absl_logging.set_verbosity(absl_logging.INFO)
  handler = absl_logging.get_absl_handler()
  handler.addFilter(_one_line_storage_errors)
  if not verbose():
    handler.setFormatter(_FORMATTER)
    handler.addFilter(_left_in)
  if log_dir:
    if "://" in log_dir:
      raise ValueError(f"--log_dir={log_dir!r}: log files go to a local directory (a remote path is not supported).")
    os.makedirs(log_dir, exist_ok=True)
    file_handler = logging.FileHandler(os.path.join(log_dir, f"bert_jax.{socket.gethostname()}.{os.getpid()}.log"))
    file_handler.setFormatter(absl_logging.PythonFormatter())
    file_handler.addFilter(_one_line_storage_errors)
    logging.getLogger().addHandler(file_handler)


def only_this_thread() -> None:
  """From now on the console shows the calling thread's records only, and no thread's uncaught exception (the log
  file, with --log_dir, keeps every record). For a process about to leave with one line saying why (main.py): a
  storage library's background threads would otherwise still report the same failure after that line."""
  ident = threading.get_ident()
  absl_logging.get_absl_handler().addFilter(lambda record: record.thread == ident)
  threading.excepthook = lambda args: None


def name_process(index: int, count: int) -> None:
  """The console of a process other than 0 of several shows its warnings and errors only, each line starting with
  `[process i/n]` (its `--log_dir` file keeps every line)."""
  _FORMATTER.process = f"[process {index}/{count}] " if count > 1 and index else ""
  absl_logging.get_absl_handler().setLevel(logging.WARNING if index else logging.NOTSET)


def block(title: str, rows: list[tuple[str, str]]) -> str:
  """A titled block of `name  value` rows, for one log record (the run's header and summary)."""
  width = max(len(name) for name, _ in rows)
  return "\n".join([title, *(f"  {name:<{width}}  {value}" for name, value in rows)])
