"""The dry run compiles the configured step on abstract inputs and reports memory, FLOPs and shardings."""

import subprocess
import sys

import jax
import pytest

from bert_jax import distributed, flops
from bert_jax.dry_run import ahead_of_time
from bert_jax.model.bert_config import model_config
from tests.helpers import FAST_COMPILES, ROOT, main_env


def _live_bytes() -> int:
  return sum(array.nbytes for array in jax.live_arrays())


@pytest.mark.slow
def test_fsdp_needs_an_eighth_of_the_state_memory_of_data_parallel(small_config):
  small_config.model.update(vocab_size=1024, hidden_size=128, num_heads=2, intermediate_size=512)
  reports = {}
  for name, mesh in (("dp", dict(data=8, fsdp=1)), ("fsdp", dict(data=1, fsdp=8))):
    small_config.mesh.update(mesh)
    before = _live_bytes()
    reports[name] = ahead_of_time.compile_job(small_config, eval_step=False)
    assert _live_bytes() - before < 1 << 20  # Nothing the size of the model was allocated.
  dp, fsdp = reports["dp"], reports["fsdp"]
  assert dp["devices"] == fsdp["devices"] == 8
  assert dp["parameters"] == fsdp["parameters"] > 5e5
  # Parameters plus Adam's two moments, float32: all of it on every device under DP, an eighth under FSDP.
  assert dp["state_bytes_per_device"] == pytest.approx(3 * 4 * dp["parameters"], rel=0.01)
  assert fsdp["state_bytes_per_device"] < dp["state_bytes_per_device"] / 7
  dp_step, fsdp_step = dp["steps"]["train step"], fsdp["steps"]["train step"]
  assert fsdp_step["argument_bytes"] < dp_step["argument_bytes"] / 4
  assert 0 < fsdp_step["peak_bytes"] < dp_step["peak_bytes"]
  for step in (dp_step, fsdp_step):  # The figures agree: XLA:CPU's own peak left its temporaries out.
    assert step["peak_bytes"] >= step["temp_bytes"] > 0
    live = step["argument_bytes"] + step["output_bytes"] - step["alias_bytes"] + step["temp_bytes"]
    assert step["peak_bytes"] == live
  expected_flops = flops.train_flops_per_step(model_config(small_config), small_config.batch_size, 32, 5)
  assert dp["model_flops_per_step"] == expected_flops and dp["tokens_per_step"] == small_config.batch_size * 32
  assert dp_step["xla_flops_per_device"] > 0
  specs = {name: spec for name, _, spec, _ in fsdp["parameter_table"]}
  assert specs["bert/layer_0/intermediate/kernel"] == "P('fsdp', 'tensor')"


@pytest.mark.slow
def test_main_dry_run_makes_as_many_cpu_devices_as_the_mesh_names(tmp_path):
  command = [
    sys.executable,
    "-m",
    "bert_jax.main",
    "--config=configs/tiny.py",
    f"--workdir={tmp_path / 'dry'}",
    "--mode=dry_run",
    "--config.mesh.data=2",
    "--config.mesh.fsdp=4",
    "--config.model.scan_layers=True",
    "--config.num_microbatches=2",
  ]
  env = dict(main_env(), XLA_FLAGS=FAST_COMPILES)  # 12 CPU-seconds instead of 28; no device count: main makes them.
  result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "target       8 x cpu (this machine): an estimate" in result.stderr
  assert "mesh         data 2 x fsdp 4 x tensor 1" in result.stderr
  assert "bert/layers/intermediate/kernel" in result.stderr and "train state" in result.stderr
  assert "eval step    compiled: peak" in result.stderr
  assert not (tmp_path / "dry").exists()  # A dry run writes nothing.


@pytest.mark.parametrize(
  "settings, message",
  [
    (dict(num_processes=2, process_id=2), r"process_id=2 must be in \[0, num_processes=2\)"),
    (dict(num_processes=2, process_id=0), r"no coordinator address"),
    (dict(num_processes=-1), r"num_processes=-1 must be positive"),
  ],
)
def test_distributed_settings_are_checked(small_config, settings, message):
  small_config.distributed.update(settings)
  with pytest.raises(ValueError, match=message):
    distributed.settings(small_config.distributed)


def test_distributed_settings_come_from_config_then_environment(small_config, monkeypatch):
  monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.2:1234")
  monkeypatch.setenv("JAX_NUM_PROCESSES", "4")
  monkeypatch.setenv("JAX_PROCESS_ID", "3")
  assert distributed.settings(small_config.distributed) == ("10.0.0.2:1234", 4, 3)
  small_config.distributed.update(coordinator_address="host0:8476", process_id=1)
  assert distributed.settings(small_config.distributed) == ("host0:8476", 4, 1)
  for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
    monkeypatch.delenv(name)
  small_config.distributed.update(coordinator_address="", process_id=-1)
  assert distributed.settings(small_config.distributed) == ("", None, None)  # One process.
