"""Fine-tuning step throughput (sequence classification) of bert_jax, as one run and as a vmapped sweep of seeds,
against Hugging Face's `FlaxBertForSequenceClassification`, in one process.

    pip install -e '.[test]'   # transformers is the reference, not a dependency of bert_jax
    python -m bert_jax.benchmarks.finetune_step_time --preset=tiny --batch_size=32 --seq=128 --members=5
    python -m bert_jax.benchmarks.finetune_step_time --preset=base --batch_size=32 --seq=128 --members=5 \
        --dtypes=float32,bfloat16

bert_jax's step is built as the fine-tuning job builds it (`finetune/job.py`): the classification head, its loss,
the sweep optimizer with every member's learning rate in its state, one dropout key per member, and a batch
placed by `sharding.global_batch`; once with one member (a run trained alone) and once with `--members` (a
sweep: every member's state stacked, the step vmapped, one jitted program). The reference is built from the same
config with random weights (no download); its loss is the mean cross-entropy of its float32 logits, and it takes
bert_jax's optimizer (configs/glue.py's AdamW, warmup, clipping) and the dropout key of the first member, folded
with the step. All steps are jitted with the state donated and see the same synthetic batches: random tokens, a
random real length per row with padding after it, random labels (so every loss stays near ln(num_labels);
transformers' starts further above it: its Flax classifier kernel takes Flax's default initialiser, lecun normal,
std 1/sqrt(hidden), not `initializer_range`).

Rounds alternate between the contestants so that machine noise hits all alike; the best round of each counts.
Reports examples/s and tokens/s (padding included; a sweep's count every member's), s/step, compile + first step,
model FLOP/s (analytic: encoder and pooler, `flops.train_flops_per_step` without MLM predictions) and the speedups
of a sweep over its members trained one after another, with bert_jax and with transformers.

`benchmarks/step_time.py` is the pretraining twin; it is not imported, since importing it defines its flags.
"""

import functools
import math
import time
from importlib import metadata

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags

from bert_jax import flops as flops_lib
from bert_jax import sharding
from bert_jax.benchmarks.reference import hf_train_step
from bert_jax.finetune import losses
from bert_jax.handoff.hf_configs import hf_config
from bert_jax.model import heads
from bert_jax.model.bert_config import BertConfig, model_config, preset
from bert_jax.train import run
from bert_jax.train.loop import train_dropout_key
from bert_jax.train.optim import make_optimizer, make_sweep_optimizer, set_learning_rates
from configs import glue as glue_config

_PRESET = flags.DEFINE_string("preset", "tiny", "Model size preset (bert_jax.model.bert_config.PRESETS).")
_BATCH = flags.DEFINE_integer("batch_size", 32, "Batch size (rows per step of each member).")
_SEQ = flags.DEFINE_integer("seq", 128, "Tokens per row (finetune.max_seq_length).")
_NUM_LABELS = flags.DEFINE_integer("num_labels", 2, "Classes of the classification head.")
_MEMBERS = flags.DEFINE_integer("members", 5, "Members of the sweep (seeds in one vmapped program).")
_DTYPES = flags.DEFINE_list("dtypes", ["float32"], "Compute dtypes, each run against the reference.")
_PEAK_TFLOPS = flags.DEFINE_float("peak_tflops", 0.0, "Peak TFLOP/s of the device for MFU (0: from flops.py).")
_STEPS = flags.DEFINE_integer("steps", 10, "Timed steps per round.")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Alternating rounds (the best round of each contestant counts).")


def make_config(preset_name: str, dtype: str, batch_size: int, seq: int):
  """configs/glue.py (the paper's fine-tuning hyperparameters) at this size, on a one-device mesh."""
  config = glue_config.get_config()
  config.model.update(preset(preset_name), dtype=dtype)
  # A 10,000-step schedule with the fine-tuning job's 10% warmup: the timed steps train at a small rate.
  config.update(batch_size=batch_size, num_train_steps=10_000, warmup_steps=1_000, schedule_end_step=0)
  config.finetune.max_seq_length = seq
  config.mesh.update(data=1, fsdp=1, tensor=1)
  model_cfg = model_config(config)
  if not 8 <= seq <= model_cfg.max_sequence_length:
    raise ValueError(f"--seq={seq} must be in [8, {model_cfg.max_sequence_text}].")
  return config, model_cfg


def synthetic_batch(rng: np.random.Generator, batch_size: int, seq: int, num_labels: int, vocab_size: int) -> dict:
  """A classification batch as the GLUE encoder writes it: [CLS] a [SEP] b [SEP], zero-padded after a random
  real length per row; input_ids, input_mask, segment_ids [batch, seq] int32, label [batch] int32, weight [batch]."""
  lengths = rng.integers(8, seq + 1, size=batch_size)
  positions = np.arange(seq)[None, :]
  input_mask = (positions < lengths[:, None]).astype(np.int32)
  input_ids = rng.integers(1000, vocab_size, size=(batch_size, seq)).astype(np.int32)  # Above the special ids.
  split = rng.integers(2, lengths - 1)  # Where segment b starts.
  input_ids[:, 0] = 101  # [CLS]
  input_ids[np.arange(batch_size), lengths - 1] = 102  # [SEP]
  input_ids[np.arange(batch_size), split - 1] = 102
  segment_ids = ((positions >= split[:, None]) & (input_mask == 1)).astype(np.int32)
  return dict(
    input_ids=input_ids * input_mask,
    input_mask=input_mask,
    segment_ids=segment_ids,
    label=rng.integers(0, num_labels, size=batch_size).astype(np.int32),
    weight=np.ones(batch_size, np.float32),
  )


def bert_jax_contestant(config, model_cfg: BertConfig, num_labels: int, members: int):
  """(jitted step, state, dropout keys [members], mesh): the fine-tuning job's classification run with `members`
  seeds (config.seed, config.seed + 1, ...), each at config.learning_rate."""
  model = heads.task_model(model_cfg, "classification", num_labels)
  sweep_run = run.make_run(
    config,
    model,
    losses.make_loss("classification"),
    make_sweep_optimizer(config),
    members=members,
    devices=jax.devices()[:1],
  )
  seeds = [config.seed + index for index in range(members)]
  state = sweep_run.init_state(seeds, None)
  rates = jnp.full((members,), config.learning_rate, jnp.float32)
  state = state.replace(opt_state=set_learning_rates(state.opt_state, rates))
  # The rates arrive unplaced: placed as the step returns them, the second step does not compile again.
  state = jax.device_put(state, sweep_run.shardings)
  dropout_keys = jnp.stack([train_dropout_key(seed) for seed in seeds])
  return sweep_run.train_step, state, dropout_keys, sweep_run.mesh


def _hf_loss(outputs, batch):
  return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(outputs.logits.astype(jnp.float32), batch["label"]))


def transformers_contestant(config, model_cfg: BertConfig, num_labels: int, mesh):
  """(jitted step, state, dropout key): `FlaxBertForSequenceClassification` of the same config, random weights,
  with bert_jax's optimizer and the first member's dropout key; the state is replicated on `mesh` (the batches'),
  where the step returns it, so that the second step does not compile again."""
  from transformers import BertConfig as HFBertConfig
  from transformers import FlaxBertForSequenceClassification

  hf_model = FlaxBertForSequenceClassification(
    HFBertConfig(**hf_config(model_cfg), num_labels=num_labels),
    seed=0,
    dtype=model_cfg.compute_dtype,
    _do_init=True,
  )
  tx = make_optimizer(config)
  params = jax.tree.map(jnp.asarray, hf_model.params)
  state = jax.device_put((params, tx.init(params), jnp.zeros((), jnp.int32)), sharding.replicated(mesh))
  step = jax.jit(functools.partial(hf_train_step, module=hf_model.module, loss=_hf_loss, tx=tx), donate_argnums=0)
  return step, state, train_dropout_key(config.seed)


def time_round(step, state, batches, dropout_key, steps):
  """(state, seconds, loss per member) of `steps` steps; as train/step.py's `_time_round`, but a sweep's loss is
  one per member."""
  start = time.perf_counter()
  for i in range(steps):
    state, metrics = step(state, batches[i % len(batches)], dropout_key)
  jax.block_until_ready((state, metrics))
  return state, time.perf_counter() - start, np.atleast_1d(np.asarray(metrics["loss"], np.float64))


def _contestants(dtype: str, members: int) -> tuple[dict, BertConfig]:
  """{name: dict(step, state, key, members, batches)} of bert_jax (one run, a sweep) and transformers at `dtype`
  (the batches placed on bert_jax's one-device mesh; a sweep's with a leading member axis, every member the same
  rows) and the model config."""
  config, model_cfg = make_config(_PRESET.value, dtype, _BATCH.value, _SEQ.value)
  one_step, one_state, one_keys, mesh = bert_jax_contestant(config, model_cfg, _NUM_LABELS.value, 1)
  rng = np.random.default_rng(0)
  host_batches = [
    synthetic_batch(rng, _BATCH.value, _SEQ.value, _NUM_LABELS.value, model_cfg.vocab_size) for _ in range(2)
  ]

  def of_members(count: int) -> list[dict]:
    stacked = [{name: np.stack([value] * count) for name, value in batch.items()} for batch in host_batches]
    return [sharding.global_batch(batch, mesh, members=True) for batch in stacked]

  contestants = {
    f"bert_jax {dtype}": dict(step=one_step, state=one_state, key=one_keys, members=1, batches=of_members(1))
  }
  if members > 1:
    step, state, keys, _ = bert_jax_contestant(config, model_cfg, _NUM_LABELS.value, members)
    contestants[f"bert_jax x{members} {dtype}"] = dict(
      step=step, state=state, key=keys, members=members, batches=of_members(members)
    )
  step, state, key = transformers_contestant(config, model_cfg, _NUM_LABELS.value, mesh)
  batches = [sharding.global_batch(batch, mesh) for batch in host_batches]
  contestants[f"transformers {dtype}"] = dict(step=step, state=state, key=key, members=1, batches=batches)
  return contestants, model_cfg


def _markdown(results: dict, members: int, flops: float, header: str) -> str:
  """The table of docs/benchmarks.md: one row per contestant, the speedups in the last two columns."""
  lines = [
    header,
    "",
    "| dtype | contestant | s/step | examples/s | tokens/s | model TFLOP/s | compile + 1st step "
    "| vs transformers | vs one-runs in sequence |",
    "|---|---|---:|---:|---:|---:|---:|---:|---:|",
  ]
  for dtype in _DTYPES.value:
    reference = results[f"transformers {dtype}"]["seconds"]
    one_run = results[f"bert_jax {dtype}"]["seconds"]
    names = [f"transformers {dtype}", f"bert_jax {dtype}"] + ([f"bert_jax x{members} {dtype}"] if members > 1 else [])
    for name in names:
      result = results[name]
      seconds, count = result["seconds"], result["members"]
      if name.startswith("transformers"):
        label, sequence = "transformers", "-"
      elif count == 1:
        label, sequence = "bert_jax, one run", "-"
      else:
        label, sequence = f"bert_jax, sweep of {count}", f"{count * one_run / seconds:.2f}x"
      lines.append(
        f"| {dtype} | {label} | {seconds:.4f} | {count * _BATCH.value / seconds:,.0f} "
        f"| {count * _BATCH.value * _SEQ.value / seconds:,.0f} | {count * flops / seconds / 1e12:.3g} "
        f"| {result['compile_s']:.1f} s | {count * reference / seconds:.2f}x | {sequence} |"
      )
  return "\n".join(lines)


def _compile(contestants: dict) -> None:
  """Compiles each step (XLA's FLOP count) and takes its first step; records both in the contestant's entry."""
  for name, entry in contestants.items():
    start = time.perf_counter()
    cost = entry["step"].lower(entry["state"], entry["batches"][0], entry["key"]).compile().cost_analysis()
    entry["xla_flops"] = float(cost.get("flops", float("nan"))) if cost else float("nan")
    entry["state"], _, loss = time_round(entry["step"], entry["state"], entry["batches"], entry["key"], 1)
    entry["compile_s"] = time.perf_counter() - start
    print(f"first step: {name:24s} loss {' '.join(f'{x:.4f}' for x in loss)}", flush=True)


def _best_seconds_per_step(contestants: dict) -> dict:
  """{name: the best round's s/step}; rounds alternate, so machine noise hits every contestant alike."""
  best = dict.fromkeys(contestants, float("inf"))
  for round_index in range(_ROUNDS.value):
    for name, entry in contestants.items():
      entry["state"], seconds, loss = time_round(
        entry["step"], entry["state"], entry["batches"], entry["key"], _STEPS.value
      )
      best[name] = min(best[name], seconds / _STEPS.value)
      print(
        f"round {round_index}: {name:24s} {seconds / _STEPS.value:.4f} s/step  "
        f"loss {' '.join(f'{x:.4f}' for x in loss)}",
        flush=True,
      )
  return best


def main(argv):
  del argv
  batch, seq, members = _BATCH.value, _SEQ.value, _MEMBERS.value
  if members < 1 or _NUM_LABELS.value < 2:
    raise ValueError(f"--members={members} must be at least 1 and --num_labels={_NUM_LABELS.value} at least 2.")
  contestants = {}
  for dtype in _DTYPES.value:
    of_dtype, model_cfg = _contestants(dtype, members)
    contestants.update({name: dict(entry, dtype=dtype) for name, entry in of_dtype.items()})
  flops = flops_lib.train_flops_per_step(model_cfg, batch, seq, 0)  # One member's step.
  peak = flops_lib.peak_flops_per_device(jax.devices()[0].device_kind, _PEAK_TFLOPS.value)
  print(f"Losses start near ln({_NUM_LABELS.value}) = {math.log(_NUM_LABELS.value):.3f} (random labels).")
  _compile(contestants)
  best = _best_seconds_per_step(contestants)

  header = (
    f"{jax.devices()[0].device_kind} x1, JAX {jax.__version__}, transformers {metadata.version('transformers')}; "
    f"fine-tuning step, classification ({_NUM_LABELS.value} labels), preset {_PRESET.value}, batch {batch}, "
    f"seq {seq}; best of {_ROUNDS.value} rounds x {_STEPS.value} steps; a sweep's examples and tokens count "
    "every member's"
  )
  print(f"\n{header}")
  for name, entry in contestants.items():
    count = entry["members"]
    mfu = f"  MFU {100 * count * flops / best[name] / peak:5.1f}%" if peak else ""
    print(
      f"{name:24s} {count * batch / best[name]:10,.1f} examples/s {count * batch * seq / best[name]:12,.0f} tokens/s"
      f"  {best[name]:.4f} s/step  model {count * flops / best[name] / 1e9:9.1f} GFLOP/s{mfu}  "
      f"XLA-counted {entry['xla_flops'] / 1e9:8.2f} GFLOP/step  compile+first step {entry['compile_s']:.1f} s"
    )
  print(f"analytic model FLOPs per step of one member: {flops / 1e9:.2f} GFLOP")
  for dtype in _DTYPES.value:
    reference, one_run = best[f"transformers {dtype}"], best[f"bert_jax {dtype}"]
    print(f"{dtype}: one run, throughput bert_jax / transformers: {reference / one_run:.3f}x")
    if members > 1:
      sweep = best[f"bert_jax x{members} {dtype}"]
      print(
        f"{dtype}: sweep of {members} in one program {sweep:.4f} s/step vs {members} x one run "
        f"{members * one_run:.4f} s ({members * one_run / sweep:.2f}x) vs {members} x transformers "
        f"{members * reference:.4f} s ({members * reference / sweep:.2f}x)"
      )
  results = {
    name: dict(seconds=best[name], members=entry["members"], compile_s=entry["compile_s"])
    for name, entry in contestants.items()
  }
  print("\n" + _markdown(results, members, flops, header))


if __name__ == "__main__":
  app.run(main)
