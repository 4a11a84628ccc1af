"""BERT-Base and BERT-Large compiled for Cloud TPU slices on this machine (XLA's TPU compiler; no TPU): per-chip peak
HBM at the configs' batch, the largest per-chip batch per remat policy, compile times, and transformers'
`FlaxBertForPreTraining` compiled for the same slice and batch.

    pip install -e '.[test]'   # libtpu (bert_jax[tpu]) and transformers, the reference
    python -m bert_jax.benchmarks.tpu_compile --topologies=v4-8,v5e-8,v5p-8,v6e-8,v5p-128 --presets=base,large \\
        --seqs=128,512 --plan_topologies=v4-8,v5e-8,v5p-8,v6e-8

Every row is pretraining at global batch 256 (configs/base.py, large.py, large_phase2.py: 20 predictions per row at
128 tokens, 80 at 512), bfloat16 activations, data parallel over the slice (the configs' mesh), scanned layers. The
planner's rows search multiples of 8 per chip. Compiles only: no time per step comes from any of this (XLA's own
estimate is a placeholder), so there is no MFU here. Prints markdown rows as each finishes.
"""

import functools
import time

import jax
import jax.numpy as jnp
from absl import app, flags

from bert_jax import dry_run, planner, sharding
from bert_jax.benchmarks.reference import hf_pretraining_loss, hf_train_step
from bert_jax.convert_hf import hf_config_dict
from bert_jax.model_config import BertConfig, preset
from configs import default

_TOPOLOGIES = flags.DEFINE_list("topologies", ["v4-8", "v5e-8", "v5p-8", "v6e-8", "v5p-128"], "Accelerator types.")
_PLAN_TOPOLOGIES = flags.DEFINE_list("plan_topologies", ["v4-8", "v5e-8", "v5p-8", "v6e-8"], "Where to plan.")
_PRESETS = flags.DEFINE_list("presets", ["base", "large"], "Model size presets.")
_SEQS = flags.DEFINE_list("seqs", ["128", "512"], "Sequence lengths.")
_REMAT = flags.DEFINE_list("remat", ["none", "save_dots", "full"], "Remat policies for the planner.")
_REFERENCE = flags.DEFINE_bool("reference", True, "Also compile transformers' FlaxBertForPreTraining.")
_BATCH = 256


def _config(preset_name: str, seq: int, topology: str):
  config = default.get_config()
  config.model.update(preset(preset_name), dtype="bfloat16", scan_layers=True)
  config.batch_size = _BATCH
  config.data.update(max_seq_length=seq, max_predictions_per_seq=20 if seq == 128 else 80)
  config.dry_run.update(topology=topology, plan_batch_step=8, plan_max_batch=1024)
  return config


def _reference(config, devices) -> dict:
  """transformers' FlaxBertForPreTraining, same sizes, dtype, optimizer and batch, data parallel on `devices`."""
  from transformers import BertConfig as HFBertConfig
  from transformers import FlaxBertForPreTraining

  from bert_jax.optim import make_optimizer
  from bert_jax.pretraining_batch import pretraining_shapes

  model_cfg = BertConfig(**config.model.to_dict())
  module = FlaxBertForPreTraining(HFBertConfig(**hf_config_dict(model_cfg)), dtype=jnp.bfloat16, _do_init=False).module
  tx = make_optimizer(config)
  mesh = sharding.make_mesh(config.mesh.to_dict(), devices)
  replicated, batch_sharding = sharding.replicated(mesh), sharding.batch_sharding(mesh)
  ids = jnp.zeros((1, 1), jnp.int32)
  params = jax.eval_shape(lambda: module.init(jax.random.key(0), ids, ids, ids, ids, None)["params"])
  state = jax.eval_shape(lambda p: (p, tx.init(p), jnp.zeros((), jnp.int32)), params)
  state = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated), state)
  seq, preds = config.data.max_seq_length, config.data.max_predictions_per_seq
  batch = {
    name: jax.ShapeDtypeStruct(shape, dtype, sharding=batch_sharding)
    for name, (shape, dtype) in pretraining_shapes(config.batch_size, seq, preds).items()
  }
  key = jax.ShapeDtypeStruct((), jax.eval_shape(jax.random.key, 0).dtype, sharding=replicated)
  step = jax.jit(
    functools.partial(hf_train_step, module=module, loss=hf_pretraining_loss, tx=tx),
    in_shardings=(replicated, batch_sharding, replicated),
    out_shardings=(replicated, replicated),
    donate_argnums=0,
  )
  return dry_run.compile_step(step, (state, batch, key), dry_run.usable_hbm(devices))


def _gib(size) -> str:
  return "-" if size is None else f"{size / 2**30:.2f}"


def main(argv):
  del argv
  print(f"jax {jax.__version__}, libtpu compile-only devices; global batch {_BATCH}, bfloat16, scanned layers\n")
  print(
    "| model | seq | topology | usable HBM/chip (GiB) | peak HBM/chip (GiB) | fits | compile (s) "
    "| XLA TFLOP/step | transformers peak (GiB) | transformers XLA TFLOP/step |"
  )
  print("|---|---|---|---|---|---|---|---|---|---|")
  for preset_name in _PRESETS.value:
    for seq in map(int, _SEQS.value):
      for topology in _TOPOLOGIES.value:
        config = _config(preset_name, seq, topology)
        devices, _ = dry_run.target_devices(config)
        report = dry_run.compile_job(config, devices, eval_step=False)
        step = report["steps"]["train step"]
        chips = report["devices"]
        ours_flops = step.get("xla_flops_per_device", float("nan")) * chips / 1e12
        ref = _reference(config, devices) if _REFERENCE.value else None
        ref_peak = _gib(ref["peak_bytes"]) if ref else "-"
        ref_fits = "" if ref is None or ref["fits"] else " (does not fit)"
        ref_flops = f"{ref['xla_flops_per_device'] * chips / 1e12:.1f}" if ref and ref["fits"] else "-"
        print(
          f"| {preset_name} | {seq} | {topology} | {_gib(report['usable_bytes'])} | {_gib(step['peak_bytes'])} "
          f"| {'yes' if step['fits'] else 'no'} | {step['compile_seconds']:.0f} | "
          f"{ours_flops if step['fits'] else float('nan'):.1f} | {ref_peak}{ref_fits} | {ref_flops} |",
          flush=True,
        )
  print("\nLargest per-chip batch (multiple of 8) that fits, per remat policy:\n")
  print("| model | seq | topology | " + " | ".join(f"remat {r}" for r in _REMAT.value) + " | compiles (s) |")
  print("|---|---|---|" + "---|" * (len(_REMAT.value) + 1))
  for preset_name in _PRESETS.value:
    for seq in map(int, _SEQS.value):
      for topology in _PLAN_TOPOLOGIES.value:
        config = _config(preset_name, seq, topology)
        config.dry_run.plan_remat = tuple(_REMAT.value)
        start = time.perf_counter()
        rows = planner.plan(config)
        cells = " | ".join(
          f"{row['per_chip_batch']}{'+' if row['capped'] else ''} ({_gib(row['peak_bytes'])} GiB)" for row in rows
        )
        compiles = sum(row["compiles"] for row in rows)
        print(f"| {preset_name} | {seq} | {topology} | {cells} | {compiles} ({time.perf_counter() - start:.0f}) |")


if __name__ == "__main__":
  app.run(main)
