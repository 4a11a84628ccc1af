"""Before booking a pod: compile the configured job's train and eval steps on abstract inputs and report what each
needs per chip, without allocating the model or reading data.

    python -m bert_jax.main --config=configs/large.py --workdir=/tmp/plan --mode=dry_run \\
        --config.dry_run.topology=v5p-128

With `dry_run.topology` (a Cloud TPU accelerator type; libtpu installed, no TPU needed) the steps are compiled by
XLA's TPU compiler for that slice's devices (`dry_run/tpu_topology.py`), on the mesh the config names: the TPU's
own memory analysis and HBM limit, and the collectives SPMD partitioning inserted (`dry_run/hlo_stats.py`).
Without it, for this machine's devices: on CPU, fake devices shaped like the mesh, whose fusion, buffer assignment
and memory are not a TPU's, so those figures are an estimate (the parameter and optimizer-state shards are exact).

The job is pretraining, or fine-tuning when `finetune.task` is set (its sweep members and its prediction step; the
encoder's sizes from `init_from`'s metadata when set, its weights never read). Per step the report has: usable HBM,
train-state bytes, peak bytes (`peak_bytes`: on TPU XLA's own, the most its buffer assignment holds at once; on CPU
arguments + outputs - donated + temporaries), whether it fits and by
what margin, XLA's FLOPs beside the model's, the collectives per step, and the compile time. A step that does not
fit says by how much and what would help. XLA's `optimal_seconds` estimate is a placeholder, so no time is reported:
a time comes only from running on the hardware.
"""

import dataclasses
import time

import jax
import numpy as np
from absl import logging

from bert_jax import console, sharding
from bert_jax.dry_run import hlo_stats, tpu_topology
from bert_jax.finetune import plan as plan_lib
from bert_jax.finetune import tasks
from bert_jax.finetune.members import Member, sweep_members
from bert_jax.handoff import formats
from bert_jax.model.attention import choose_kernel
from bert_jax.model.bert_config import BertConfig, model_config
from bert_jax.train import pretraining
from bert_jax.train.job_spec import JobSpec

gib = hlo_stats.format_bytes


def target_devices(config) -> tuple[list[jax.Device], str]:
  """The devices to compile for and how to name them: `dry_run.topology`'s, else this machine's."""
  if config.dry_run.topology:
    topology = tpu_topology.parse(config.dry_run.topology, config.dry_run.num_slices)
    return tpu_topology.devices(topology), f"{topology}, compiled by XLA's TPU compiler"
  devices = jax.devices()
  note = ": an estimate (CPU fusion and buffers; the state's shards are exact)" if devices[0].platform == "cpu" else ""
  return devices, f"{len(devices)} x {devices[0].device_kind} (this machine){note}"


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


@dataclasses.dataclass(frozen=True)
class Job:
  """What the dry run compiles of a job: its spec (`train/job_spec.py`, the job's own), and abstract
  arguments of its train and eval steps built from it."""

  spec: JobSpec
  train_args: tuple
  eval_args: tuple

  @property
  def run(self):
    return self.spec.run


def _abstract(shapes: dict, batch_sharding) -> dict:
  return {name: jax.ShapeDtypeStruct(shape, dtype, sharding=batch_sharding) for name, (shape, dtype) in shapes.items()}


def _key(mesh, members: int = 0):
  dtype = jax.eval_shape(jax.random.key, 0).dtype
  return jax.ShapeDtypeStruct((members,) if members else (), dtype, sharding=sharding.replicated(mesh))


def _probe(model_cfg, layers: int | None):
  """`model_cfg`, or (for counting FLOPs) `layers` of it unrolled."""
  return model_cfg if layers is None else dataclasses.replace(model_cfg, num_layers=layers, scan_layers=False)


@dataclasses.dataclass(frozen=True)
class Found:
  """What the front door's check found of the job: pretraining's encoder, a fine-tuning sweep's members (fine-tuning's
  encoder comes from its plan: `init_from`'s metadata). Either left None: made from the config, unchecked (tests,
  benchmarks)."""

  model: BertConfig | None = None
  members: tuple[Member, ...] | None = None


UNCHECKED = Found()


def job_spec(config, devices, layers: int | None = None, found: Found = UNCHECKED) -> JobSpec:
  """The configured job, described by its own `job_spec` (pretraining's, or fine-tuning's when `finetune.task` is
  set, of its plan: `plan.make_plan`) on `devices`; with `layers`, a model of that many unrolled layers. Reads
  metadata only: a teacher's or `init_from`'s weights never, a task's files never (fine-tuning's steps are
  `num_train_steps`)."""
  if not config.finetune.task:
    return pretraining.job_spec(config, devices, _probe(found.model or model_config(config), layers))
  members = sweep_members(config) if found.members is None else found.members
  source = formats.read_source(config.init_from) if config.init_from else None  # Metadata only.
  plan = plan_lib.make_plan(config, members, source)
  plan = dataclasses.replace(plan, model=_probe(plan.model, layers))
  return plan_lib.job_spec(
    config, plan, tasks.make_task(config.finetune, config.contrastive, config.embedding), devices
  )


def make_job(config, devices, layers: int | None = None, found: Found = UNCHECKED) -> Job:
  """The configured job's spec and abstract step arguments on `devices`; with `layers`, a model of that
  many unrolled layers."""
  spec = job_spec(config, devices, layers, found)
  run = spec.run
  mesh, members = run.mesh, run.members
  train_batch = _abstract(spec.train_batch, sharding.batch_sharding(mesh, members=bool(members)))
  eval_batch = _abstract(spec.eval_batch, sharding.batch_sharding(mesh))
  state = sharding.with_shardings(run.abstract, run.shardings)
  params = sharding.with_shardings(run.abstract.params, run.shardings.params)
  # Frozen inputs (a teacher) are arguments: the memory analysis counts their HBM.
  frozen = run.frozen_abstract_args
  return Job(
    spec=spec,
    train_args=(state, train_batch, _key(mesh, members), *frozen),
    eval_args=(params, eval_batch, *(frozen if spec.eval_reads_frozen else ())),
  )


def xla_flops_per_device(config, devices, num_layers: int, found: Found = UNCHECKED) -> float:
  """XLA's FLOPs of one train step per device, every layer and microbatch counted. XLA's cost analysis counts a
  loop's body once, so a step with scanned layers or microbatches undercounts; the layers are identical, so
  unrolled compiles of 1 and 2 layers, without microbatches (the same arithmetic), give all of them:
  F(L) = F(1) + (L - 1) (F(2) - F(1))."""
  probe = config.copy_and_resolve_references()
  probe.num_microbatches = 1
  counted = []
  for layers in (1, 2):
    job = make_job(probe, devices, layers, found)
    train_step = job.spec.run.train_step
    counted.append(float((train_step.lower(*job.train_args).compile().cost_analysis() or {})["flops"]))
  return counted[0] + (num_layers - 1) * (counted[1] - counted[0])


def compile_step(jitted, args, usable_bytes: int | None) -> dict:
  """Compiles `jitted` for `args`; the step's figures, or (when XLA finds it does not fit) the figures it named."""
  start = time.perf_counter()
  try:
    compiled = jitted.lower(*args).compile()
  except Exception as error:  # noqa: BLE001 (jaxlib's error type)
    found = tpu_topology.parse_hbm_error(str(error))
    if not found:
      raise
    usable = found.get("available", usable_bytes)
    return dict(
      fits=False,
      compile_seconds=time.perf_counter() - start,
      peak_bytes=found.get("required"),
      usable_bytes=usable,
      margin_bytes=-found["exceeded_by"] if "exceeded_by" in found else None,
      error=str(error).strip().splitlines()[0],
    )
  seconds = time.perf_counter() - start
  memory, text = compiled.memory_analysis(), compiled.as_text()
  cost = compiled.cost_analysis() or {}
  peak = peak_bytes(memory, _platform(compiled))
  return dict(
    fits=usable_bytes is None or peak <= usable_bytes,
    compile_seconds=seconds,
    peak_bytes=peak,
    usable_bytes=usable_bytes,
    margin_bytes=None if usable_bytes is None else usable_bytes - peak,
    argument_bytes=memory.argument_size_in_bytes,
    output_bytes=memory.output_size_in_bytes,
    alias_bytes=memory.alias_size_in_bytes,
    temp_bytes=memory.temp_size_in_bytes,
    # Activations a policy offloads (remat offload_dense) live in the host's memory, outside the HBM peak.
    host_temp_bytes=getattr(memory, "host_temp_size_in_bytes", 0),
    xla_flops_per_device=float(cost.get("flops", float("nan"))),
    collectives=hlo_stats.collectives(text),
    # Pallas kernels compiled by Mosaic (splash attention) in the optimised HLO; the text itself is not kept (a
    # planner keeps every try's report, and BERT-Large's HLO runs to megabytes).
    tpu_kernels=text.count("tpu_custom_call"),
  )


def _platform(compiled) -> str:
  """The platform a compiled program was compiled for ("tpu", "cpu", ...), from its shardings' devices."""
  shardings = jax.tree.leaves((compiled.input_shardings, compiled.output_shardings))
  return next(iter(shardings[0].device_set)).platform


def peak_bytes(memory, platform: str) -> int:
  """The most memory a compiled program holds at once, per chip. On TPU, XLA's own peak (`peak_memory_in_bytes`, from
  its buffer assignment: arguments, outputs and temporaries as they are laid out and reused). Elsewhere, and where
  XLA:TPU does not report it, arguments + outputs - donated + temporaries: XLA:CPU's `peak_memory_in_bytes` leaves
  its temporaries out (it is arguments + outputs - donated exactly: `configs/tiny.py`'s train step, 6.3 MiB beside
  77.4 MiB of temporaries). The sum counts a TPU program with loops high: `temp_size_in_bytes` goes beyond the
  one temporary allocation XLA:TPU makes (scanned BERT-Base, 4 layers at 512 tokens, 16 rows a v5e chip: 3.23 GiB
  against XLA's 2.45, its preallocated temporaries 1.87 GiB beside 0.60 of arguments; BERT-Large's phase 2 on a
  v5e-16 chip: 16.90 GiB against 15.11, a program XLA:TPU accepts for 15.75 GiB; docs/tpu.md)."""
  peak = getattr(memory, "peak_memory_in_bytes", 0)
  if platform == "tpu" and peak > 0:
    return peak
  # Donated state aliases its outputs: live at the peak are the arguments, the temporaries and fresh outputs.
  return (
    memory.argument_size_in_bytes + memory.output_size_in_bytes - memory.alias_size_in_bytes + memory.temp_size_in_bytes
  )


def in_host_memory(step: dict) -> str:
  """What a compiled step keeps in the host's memory (remat offload_dense's activations), "" for none."""
  return f"{gib(step['host_temp_bytes'])} in host memory" if step.get("host_temp_bytes") else ""


def usable_hbm(devices) -> int | None:
  """Usable HBM per chip of TPU `devices` (None for others, and where XLA:TPU did not say: then "fits" means only
  that the compiler accepted the program, and a warning says so)."""
  if devices[0].platform != "tpu":
    return None
  usable = tpu_topology.usable_hbm_bytes(devices[0])
  if usable is None:
    logging.warning(
      "XLA's TPU compiler did not name the usable HBM of a %s chip: a step that compiles is reported as fitting.",
      devices[0].device_kind,
    )
  return usable


def compile_job(
  config, devices=None, *, eval_step: bool = True, all_flops: bool = True, found: Found = UNCHECKED
) -> dict:
  """Compiles the configured job's train step (and eval step) for `devices` (default: `target_devices`); returns
  the report's figures. `all_flops`: count every layer's FLOPs when XLA's count misses loop trips (two more small
  compiles, see `xla_flops_per_device`)."""
  target = "given devices"
  if devices is None:
    devices, target = target_devices(config)
  job = make_job(config, devices, found=found)
  spec = job.spec
  mesh, abstract, shardings = spec.run.mesh, spec.run.abstract, spec.run.shardings
  usable = usable_hbm(devices)
  table = parameter_table(abstract.params, shardings.params)
  state_bytes = sum(
    int(np.prod(s.shard_shape(a.shape))) * a.dtype.itemsize
    for a, s in zip(jax.tree.leaves(abstract), jax.tree.leaves(shardings), strict=True)
  )
  steps = {"train step": compile_step(spec.run.train_step, job.train_args, usable)}
  if eval_step:
    steps["eval step"] = compile_step(spec.eval_step, job.eval_args, usable)
  model_cfg = spec.model_cfg
  attention = choose_kernel(
    model_cfg.attention,
    devices[0].platform,
    attention_dropout_prob=model_cfg.attention_dropout_prob,
    dtype=model_cfg.dtype,
  )
  train = steps["train step"]
  loops = model_cfg.scan_layers or config.num_microbatches > 1
  if all_flops and train["fits"] and loops and devices[0].platform == "tpu":  # CPU figures are an estimate anyway.
    train["xla_flops_per_device"] = xla_flops_per_device(config, devices, model_cfg.num_layers, found)
    train["flops_from"] = "unrolled 1- and 2-layer compiles"
  return dict(
    job=spec.name,
    target=target,
    devices=mesh.size,
    platform=devices[0].platform,
    device_kind=devices[0].device_kind,
    mesh=dict(mesh.shape),
    batch=spec.batch_row,
    model=model_cfg,
    attention=attention,
    parameters=spec.run.num_params,
    tokens_per_step=spec.tokens_per_step,
    model_flops_per_step=spec.train_flops,
    eval_model_flops=spec.eval_flops,
    state_bytes_per_device=state_bytes,
    usable_bytes=usable,
    steps=steps,
    parameter_table=table,
    advice=advice(config, mesh, steps["train step"], attention),
  )


def advice(config, mesh, step: dict, attention: str) -> list[str]:
  """What would bring a step that does not fit under the limit, most effective first."""
  if step["fits"]:
    return []
  hints = []
  model = config.model
  if model.remat != "full":
    hints.append(
      f"--config.model.remat (now {model.remat}; --mode=plan picks the least recomputation that fits): recompute "
      "each layer's activations in the backward pass instead of keeping them"
    )
  if attention == "xla" and mesh.devices.flat[0].platform == "tpu":
    hints.append(
      "--config.model.attention=splash --config.model.attention_dropout_prob=0: no [batch, heads, seq, seq] "
      "scores in HBM"
    )
  chips = mesh.size // mesh.shape["tensor"]
  if mesh.shape["fsdp"] < chips:
    hints.append(
      f"--config.mesh.fsdp={chips} --config.mesh.data=1: parameters and optimizer state split over all {chips} chips"
    )
  hints.append(
    f"--config.num_microbatches={2 * config.num_microbatches}: the same update from sequential microbatches, "
    "with one microbatch's activations"
  )
  per_chip = config.batch_size // sharding.data_parallel_size(mesh)
  if per_chip > 1:
    hints.append(
      f"a smaller per-chip batch than {per_chip} (--mode=plan finds the largest that fits for each remat policy)"
    )
  return hints


def _step_rows(name: str, step: dict, chips: int, model_flops: float) -> list[tuple[str, str]]:
  if not step["fits"]:
    over = step["margin_bytes"]
    by = f" by {gib(-over)}" if over is not None else ""
    return [
      (
        name,
        f"DOES NOT FIT{by}: needs {gib(step['peak_bytes'])} of {gib(step['usable_bytes'])} per chip "
        f"(compile {step['compile_seconds']:.1f} s)",
      ),
      ("", step.get("error", "")),
    ]
  fit = "fits" if step["usable_bytes"] is not None else "compiled"
  margin = f", margin {gib(step['margin_bytes'])}" if step["margin_bytes"] is not None else ""
  if "flops_from" in step:
    counted_once = f" (from {step['flops_from']})"
  elif step["collectives"].loops:
    counted_once = " (XLA counts a loop's body once: scanned layers and microbatches once)"
  else:
    counted_once = ""
  return [
    (
      name,
      f"{fit}: peak {gib(step['peak_bytes'])} per chip{margin}; compiled in {step['compile_seconds']:.1f} s",
    ),
    (
      "",
      f"arguments {gib(step['argument_bytes'])}, outputs {gib(step['output_bytes'])} "
      f"({gib(step['alias_bytes'])} donated), temporaries {gib(step['temp_bytes'])}"
      + (f"; {in_host_memory(step)}" if in_host_memory(step) else ""),
    ),
    (
      "",
      f"FLOPs per step: model {model_flops:.3g}; XLA {step['xla_flops_per_device']:.3g} per chip x {chips} = "
      f"{step['xla_flops_per_device'] * chips:.3g}{counted_once}",
    ),
    ("", f"collectives per step: {step['collectives'].describe()}"),
  ]


def format_report(report: dict) -> str:
  model = report["model"]
  chips = report["devices"]
  rows = [
    ("job", report["job"]),
    ("target", report["target"]),
    ("mesh", " x ".join(f"{axis} {size}" for axis, size in report["mesh"].items())),
    (
      "model",
      f"{model.title}, {report['parameters']:,} parameters, "
      f"{model.dtype}, remat {model.remat}, attention {report['attention']}, "
      f"{'scanned' if model.scan_layers else 'unrolled'} layers",
    ),
    ("batch", f"{report['batch']}; {report['tokens_per_step']:,} tokens per step"),
    (
      "usable HBM",
      f"{gib(report['usable_bytes'])} per chip"
      if report["usable_bytes"]
      else ("not reported by XLA" if report["platform"] == "tpu" else "no limit known (not a TPU)"),
    ),
    ("train state", f"{gib(report['state_bytes_per_device'])} per chip"),
  ]
  for name, step in report["steps"].items():
    flops_of_step = report["model_flops_per_step"] if name == "train step" else report["eval_model_flops"]
    rows += _step_rows(name, step, chips, flops_of_step)
  for hint in report["advice"]:
    rows.append(("would help", hint))
  return console.block("Dry run (no time is estimated: only running on the hardware gives one)", rows)


def log_report(report: dict) -> None:
  width = max(len(name) for name, *_ in report["parameter_table"])
  lines = [f"{'parameter':{width}s}  {'shape':18s}  {'partition spec':34s}  per device"]
  for name, shape, spec, per_device in report["parameter_table"]:
    lines.append(f"{name:{width}s}  {str(shape):18s}  {spec:34s}  {per_device / 2**20:9.2f} MiB")
  logging.info("Parameter shardings:\n%s", "\n".join(lines))
  logging.info("%s", format_report(report))


def dry_run(config, model_cfg: BertConfig | None, members: tuple[Member, ...]) -> dict:
  """`--mode=dry_run`: compiles the job and logs the report; `model_cfg` and `members` are what the front door's check
  found (`jobs.run` calls this)."""
  report = compile_job(config, found=Found(model_cfg, members))
  log_report(report)
  return report
