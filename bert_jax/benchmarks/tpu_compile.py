"""BERT-Base and BERT-Large compiled for Cloud TPU slices on this machine (XLA's TPU compiler; no TPU): per-chip peak
HBM at the configs' batch, the largest per-chip batch per remat policy, compile times, and transformers'
`FlaxBertForPreTraining` compiled for the same slice and batch; and the ModernBERT configs (`--sections=modernbert`).

    pip install -e '.[test]'   # libtpu (bert_jax[tpu]) and transformers, the reference
    python -m bert_jax.benchmarks.tpu_compile --sections=config,plan,reference --presets=base,large --seqs=128,512 \\
        --topologies=v4-8,v5e-8,v5p-8,v6e-8,v5p-128 --plan_topologies=v5e-8 --reference_topologies=v5e-8

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

from bert_jax import sharding
from bert_jax.benchmarks.reference import hf_pretraining_loss, hf_train_step
from bert_jax.dry_run import ahead_of_time, planner
from bert_jax.handoff.hf_configs import hf_config
from bert_jax.model.bert_config import model_config, preset
from configs import default

_TOPOLOGIES = flags.DEFINE_list("topologies", ["v4-8", "v5e-8", "v5p-8", "v6e-8", "v5p-128"], "Accelerator types.")
_PLAN_TOPOLOGIES = flags.DEFINE_list("plan_topologies", ["v4-8", "v5e-8", "v5p-8", "v6e-8"], "Where to plan.")
_PRESETS = flags.DEFINE_list("presets", ["base", "large"], "Model size presets.")
_SEQS = flags.DEFINE_list("seqs", ["128", "512"], "Sequence lengths.")
_REMAT = flags.DEFINE_list("remat", ["none", "save_dots", "full"], "Remat policies for the planner.")
_REFERENCE_PRESETS = flags.DEFINE_list("reference_presets", ["base"], "Presets compiled as transformers' model too.")
_REFERENCE_TOPOLOGIES = flags.DEFINE_list("reference_topologies", ["v5e-8"], "Where the reference is compiled.")
_ALL_FLOPS = flags.DEFINE_bool("all_flops", True, "config: XLA's FLOPs of every layer (two more compiles a row).")
_PER_CHIP = flags.DEFINE_integer("per_chip", 16, "layouts, policies, side_by_side: the per-chip batch compared.")
_LAYOUT_REMAT = flags.DEFINE_list("layout_remat", ["none", "save_dots", "full"], "layouts: the policies compared.")
_SIDE_REMAT = flags.DEFINE_list("side_remat", ["none", "full"], "side_by_side: none and/or full.")
_MODERN_CONFIGS = flags.DEFINE_list("modern_configs", ["modernbert_base", "modernbert_large"], "modernbert: configs.")
_MODERN_SEQS = flags.DEFINE_list("modern_seqs", ["1024", "8192"], "modernbert: sequence lengths.")
_MODERN_TOPOLOGIES = flags.DEFINE_list("modern_topologies", ["v5e-8", "v5p-8", "v6e-8"], "modernbert: slices.")
_MODERN_REMAT = flags.DEFINE_list("modern_remat", ["none", "save_dots", "full"], "modernbert: the planner's policies.")
_MODERN_TOKENS = flags.DEFINE_integer("modern_tokens", 8192, "modernbert: tokens per chip of the peak columns.")
_SECTIONS = flags.DEFINE_list(
  "sections",
  ["config", "plan", "reference"],
  "config: every model, seq and topology at the configs' batch; plan: the planner on plan_topologies; splash: the "
  "planner with xla and splash attention (attention dropout 0); reference: transformers' model beside bert_jax's; "
  "layouts: scanned against unrolled layers per remat policy at --per_chip rows; policies: every remat policy's "
  "peak at --per_chip rows, XLA FLOPs (every layer counted) and largest per-chip batch; side_by_side: bert_jax and "
  "transformers at --per_chip rows and their largest per-chip batches, remat none and full (and splash at 512); "
  "modernbert: the ModernBERT configs at each of --modern_seqs on --modern_topologies, peak at --modern_tokens per "
  "chip with XLA's attention and with splash (its local mask), and the largest per-chip batch per remat policy "
  "with splash.",
)
_BATCH = 256


def _config(preset_name: str, seq: int, topology: str):
  config = default.get_config()
  config.model.update(preset(preset_name), dtype="bfloat16", scan_layers=True)
  config.batch_size = _BATCH
  config.data.update(max_seq_length=seq, max_predictions_per_seq=20 if seq == 128 else 80)
  config.dry_run.update(topology=topology, plan_batch_step=8, plan_max_batch=1024)
  return config


def _reference(config, devices) -> dict:
  """transformers' FlaxBertForPreTraining, same sizes, dtype, optimizer and batch, data parallel on `devices`;
  `model.remat="full"` is its `gradient_checkpointing` (each layer recomputed), anything else none."""
  from transformers import BertConfig as HFBertConfig
  from transformers import FlaxBertForPreTraining

  from bert_jax.data.pretraining_batch import pretraining_shapes
  from bert_jax.train.optim import make_optimizer

  model_cfg = model_config(config)
  module = FlaxBertForPreTraining(
    HFBertConfig(**hf_config(model_cfg)),
    dtype=jnp.bfloat16,
    _do_init=False,
    gradient_checkpointing=config.model.remat == "full",
  ).module
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
  return ahead_of_time.compile_step(step, (state, batch, key), ahead_of_time.usable_hbm(devices))


def _gib(size) -> str:
  return "-" if size is None else f"{size / 2**30:.2f}"


def _config_table() -> None:
  print(
    "\n| model | seq | topology | usable HBM/chip (GiB) | peak HBM/chip (GiB) | fits | compile (s) | XLA TFLOP/step |"
  )
  print("|---|---|---|---|---|---|---|---|")
  for preset_name in _PRESETS.value:
    for seq in map(int, _SEQS.value):
      for topology in _TOPOLOGIES.value:
        config = _config(preset_name, seq, topology)
        devices, _ = ahead_of_time.target_devices(config)
        report = ahead_of_time.compile_job(config, devices, eval_step=False, all_flops=_ALL_FLOPS.value)
        step = report["steps"]["train step"]
        counted = step["fits"] and "flops_from" in step
        flops = step["xla_flops_per_device"] * report["devices"] / 1e12 if counted else float("nan")
        print(
          f"| {preset_name} | {seq} | {topology} | {_gib(report['usable_bytes'])} | {_gib(step['peak_bytes'])} "
          f"| {'yes' if step['fits'] else 'no'} | {step['compile_seconds']:.0f} | {flops:.1f} |",
          flush=True,
        )


def _reference_table() -> None:
  print(
    "\n| model | seq | topology | bert_jax peak (GiB) | bert_jax XLA TFLOP/step | transformers peak (GiB) "
    "| transformers XLA TFLOP/step | transformers compile (s) |"
  )
  print("|---|---|---|---|---|---|---|---|")
  for preset_name in _REFERENCE_PRESETS.value:
    for seq in map(int, _SEQS.value):
      for topology in _REFERENCE_TOPOLOGIES.value:
        config = _config(preset_name, seq, topology)
        devices, _ = ahead_of_time.target_devices(config)
        report = ahead_of_time.compile_job(config, devices, eval_step=False)
        ours, ref = report["steps"]["train step"], _reference(config, devices)
        chips = report["devices"]
        flops = lambda step, chips=chips: f"{step['xla_flops_per_device'] * chips / 1e12:.1f}" if step["fits"] else "-"
        print(
          f"| {preset_name} | {seq} | {topology} | {_gib(ours['peak_bytes'])} | {flops(ours)} | "
          f"{_gib(ref['peak_bytes'])}{'' if ref['fits'] else ' (does not fit)'} | {flops(ref)} | "
          f"{ref['compile_seconds']:.0f} |",
          flush=True,
        )


def _plan_table(attention: tuple[str, ...] = ("xla",)) -> None:
  print(
    "\n| model | seq | topology | attention | " + " | ".join(f"remat {r}" for r in _REMAT.value) + " | compiles (s) |"
  )
  print("|---|---|---|---|" + "---|" * (len(_REMAT.value) + 1))
  for preset_name in _PRESETS.value:
    for seq in map(int, _SEQS.value):
      for topology in _PLAN_TOPOLOGIES.value:
        for kind in attention:
          config = _config(preset_name, seq, topology)
          config.dry_run.plan_remat = tuple(_REMAT.value)
          if kind != "xla":
            config.model.update(attention=kind, attention_dropout_prob=0.0)
          start = time.perf_counter()
          rows = planner.plan(config)
          cells = " | ".join(
            f"{row['per_chip_batch']}{'+' if row['capped'] else ''} ({_gib(row['peak_bytes'])} GiB)" for row in rows
          )
          compiles = sum(row["compiles"] for row in rows)
          print(
            f"| {preset_name} | {seq} | {topology} | {kind} | {cells} | {compiles} "
            f"({time.perf_counter() - start:.0f}) |",
            flush=True,
          )


def _per_chip_config(preset_name: str, seq: int, topology: str, per_chip: int, **model):
  config = _config(preset_name, seq, topology)
  devices, _ = ahead_of_time.target_devices(config)
  config.batch_size = per_chip * sharding.data_parallel_size(sharding.make_mesh(config.mesh.to_dict(), devices))
  config.model.update(model)
  return config, devices


def _train_step(config, devices) -> dict:
  """`config`'s train step compiled for `devices` (ahead_of_time.compile_step's report)."""
  job = ahead_of_time.make_job(config, devices)
  return ahead_of_time.compile_step(job.run.train_step, job.train_args, ahead_of_time.usable_hbm(devices))


def _ours(preset_name, seq, topology, per_chip, **model) -> dict:
  return _train_step(*_per_chip_config(preset_name, seq, topology, per_chip, **model))


def _theirs(preset_name, seq, topology, per_chip, **model) -> dict:
  config, devices = _per_chip_config(preset_name, seq, topology, per_chip, **model)
  return _reference(config, devices)


def _largest(compile_at) -> tuple[int, float]:
  """(the largest per-chip batch, a multiple of 8 up to 4,096, that fits; seconds the search took). Full remat at
  128 tokens holds more than 2,000 BERT-Base rows a v5e chip."""
  start = time.perf_counter()
  batch, _, _ = planner.search(compile_at, 8, 4096)
  return batch, time.perf_counter() - start


def _layouts_table() -> None:
  print(
    f"\n| model | seq | topology | remat | scanned peak (GiB) | unrolled peak (GiB) | scanned / unrolled "
    f"| scanned compile (s) | unrolled compile (s) |  ({_PER_CHIP.value} rows per chip)"
  )
  print("|---|---|---|---|---|---|---|---|---|")
  for preset_name in _PRESETS.value:
    for seq in map(int, _SEQS.value):
      for topology in _REFERENCE_TOPOLOGIES.value:
        for remat in _LAYOUT_REMAT.value:
          steps = [
            _ours(preset_name, seq, topology, _PER_CHIP.value, remat=remat, scan_layers=s) for s in (True, False)
          ]
          ratio = steps[0]["peak_bytes"] / steps[1]["peak_bytes"]
          print(
            f"| {preset_name} | {seq} | {topology} | {remat} | {_gib(steps[0]['peak_bytes'])} | "
            f"{_gib(steps[1]['peak_bytes'])} | {ratio:.2f} | {steps[0]['compile_seconds']:.0f} | "
            f"{steps[1]['compile_seconds']:.0f} |",
            flush=True,
          )


def _policies_table() -> None:
  print(
    f"\n| model | seq | topology | remat | peak at {_PER_CHIP.value} rows/chip (GiB) | XLA TFLOP/step per chip "
    "| largest per-chip batch | search (s) |"
  )
  print("|---|---|---|---|---|---|---|---|")
  for preset_name in _PRESETS.value:
    for seq in map(int, _SEQS.value):
      for topology in _PLAN_TOPOLOGIES.value:
        for remat in _REMAT.value:
          config, devices = _per_chip_config(preset_name, seq, topology, _PER_CHIP.value, remat=remat)
          step = _ours(preset_name, seq, topology, _PER_CHIP.value, remat=remat)
          flops = ahead_of_time.xla_flops_per_device(config, devices, config.model.num_layers) / 1e12
          batch, seconds = _largest(lambda b, p=preset_name, s=seq, t=topology, r=remat: _ours(p, s, t, b, remat=r))
          host = f" (+{ahead_of_time.in_host_memory(step)})" if ahead_of_time.in_host_memory(step) else ""
          print(
            f"| {preset_name} | {seq} | {topology} | {remat} | {_gib(step['peak_bytes'])}{host}"
            f"{'' if step['fits'] else ' (does not fit)'} | {flops:.2f} | {batch} | {seconds:.0f} |",
            flush=True,
          )


def _side_by_side_table() -> None:
  print(
    f"\n| model | seq | topology | remat | bert_jax peak at {_PER_CHIP.value} rows (GiB) | transformers peak (GiB) "
    "| bert_jax largest batch | transformers largest batch | ratio | bert_jax splash largest batch |"
  )
  print("|---|---|---|---|---|---|---|---|---|---|")
  for preset_name in _REFERENCE_PRESETS.value:
    for seq in map(int, _SEQS.value):
      for topology in _REFERENCE_TOPOLOGIES.value:
        for remat in _SIDE_REMAT.value:
          ours = _ours(preset_name, seq, topology, _PER_CHIP.value, remat=remat)
          theirs = _theirs(preset_name, seq, topology, _PER_CHIP.value, remat=remat)
          our_batch, _ = _largest(lambda b, p=preset_name, s=seq, t=topology, r=remat: _ours(p, s, t, b, remat=r))
          their_batch, _ = _largest(lambda b, p=preset_name, s=seq, t=topology, r=remat: _theirs(p, s, t, b, remat=r))
          splash = "-"
          if seq >= 512:
            splash, _ = _largest(
              lambda b, p=preset_name, s=seq, t=topology, r=remat: _ours(
                p, s, t, b, remat=r, attention="splash", attention_dropout_prob=0.0
              )
            )
          print(
            f"| {preset_name} | {seq} | {topology} | {remat} | {_gib(ours['peak_bytes'])} | "
            f"{_gib(theirs['peak_bytes'])} | {our_batch} | {their_batch} | "
            f"{our_batch / max(their_batch, 1):.2f} | {splash} |",
            flush=True,
          )


def _modern_config(name: str, seq: int, topology: str, per_chip: int, **model):
  """configs/<name>.py at `seq` tokens (beyond 1,024: the context extension's, RoPE's global base raised) on
  `topology`, `per_chip` rows a chip in one microbatch, with `model`'s changes."""
  import importlib

  from configs import modernbert_base, modernbert_context_extension

  config = importlib.import_module(f"configs.{name}").get_config()
  if seq > modernbert_base.SEQ_LENGTH:
    config.model.rope_theta = modernbert_context_extension.GLOBAL_ROPE_THETA
  config.data.update(max_seq_length=seq, max_predictions_per_seq=modernbert_base.max_predictions(seq))
  config.dry_run.topology = topology
  devices, _ = ahead_of_time.target_devices(config)
  config.batch_size = per_chip * sharding.data_parallel_size(sharding.make_mesh(config.mesh.to_dict(), devices))
  config.num_microbatches = 1
  config.batch_warmup_tokens = 0  # The full batch's program: the warmup's smaller ones are no bigger.
  config.model.update(model)
  return config, devices


def _modern(name, seq, topology, per_chip, **model) -> dict:
  return _train_step(*_modern_config(name, seq, topology, per_chip, **model))


def _modern_table() -> None:
  print(
    "\n| config | seq | topology | rows/chip | peak, XLA attention (GiB) | peak, splash (GiB) |"
    + "".join(f" largest batch, remat {r} |" for r in _MODERN_REMAT.value)
    + " compiles (s) |"
  )
  print("|---|---|---|---|---|---|" + "---|" * (len(_MODERN_REMAT.value) + 1))
  for name in _MODERN_CONFIGS.value:
    for seq in map(int, _MODERN_SEQS.value):
      per_chip = max(_MODERN_TOKENS.value // seq, 1)
      for topology in _MODERN_TOPOLOGIES.value:
        start = time.perf_counter()
        peaks = [_modern(name, seq, topology, per_chip, remat="none", attention=kind) for kind in ("xla", "splash")]
        cells = [f"{_gib(p['peak_bytes'])}{'' if p['fits'] else ' (does not fit)'}" for p in peaks]
        for remat in _MODERN_REMAT.value:
          # Multiples of 8 rows of 1,024 tokens (of one row of 8,192), up to a million tokens a chip.
          unit = max(8 * 1024 // seq, 1)
          batch, _, _ = planner.search(
            lambda b, n=name, s=seq, t=topology, r=remat: _modern(n, s, t, b, remat=r, attention="splash"),
            unit,
            2**20 // seq,
            start=per_chip,
          )
          cells.append(str(batch))
        seconds = time.perf_counter() - start
        print(f"| {name} | {seq} | {topology} | {per_chip} | " + " | ".join(cells) + f" | {seconds:.0f} |", flush=True)


def main(argv):
  del argv
  print(f"jax {jax.__version__}, libtpu compile-only devices; global batch {_BATCH}, bfloat16, scanned layers")
  for section in _SECTIONS.value:
    if section == "config":
      _config_table()
    elif section == "reference":
      _reference_table()
    elif section == "plan":
      _plan_table()
    elif section == "splash":
      _plan_table(("xla", "splash"))
    elif section == "layouts":
      _layouts_table()
    elif section == "policies":
      _policies_table()
    elif section == "side_by_side":
      _side_by_side_table()
    elif section == "modernbert":
      _modern_table()
    else:
      raise app.UsageError(f"Unknown section {section!r}.")


if __name__ == "__main__":
  app.run(main)
