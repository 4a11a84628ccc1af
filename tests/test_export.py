"""What `--mode=export` writes (handoff/export.py): an overwrite replaces only what an export wrote and follows
symlinks; a full disk, a SIGKILL, a SIGTERM or a refused write leaves one line and no partial files, locally and on
gs://."""

import errno
import json
import logging
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
from etils import epath

from bert_jax.handoff import export, export_errors, pretrained
from tests.helpers import hf_bert_directory


def test_an_overwrite_replaces_only_what_an_export_wrote_and_follows_symlinks(exports, tmp_path):
  for fmt in export.FORMATS:  # Each format's own files are replaced; a file of the user's is refused, and kept.
    target = tmp_path / fmt
    shutil.copytree(exports[fmt], target)
    (target / "README.md").write_text("mine")
    with pytest.raises(ValueError, match=rf"{target} holds \['README.md'\], which no {fmt} export writes"):
      export.export(exports["bundle"], str(target), fmt, overwrite=True)
    assert (target / "README.md").read_text() == "mine"
    (target / "README.md").unlink()
    export.export(exports["bundle"], str(target), fmt, overwrite=True)
  real = tmp_path / "huggingface"
  (tmp_path / "link").symlink_to(real)
  export.export(exports["bundle"], str(tmp_path / "link"), "huggingface", overwrite=True)
  assert (tmp_path / "link").is_symlink() and sorted(os.listdir(tmp_path)) == [
    "bundle",
    "google",
    "huggingface",
    "link",
    "sentence-transformers",
  ]
  assert pretrained.load(str(tmp_path / "link")).source.format == "huggingface"
  source = tmp_path / "bundle"
  (tmp_path / "inside").symlink_to(source / "export")  # A target that lands inside the source through a symlink.
  with pytest.raises(ValueError, match=rf"export.dir={source / 'export'} overlaps the source {source}"):
    export.export(str(source), str(tmp_path / "inside"), "huggingface")
  assert not (source / "export").exists()


def _partials(target: pathlib.Path) -> list[pathlib.Path]:
  return sorted(target.parent.glob(f".{target.name}.partial-*"))


def _fill_the_disk_at(monkeypatch, name: str) -> None:
  """Writing a file `name` (local or gs://) writes half of it, then fails as a full disk fails a write to an open
  file: ENOSPC, no file named."""
  real_write = epath.Path.write_bytes

  def full_disk(path, data):
    if path.name != name:
      return real_write(path, data)
    with path.open("wb") as f:
      f.write(data[: len(data) // 2])
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  monkeypatch.setattr(epath.Path, "write_bytes", full_disk)


def test_a_full_disk_during_a_hugging_face_export_is_one_line_naming_the_file_and_leaves_nothing(
  exports, tmp_path, monkeypatch
):
  _fill_the_disk_at(monkeypatch, "model.safetensors")
  partial = rf"{tmp_path}/\.hf\.partial-[0-9a-f]{{8}}"
  target = tmp_path / "hf"
  with pytest.raises(export_errors.ExportError) as raised:
    export.export(exports["bundle"], str(target), "huggingface")
  assert re.fullmatch(
    rf"Export to {target} failed writing {partial}/export/model\.safetensors: No space left on device \(ENOSPC\); "
    rf"nothing was written there; the partial files in {partial} are removed\.",
    str(raised.value),
  ), str(raised.value)
  assert raised.value.exit_code == 1 and os.listdir(tmp_path) == []
  # Replacing an export: the one in place stays whole.
  shutil.copytree(exports["huggingface"], target)
  before = {name: (target / name).read_bytes() for name in os.listdir(target)}
  with pytest.raises(
    export_errors.ExportError, match=r"No space left on device \(ENOSPC\); it still holds the export it held"
  ):
    export.export(exports["bundle"], str(target), "huggingface", overwrite=True)
  assert {name: (target / name).read_bytes() for name in os.listdir(target)} == before
  assert os.listdir(tmp_path) == ["hf"]


def test_a_full_disk_during_a_bundle_export_is_one_line_naming_the_params_and_leaves_nothing(tmp_path, caplog):
  """Orbax writes a bundle's parameters through tensorstore, whose error on a full disk is a ValueError of several
  lines ending in the system's code ("... File too large [os_error_code='27']"), and each of the save's threads logs
  it: the export says it once, as the other formats do (before: the raw tensorstore error and Orbax's lines). The disk
  refuses files over 20 kB here (EFBIG, as a full disk refuses with ENOSPC; this process ignores SIGXFSZ)."""
  import resource

  source = hf_bert_directory(tmp_path / "source", ["a", "b"], hidden_size=64, intermediate_size=256)
  target, partial = tmp_path / "bundle", rf"{tmp_path}/\.bundle\.partial-[0-9a-f]{{8}}"
  soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
  resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, hard))
  try:
    with caplog.at_level(logging.DEBUG), pytest.raises(export_errors.ExportError) as raised:
      export.export(source, str(target), "bundle")
  finally:
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
  assert re.fullmatch(
    rf"Export to {target} failed writing {partial}/export/params: File too large \(EFBIG\); nothing was written "
    rf"there; the partial files in {partial} are removed\.",
    str(raised.value),
  ), str(raised.value)
  assert sorted(os.listdir(tmp_path)) == ["source"]
  assert not [record.getMessage()[:200] for record in caplog.records if record.levelno >= logging.WARNING]
  with pytest.raises(OSError) as full:  # A full disk's code, as tensorstore ends its message.
    with export_errors.storage_errors_as_os_errors(target / "params"):
      raise ValueError("Error writing ...\nFailed to write 359866 bytes: No space left on device [os_error_code='28']")
  assert (full.value.errno, full.value.filename) == (errno.ENOSPC, str(target / "params"))


_PAUSED_EXPORT = """
import os, pathlib, sys, time
from absl import app
from bert_jax import main
from bert_jax.handoff import hf_format

def paused(tensors, path):  # Half the file written, then a pause for the test to signal this process.
  pathlib.Path(path).write_bytes(b"half")
  pathlib.Path(os.environ["READY"]).touch()
  time.sleep(300)

hf_format.save_safetensors = paused
sys.argv = ["bert_jax.main", *sys.argv[1:]]
app.run(main.main)
"""


@pytest.mark.slow
def test_an_export_killed_stopped_or_refused_a_write_says_so_in_one_line_and_leaves_no_partial_files(
  exports, tmp_path, gcs_bucket, monkeypatch
):
  """SIGKILL leaves a partial directory, which the next export to the target removes (its process is gone); SIGTERM
  and a refused write end `--mode=export` with one line (exit 143, 1) and remove their own. An old partial directory
  nobody has touched for an hour goes; a live export's (its lease's heartbeat is fresh) stays. On gs://, written in
  place, a failed write removes what it wrote."""
  target = tmp_path / "hf"
  flags = ["--config=configs/tiny.py", f"--workdir={tmp_path / 'unused'}", "--mode=export"]
  flags += [f"--config.export.source={exports['bundle']}", f"--config.export.dir={target}"]
  flags += ["--config.export.format=huggingface"]
  environment = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
  environment.pop("XLA_FLAGS", None)
  root = pathlib.Path(__file__).resolve().parents[1]

  def paused(ready: pathlib.Path) -> subprocess.Popen:
    process = subprocess.Popen(
      [sys.executable, "-c", _PAUSED_EXPORT, *flags],
      cwd=root,
      env=dict(environment, READY=str(ready)),
      stderr=subprocess.PIPE,
      stdout=subprocess.DEVNULL,
      text=True,
    )
    deadline = time.monotonic() + 120
    while not ready.exists():
      assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()[-3000:]
      time.sleep(0.2)
    return process

  killed = paused(tmp_path / "ready_killed")
  killed.kill()
  killed.communicate(timeout=60)
  (dead,) = _partials(target)
  assert (dead / "export" / "model.safetensors").read_bytes() == b"half" and (dead / "LEASE").exists()
  # A live export's, on another machine sharing the storage; and one from before partial directories had a LEASE.
  live, old = tmp_path / ".hf.partial-0000aaaa", tmp_path / ".hf.partial-0000bbbb"
  live.mkdir()
  now = time.time()
  holder = dict(host="another-host", pid=1, run_id="x", start_time=now, heartbeat_time=now, process="b/n/1/7")
  (live / "LEASE").write_text(json.dumps(holder))
  (old / "export").mkdir(parents=True)
  for path in (old / "export", old):
    os.utime(path, (now - 3600, now - 3600))

  stopped = paused(tmp_path / "ready_stopped")
  stopped.send_signal(signal.SIGTERM)
  log = stopped.communicate(timeout=60)[1]
  assert stopped.returncode == 143, log[-3000:]
  assert re.fullmatch(
    rf"Export to {target} stopped by SIGTERM; nothing was written there; the partial files in "
    rf"{tmp_path}/\.hf\.partial-[0-9a-f]{{8}} are removed\.",
    log.strip().splitlines()[-1],
  ), log[-3000:]
  assert "Traceback" not in log and f"Removed {dead}" in log and f"Removed {old}" in log, log[-3000:]
  assert _partials(target) == [live] and not target.exists()

  # The weights' file is 90 kB; the disk refuses files over 40 kB (EFBIG, as a full disk refuses with ENOSPC).
  small_files = "import os, resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (40_000, 40_000)); "
  small_files += "os.execv(sys.executable, [sys.executable, '-m', 'bert_jax.main', *sys.argv[1:]])"
  command = [sys.executable, "-c", small_files, *flags]
  refused = subprocess.run(command, cwd=root, env=environment, capture_output=True, text=True)
  assert refused.returncode == 1, refused.stderr[-3000:]
  assert re.fullmatch(
    rf"Export to {target} failed writing {tmp_path}/\.hf\.partial-[0-9a-f]{{8}}/export/model\.safetensors: File too "
    rf"large \(EFBIG\); nothing was written there; the partial files in {tmp_path}/\.hf\.partial-[0-9a-f]{{8}} are "
    r"removed\.",
    refused.stderr.strip().splitlines()[-1],
  ), refused.stderr[-3000:]
  assert "Traceback" not in refused.stderr and _partials(target) == [live] and not target.exists()

  export.export(exports["bundle"], str(target), "huggingface")
  assert _partials(target) == [live] and pretrained.load(str(target)).source.format == "huggingface"

  on_gcs = f"{gcs_bucket}/hf"
  _fill_the_disk_at(monkeypatch, "model.safetensors")
  with pytest.raises(export_errors.ExportError) as raised:
    export.export(exports["bundle"], on_gcs, "huggingface")
  assert str(raised.value) == (
    f"Export to {on_gcs} failed writing {on_gcs}/model.safetensors: No space left on device (ENOSPC); it holds no "
    f"export (the partial files in {on_gcs} are removed)."
  )
  assert not epath.Path(on_gcs).exists()
