"""End to end: `python -m bert_jax.main` as a user runs it, stopped by SIGTERM and resumed by the same command."""

import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHRINK = [
  "--config.num_train_steps=40",
  "--config.log_every_steps=5",
  "--config.checkpoint_every_steps=1000",
  "--config.eval_every_steps=1000",
  "--config.eval_steps=1",
]


def _command(workdir) -> list[str]:
  return [sys.executable, "-m", "bert_jax.main", "--config=configs/tiny.py", f"--workdir={workdir}", *SHRINK]


def _env() -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
  env.pop("XLA_FLAGS", None)  # One device, as on a laptop.
  return env


def _final_params(workdir, step: int) -> dict:
  restored = ocp.StandardCheckpointer().restore(pathlib.Path(workdir) / "checkpoints" / str(step) / "state")
  return jax.tree.map(np.asarray, restored["params"])


def test_sigterm_checkpoints_and_the_same_command_resumes_exactly(tmp_path):
  # The uninterrupted run and the one to interrupt run side by side.
  whole_process = subprocess.Popen(
    _command(tmp_path / "whole"), cwd=ROOT, env=_env(), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
  )
  interrupted = tmp_path / "interrupted"
  with subprocess.Popen(
    _command(interrupted), cwd=ROOT, env=_env(), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
  ) as process:
    lines = []
    for line in process.stderr:
      lines.append(line)
      if "step 10/40" in line:
        process.send_signal(signal.SIGTERM)
        break
    lines += process.stderr.readlines()
    assert process.wait(timeout=120) == 0, "".join(lines)[-3000:]
  _, log = whole_process.communicate(timeout=300)
  assert whole_process.returncode == 0, log[-3000:]
  assert "step 40/40 | loss" in log and "tok/s" in log and "ETA" in log
  assert "eval at step 40" in log
  # Real text through the real pipeline: the model learns.
  steps = [line.split("| ") for line in log.splitlines() if "| mlm_loss" in line]
  mlm_loss = [float(fields[2].split()[1]) for fields in steps]
  mlm_accuracy = [float(fields[3].split()[1]) for fields in steps]
  assert mlm_loss[-1] < mlm_loss[0] - 0.5 and mlm_accuracy[-1] > mlm_accuracy[0], (mlm_loss, mlm_accuracy)
  assert os.listdir(tmp_path / "whole" / "tensorboard" / "train")

  stopped = [line for line in lines if "Stopped at step" in line]
  assert stopped, "".join(lines)[-3000:]
  stopped_step = int(stopped[0].split("Stopped at step ")[1].split()[0])
  assert 10 <= stopped_step < 40
  assert os.listdir(interrupted / "checkpoints") == [str(stopped_step)]

  resumed = subprocess.run(_command(interrupted), cwd=ROOT, env=_env(), capture_output=True, text=True)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f"Resumed from step {stopped_step}" in resumed.stderr
  assert "Restored the input pipeline's state" in resumed.stderr  # Not a replay.
  jax.tree.map(np.testing.assert_array_equal, _final_params(interrupted, 40), _final_params(tmp_path / "whole", 40))


def test_an_unknown_config_key_is_named_before_anything_runs(tmp_path):
  start = time.perf_counter()
  result = subprocess.run(
    [*_command(tmp_path), "--config.model.hiden_size=64"], cwd=ROOT, env=_env(), capture_output=True, text=True
  )
  assert result.returncode != 0
  assert "Unknown config key" in result.stderr and "--config.model.hiden_size" in result.stderr
  assert not (tmp_path / "checkpoints").exists()
  assert time.perf_counter() - start < 60


def test_importing_bert_jax_touches_no_device():
  code = (
    "import bert_jax, bert_jax.main, bert_jax.train, bert_jax.convert_hf; "
    "from jax._src import xla_bridge; assert not xla_bridge.backends_are_initialized(), 'a backend started'"
  )
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(), capture_output=True, text=True)
  assert result.returncode == 0, result.stderr[-2000:]
