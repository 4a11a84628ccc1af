"""The launch/ scripts, run as a user runs them, with `gcloud` replaced by a stub on PATH that records every call and
plays a TPU VM's states: the commands they would issue for a small slice. (.ci/run also runs `bash -n` and
shellcheck on them.)"""

import os
import pathlib
import subprocess
import tarfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Records each call's arguments (separated by \x1f, the call ended by \x1e) and answers `describe` from state files
# that `create` and `delete` write, as Cloud TPU would.
STUB = r"""#!/usr/bin/env bash
printf '%s\x1f' "$@" >>"$STUB_DIR/calls"
printf '\x1e' >>"$STUB_DIR/calls"
case " $* " in
  *" tpu-vm describe "*) cat "$STUB_DIR/node_state" 2>/dev/null || exit 1 ;;
  *" queued-resources describe "*) cat "$STUB_DIR/queued_state" 2>/dev/null || exit 1 ;;
  *" tpu-vm create "*) echo READY >"$STUB_DIR/node_state" ;;
  *" queued-resources create "*) echo ACTIVE >"$STUB_DIR/queued_state" && echo READY >"$STUB_DIR/node_state" ;;
  *" delete "*) rm -f "$STUB_DIR/node_state" "$STUB_DIR/queued_state" ;;
  *" tpu-vm scp "*) cp "$5" "$STUB_DIR/copied.tar.gz" ;;
esac
"""
ZONE, PROJECT = "--zone=us-central2-b", "--project=my-project"


@pytest.fixture
def launch(tmp_path):
  """launch(script, *args, **env) -> (CompletedProcess, the gcloud calls it made, each a list of arguments)."""
  stub = tmp_path / "stub"
  stub.mkdir()
  (stub / "gcloud").write_text(STUB)
  (stub / "gcloud").chmod(0o755)
  settings = ("TPU_NAME", "ZONE", "PROJECT", "ACCELERATOR_TYPE", "SPOT", "QUEUED", "WORKDIR", "WORKERS", "REPO_URL")
  base = {k: v for k, v in os.environ.items() if k not in settings and k not in ("EXTRA_FLAGS", "JOB_ENV")}
  base.update(PATH=f"{stub}:{os.environ['PATH']}", STUB_DIR=str(stub), TPU_NAME="test-slice")
  base.update(ZONE="us-central2-b", PROJECT="my-project", ACCELERATOR_TYPE="v4-8", POLL_SECONDS="0")

  def run(script: str, *args: str, **env: str):
    (stub / "calls").unlink(missing_ok=True)
    result = subprocess.run(
      ["bash", str(ROOT / "launch" / script), *args], env=dict(base, **env), capture_output=True, text=True
    )
    recorded = (stub / "calls").read_text() if (stub / "calls").exists() else ""
    calls = [call.split("\x1f")[:-1] for call in recorded.split("\x1e")[:-1]]
    return result, calls

  return run


def _issued(calls: list[list[str]], verb: str) -> list[list[str]]:
  """The calls that `verb` ("tpu-vm create", ...) names, describes (reads) left out."""
  return [call for call in calls if " ".join(call[2:4]) == verb]


def test_create_and_delete_issue_the_slice_commands_once(launch):
  result, calls = launch("create.sh")
  assert result.returncode == 0, result.stderr
  assert _issued(calls, "tpu-vm create") == [
    ["compute", "tpus", "tpu-vm", "create", "test-slice", ZONE, PROJECT, "--version=tpu-ubuntu2204-base"]
    + ["--accelerator-type=v4-8"]
  ]
  assert "test-slice is READY. Next: launch/setup.sh" in result.stderr
  result, calls = launch("create.sh")  # Again: the slice exists, nothing is created.
  assert result.returncode == 0 and not _issued(calls, "tpu-vm create")
  result, calls = launch("delete.sh")
  assert _issued(calls, "tpu-vm delete") == [
    ["compute", "tpus", "tpu-vm", "delete", "test-slice", ZONE, PROJECT, "--quiet"]
  ]

  result, calls = launch("create.sh", QUEUED="1", SPOT="1", ACCELERATOR_TYPE="v5litepod-8")
  assert result.returncode == 0, result.stderr
  assert _issued(calls, "queued-resources create") == [
    ["compute", "tpus", "queued-resources", "create", "test-slice", "--node-id=test-slice", ZONE, PROJECT]
    + ["--runtime-version=v2-alpha-tpuv5-lite", "--accelerator-type=v5litepod-8", "--spot"]
  ]
  result, calls = launch("delete.sh")
  assert _issued(calls, "queued-resources delete") == [
    ["compute", "tpus", "queued-resources", "delete", "test-slice", ZONE, PROJECT, "--force", "--quiet"]
  ]


def test_setup_copies_this_checkout_and_run_stop_status_logs_ssh_address_the_workers(launch, tmp_path):
  launch("create.sh")
  result, calls = launch("setup.sh")
  assert result.returncode == 0, result.stderr
  (copy,) = _issued(calls, "tpu-vm scp")
  assert copy[5:] == ["test-slice:bert_jax_src.tar.gz", ZONE, PROJECT, "--worker=all"]
  with tarfile.open(tmp_path / "stub" / "copied.tar.gz") as archive:
    names = set(archive.getnames())
  assert {"pyproject.toml", "bert_jax/main.py", "launch/worker.sh", "configs/large.py"} <= names
  assert not any(name.startswith(".git/") for name in names)
  (ssh,) = _issued(calls, "tpu-vm ssh")
  assert ssh[4:8] == ["test-slice", ZONE, PROJECT, "--worker=all"]
  assert "tar -xzf bert_jax_src.tar.gz" in ssh[8] and "bash bert_jax/launch/worker.sh setup" in ssh[8]

  result, calls = launch(
    "run.sh", "--config.seed=3", WORKDIR="gs://bucket/run", EXTRA_FLAGS="--config.num_train_steps=10"
  )
  assert result.returncode == 0, result.stderr
  (ssh,) = _issued(calls, "tpu-vm ssh")
  assert ssh[4:8] == ["test-slice", ZONE, PROJECT, "--worker=all"]
  command = ssh[8].removeprefix("--command=")
  assert "bash bert_jax/launch/worker.sh start run-" in command
  assert command.endswith(
    " env python -m bert_jax.main --config=configs/large.py --workdir=gs://bucket/run "
    "--config.num_train_steps=10 --config.seed=3"
  ), command
  result, calls = launch("run.sh", WORKDIR="/tmp/local")
  assert result.returncode == 1 and "WORKDIR must be a gs:// path" in result.stderr and not calls

  for script, args, env, worker, action in [
    ("stop.sh", (), {}, "all", "worker.sh stop"),
    ("status.sh", (), {"WORKERS": "0,2"}, "0,2", "worker.sh status"),
    ("logs.sh", ("3",), {}, "3", "worker.sh logs"),
    ("ssh.sh", ("df -h ~",), {"WORKERS": "1"}, "1", "df -h ~"),
  ]:
    result, calls = launch(script, *args, **env)
    assert result.returncode == 0, (script, result.stderr)
    (ssh,) = _issued(calls, "tpu-vm ssh")
    assert ssh[4:8] == ["test-slice", ZONE, PROJECT, f"--worker={worker}"], script
    assert ssh[8].startswith("--command=") and ssh[8].endswith(action), (script, ssh)
