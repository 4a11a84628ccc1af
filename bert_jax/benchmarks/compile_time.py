"""Compile time and per-device memory of a train step, from dry runs (nothing is allocated).

    XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \
        python -m bert_jax.benchmarks.compile_time --preset=large --batch_size=256 --seq=128

Compiles BERT-Large's train step (i) on an 8-device FSDP mesh with unrolled layers and with scanned layers,
reporting the compile time of each, and (ii) on 8-device DP and FSDP meshes, reporting XLA's per-device memory
analysis of each. Memory figures are the compiling backend's (CPU here): the train state's shards are exact,
temporaries depend on the backend's fusion and buffer assignment.
"""

import jax
from absl import app, flags

from bert_jax.dry_run import ahead_of_time
from bert_jax.model.bert_config import preset
from configs import default

_PRESET = flags.DEFINE_string("preset", "large", "Model size preset (bert_jax.model.bert_config.PRESETS).")
_BATCH = flags.DEFINE_integer("batch_size", 256, "Global batch size.")
_SEQ = flags.DEFINE_integer("seq", 128, "Sequence length.")
_PREDICTIONS = flags.DEFINE_integer("max_predictions", 20, "Masked positions per sequence.")
_REMAT = flags.DEFINE_string("remat", "none", "Remat policy for the memory comparison.")

_GIB = 1 << 30


def _config(mesh: dict, scan_layers: bool, remat: str):
  config = default.get_config()
  config.model.update(preset(_PRESET.value), scan_layers=scan_layers, remat=remat)
  config.update(batch_size=_BATCH.value)
  config.data.update(max_seq_length=_SEQ.value, max_predictions_per_seq=_PREDICTIONS.value)
  config.mesh.update(mesh)
  return config


def main(argv):
  del argv
  devices = jax.device_count()
  fsdp, dp = dict(data=1, fsdp=devices, tensor=1), dict(data=devices, fsdp=1, tensor=1)
  compile_s = {}
  for scan_layers in (False, True):
    report = ahead_of_time.compile_job(_config(fsdp, scan_layers, "none"), eval_step=False)
    compile_s[scan_layers] = report["steps"]["train step"]["compile_seconds"]
  memory = {
    name: ahead_of_time.compile_job(_config(mesh, True, _REMAT.value), eval_step=False)
    for name, mesh in (("dp", dp), ("fsdp", fsdp))
  }

  print(
    f"\n{jax.devices()[0].device_kind} x{devices}, {jax.__version__=}; {_PRESET.value}, "
    f"global batch {_BATCH.value}, seq {_SEQ.value}"
  )
  print(f"compile (lower + compile) of the train step, FSDP {devices}:")
  print(f"  unrolled layers {compile_s[False]:7.1f} s")
  print(
    f"  scanned layers  {compile_s[True]:7.1f} s   ratio scanned / unrolled {compile_s[True] / compile_s[False]:.2f}"
  )
  print(f"per-device memory (scanned layers, remat={_REMAT.value}), from the compiled memory analysis:")
  for name, report in memory.items():
    step = report["steps"]["train step"]
    print(
      f"  {name.upper():4s} x{devices}: train state {report['state_bytes_per_device'] / _GIB:6.2f} GiB  "
      f"arguments {step['argument_bytes'] / _GIB:6.2f} GiB  temporaries {step['temp_bytes'] / _GIB:6.2f} GiB  "
      f"peak about {step['peak_bytes'] / _GIB:6.2f} GiB"
    )


if __name__ == "__main__":
  app.run(main)
