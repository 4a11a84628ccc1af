"""Before booking a pod: compile the train step for the configured mesh on abstract inputs and report what it
would need, without allocating the model or reading data.

    XLA_FLAGS=--xla_force_host_platform_device_count=32 JAX_PLATFORMS=cpu python -m bert_jax.main \
        --config=configs/large.py --workdir=/tmp/dry --mode=dry_run --config.mesh.data=1 --config.mesh.fsdp=32

On CPU with fake devices the mesh can be shaped like the target slice. Memory figures come from XLA's memory
analysis of the compiled step on the backend that compiled it: the CPU backend's buffer assignment and fusion
differ from a TPU's, so treat CPU figures as an estimate of the per-device footprint (the parameter and
optimizer-state shards are exact).
"""

import time

import jax
import numpy as np
from absl import logging

from bert_jax import flops, pretraining, sharding
from bert_jax.pretraining_batch import max_instances, pretraining_shapes

_GIB = 1 << 30


def parameter_table(abstract_params, param_shardings) -> list[tuple[str, tuple, str, int]]:
  """(path, shape, partition spec, bytes per device) of every parameter."""
  rows = []
  for (path, leaf), leaf_sharding in zip(
    jax.tree_util.tree_leaves_with_path(abstract_params), jax.tree.leaves(param_shardings), strict=True
  ):
    per_device = int(np.prod(leaf_sharding.shard_shape(leaf.shape))) * leaf.dtype.itemsize
    name = "/".join(str(getattr(key, "key", key)) for key in path)
    rows.append((name, tuple(leaf.shape), str(leaf_sharding.spec), per_device))
  return rows


def compile_train_step(config, devices=None) -> dict:
  """Compiles the configured train step on abstract inputs; returns the report's figures (and logs them)."""
  model_cfg = pretraining.check_config(config)
  run = pretraining.make_run(config, devices)
  mesh, abstract, shardings = run.mesh, run.abstract, run.shardings
  seq, preds = config.data.max_seq_length, config.data.max_predictions_per_seq
  batch = {
    name: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding.batch_sharding(mesh))
    for name, (shape, dtype) in pretraining_shapes(config.batch_size, seq, preds, max_instances(config.data)).items()
  }
  key = jax.ShapeDtypeStruct((), jax.eval_shape(jax.random.key, 0).dtype, sharding=sharding.replicated(mesh))
  start = time.perf_counter()
  lowered = run.train_step.lower(sharding.with_shardings(abstract, shardings), batch, key)
  compiled = lowered.compile()
  compile_seconds = time.perf_counter() - start

  memory = compiled.memory_analysis()
  cost = compiled.cost_analysis() or {}
  table = parameter_table(abstract.params, shardings.params)
  state_bytes = sum(
    int(np.prod(s.shard_shape(a.shape))) * a.dtype.itemsize
    for a, s in zip(jax.tree.leaves(abstract), jax.tree.leaves(shardings), strict=True)
  )
  report = dict(
    devices=mesh.size,
    device_kind=mesh.devices.flat[0].device_kind,
    mesh=dict(mesh.shape),
    parameters=sum(int(np.prod(shape)) for _, shape, _, _ in table),
    tokens_per_step=config.batch_size * seq,
    model_flops_per_step=flops.train_flops_per_step(model_cfg, config.batch_size, seq, preds),
    xla_flops_per_device=float(cost.get("flops", float("nan"))),
    compile_seconds=compile_seconds,
    state_bytes_per_device=state_bytes,
    argument_bytes=memory.argument_size_in_bytes,
    output_bytes=memory.output_size_in_bytes,
    alias_bytes=memory.alias_size_in_bytes,
    temp_bytes=memory.temp_size_in_bytes,
    # Donated state aliases its outputs: what is live at the peak is arguments + temporaries + fresh outputs.
    peak_bytes_per_device=memory.argument_size_in_bytes
    + memory.output_size_in_bytes
    - memory.alias_size_in_bytes
    + memory.temp_size_in_bytes,
    parameter_table=table,
  )
  _log(report)
  return report


def _log(report: dict) -> None:
  width = max(len(name) for name, *_ in report["parameter_table"])
  lines = [f"{'parameter':{width}s}  {'shape':18s}  {'partition spec':34s}  per device"]
  for name, shape, spec, per_device in report["parameter_table"]:
    lines.append(f"{name:{width}s}  {str(shape):18s}  {spec:34s}  {per_device / 2**20:9.2f} MiB")
  logging.info("Parameter shardings:\n%s", "\n".join(lines))
  logging.info(
    "Dry run: %d x %s, mesh %s; %s parameters; %s tokens per step; model FLOPs per step %.3g (XLA, per device: "
    "%.3g); compiled in %.1f s.",
    report["devices"],
    report["device_kind"],
    report["mesh"],
    f"{report['parameters']:,}",
    f"{report['tokens_per_step']:,}",
    report["model_flops_per_step"],
    report["xla_flops_per_device"],
    report["compile_seconds"],
  )
  logging.info(
    "Per-device memory: train state %.2f GiB; arguments %.2f GiB, outputs %.2f GiB (%.2f GiB aliased to donated "
    "arguments), temporaries %.2f GiB; peak about %.2f GiB.",
    report["state_bytes_per_device"] / _GIB,
    report["argument_bytes"] / _GIB,
    report["output_bytes"] / _GIB,
    report["alias_bytes"] / _GIB,
    report["temp_bytes"] / _GIB,
    report["peak_bytes_per_device"] / _GIB,
  )
