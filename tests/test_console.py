"""The console: native libraries' known start-up lines left out (everything else kept), the line format."""

import logging
import os
import subprocess
import sys

from bert_jax import console

NATIVE = """\
WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
I0000 00:00:1795526440.757038    2432 port.cc:153] oneDNN custom operations are on. You may see slightly different numerical results due to floating-point round-off errors from different computation orders. To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.
I0000 00:00:1795526440.758121    2432 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.
E0000 00:00:1795526442.868292    2432 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)
E0000 00:00:1795526442.868292    2432 some_kernel.cc:52] A real error from a native library.
"""  # noqa: E501 - as TensorFlow 2.21 prints them on a machine without a GPU, plus one line that is not noise.


def _run(code: str, returncode: int = 0, **env) -> str:
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
  assert result.returncode == returncode, result.stderr
  return result.stderr


def test_known_native_start_up_lines_are_left_out_and_the_rest_is_kept():
  # Written to file descriptor 2 directly, as C++ logging does, inside and outside the window.
  code = (
    "import os, sys; from bert_jax import console\n"
    "with console.native_noise_left_out():\n"
    f"  os.write(2, {NATIVE.encode()!r}); print('python line', file=sys.stderr)\n"
    "os.write(2, b'after the window\\n')\n"
  )
  quiet = _run(code, **os.environ)
  assert (
    quiet == "E0000 00:00:1795526442.868292    2432 some_kernel.cc:52] A real error from a native library.\n"
    "python line\nafter the window\n"
  ), quiet
  verbose = _run(code, **dict(os.environ, BERT_JAX_VERBOSE="1"))
  assert verbose == NATIVE + "python line\nafter the window\n"
  assert sum(map(console.native_noise, NATIVE.splitlines())) == 4
  # A fatal line from a place whose INFO line is noise is kept.
  assert not console.native_noise("F0000 00:00:1.0    2432 cpu_feature_guard.cc:193] compiled to use AVX instructions")


def test_what_a_crashing_import_prints_still_reaches_the_console():
  # The process dies inside the window (as an import that aborts): the filter, a process of its own, still writes
  # the lines that are not noise.
  code = (
    "import os; from bert_jax import console\n"
    "with console.native_noise_left_out():\n"
    f"  os.write(2, {NATIVE.encode()!r}); os.write(2, b'F0000 fatal: the reason\\n'); os.abort()\n"
  )
  died = _run(code, returncode=-6, **os.environ)
  assert died.endswith("A real error from a native library.\nF0000 fatal: the reason\n"), died
  assert not any(map(console.native_noise, died.splitlines())), died
  # Without a descriptor 2 (closed by the caller), the window runs the block as it is.
  code = "from bert_jax import console\nwith console.native_noise_left_out():\n  print('ran')"
  closed = subprocess.run(["sh", "-c", 'exec "$0" -c "$1" 2>&-', sys.executable, code], stdout=subprocess.PIPE)
  assert closed.returncode == 0 and closed.stdout == b"ran\n"


def test_the_console_format_names_warnings_and_indents_a_block():
  formatter = console.ConsoleFormatter()
  record = logging.LogRecord(
    "absl", logging.INFO, "x.py", 1, "%s", (console.block("Title", [("a", "1"), ("bb", "2")]),), None
  )
  record.created = 0.0
  lines = formatter.format(record).splitlines()
  assert lines[0].endswith(" Title") and lines[1:] == [" " * 9 + "  a   1", " " * 9 + "  bb  2"], lines
  warning = logging.LogRecord("absl", logging.WARNING, "x.py", 1, "disk %s", ("full",), None)
  assert formatter.format(warning)[8:] == " WARNING disk full"
  console.name_process(3, 4)  # Names the process in the console's formatter.
  try:
    assert console._FORMATTER.format(warning)[8:] == " [process 3/4] WARNING disk full"
  finally:
    console.name_process(0, 1)
  probe = "Unable to initialize backend '%s': %s"
  no_libtpu = "INTERNAL: Failed to open libtpu.so: libtpu.so: cannot open shared object file: No such file or directory"
  jax_probe = logging.LogRecord("jax", logging.INFO, "/x/jax/_src/xla_bridge.py", 1, probe, ("tpu", no_libtpu), None)
  assert console.is_library_noise(jax_probe)
  no_chip = "NOT_FOUND: TPU initialization failed: No jellyfish device found."  # libtpu installed, no TPU.
  assert console.is_library_noise(
    logging.LogRecord("jax", 20, "/x/jax/_src/xla_bridge.py", 1, probe, ("tpu", no_chip), None)
  )
  busy = logging.LogRecord("jax", logging.INFO, "/x/jax/_src/xla_bridge.py", 1, probe, ("tpu", "TPU in use"), None)
  assert not console.is_library_noise(busy)  # A TPU that is there but fails: the only line that says why.
  jax_probe.levelno = logging.WARNING
  assert not console.is_library_noise(jax_probe)  # Warnings are never noise.


def test_a_process_leaving_with_one_line_shows_no_other_thread_after_it(tmp_path):
  # A storage library's thread still failing after the line: its record and its uncaught exception stay out of the
  # console; the log file keeps the record.
  code = (
    "import os, sys, threading\n"
    "from absl import logging\n"
    "from bert_jax import console\n"
    f"console.configure(log_dir={str(tmp_path)!r})\n"
    "logging.info('before')\n"
    "console.only_this_thread()\n"
    "logging.error('The run stops.')\n"
    "def background():\n"
    "  logging.error('a background save failed')\n"
    "  raise FileNotFoundError('commit_success.txt')\n"
    "thread = threading.Thread(target=background); thread.start(); thread.join()\n"
    "logging.flush(); sys.stderr.flush(); os._exit(1)\n"
  )
  printed = _run(code, returncode=1, **os.environ)
  assert [line[9:] for line in printed.splitlines()] == ["before", "ERROR The run stops."], printed
  (log,) = tmp_path.iterdir()
  assert "a background save failed" in log.read_text()
