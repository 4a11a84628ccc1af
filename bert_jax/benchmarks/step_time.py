"""Train-step throughput of bert_jax against Hugging Face's `FlaxBertForPreTraining`, in one process.

    pip install -e '.[test]'   # transformers is the reference, not a dependency of bert_jax
    python -m bert_jax.benchmarks.step_time --preset=base --batch_size=8 --seq=128 --dtypes=float32,bfloat16

Both sides get the same config, the same random initialisation scheme, the same optimizer (bert_jax's AdamW
with BERT's decay mask, warmup and clipping), the same synthetic batches and the same dropout key, and both
steps are jitted with the state donated. The reference computes MLM logits at every position (as its
`FlaxBertForPreTraining` does) and the loss gathers the masked positions; bert_jax gathers first. Rounds
alternate between the two so that machine noise hits both alike. Reports tokens/s, the ratio, and model
FLOP/s (analytic count of the useful work, and XLA's own count of the compiled step) beside the FLOP/s of a plain
XLA matmul of the encoder's two shapes measured in the same run: how close each step gets to the matmul ceiling.
"""

import collections
import functools
import glob
import gzip
import json
import os
import re
import time

import jax
import jax.numpy as jnp
from absl import app, flags

from bert_jax import flops as flops_lib
from bert_jax import jobs, sharding
from bert_jax.benchmarks.reference import hf_pretraining_loss, hf_train_step
from bert_jax.data.synthetic import SyntheticSource
from bert_jax.handoff.hf_configs import hf_config
from bert_jax.model.bert_config import preset
from bert_jax.train import pretraining
from configs import default

_PRESET = flags.DEFINE_string("preset", "base", "Model size preset (bert_jax.model.bert_config.PRESETS).")
_BATCH = flags.DEFINE_integer("batch_size", 8, "Global batch size.")
_SEQ = flags.DEFINE_integer("seq", 128, "Sequence length.")
_PREDICTIONS = flags.DEFINE_integer("max_predictions", 20, "Masked positions per sequence.")
_DTYPES = flags.DEFINE_list("dtypes", ["float32", "bfloat16"], "Compute dtypes, each run against the reference.")
_PEAK_TFLOPS = flags.DEFINE_float("peak_tflops", 0.0, "Peak TFLOP/s of the device for MFU (0: from flops.py).")
_STEPS = flags.DEFINE_integer("steps", 3, "Timed steps per round.")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Alternating rounds (the best round of each side counts).")
_PROFILE = flags.DEFINE_string(
  "profile_dir",
  "",
  "Also trace two steps of each contestant here (jax.profiler) and print where each step's time goes.",
)


def _matmul_flops_per_second(m: int, k: int, n: int, dtype: str, repeats: int = 20) -> float:
  """FLOP/s of one jitted XLA matmul [m, k] x [k, n] on the first device: the ceiling the model's own matmuls have."""
  a, b = (jnp.ones(shape, dtype) for shape in ((m, k), (k, n)))
  matmul = jax.jit(jnp.matmul)
  jax.block_until_ready(matmul(a, b))
  best = float("inf")
  for _ in range(3):
    start = time.perf_counter()
    for _ in range(repeats):
      out = matmul(a, b)
    jax.block_until_ready(out)
    best = min(best, (time.perf_counter() - start) / repeats)
  return 2 * m * k * n / best


def _profile(name: str, step, state, batches, dropout_key, directory: str) -> None:
  """Traces two steps and prints the time per step of each part of the model: XLA's operations, by the JAX
  operation (layer numbers merged) that each one's metadata names."""
  hlo = step.lower(state, batches[0], dropout_key).compile().as_text()
  op_names = dict(re.findall(r"^\s*(?:ROOT )?%?([\w.\-]+) = [^\n]*?op_name=\"([^\"]*)\"", hlo, re.M))
  directory = os.path.join(directory, name.replace(" ", "_"))
  with jax.profiler.trace(directory, create_perfetto_trace=True):
    jax.block_until_ready(_time_round(step, state, batches, dropout_key, 2)[0])
  (path,) = glob.glob(os.path.join(directory, "**", "*.trace.json.gz"), recursive=True)
  trace = json.load(gzip.open(path))
  parts, kinds = collections.Counter(), collections.defaultdict(collections.Counter)
  for event in trace["traceEvents"] if isinstance(trace, dict) else trace:
    if event.get("ph") != "X" or event["name"].startswith(("ThunkExecutor", "$", "Slinky", "PjitFunction")):
      continue
    part = re.sub(r"layer([_/])\d+", r"layer\1N", op_names.get(event["name"], "(no metadata)"))
    part = re.sub(r"\(jvp\((\w+)\)\)", r"(\1)", re.sub(r"^jit\((wrapped|hf_train_step)\)/", "", part))
    parts[part] += event.get("dur", 0) / 2e6
    kinds[part][re.sub(r"[._]\d+$", "", event["name"])] += 1
  total = sum(parts.values())
  print(f"\n{name}: {total:.3f} s per step in XLA operations (trace in {directory})")
  for part, seconds in parts.most_common(30):
    kind = ", ".join(kinds[part])
    print(f"  {seconds * 1000:7.1f} ms {100 * seconds / total:5.1f}%  {part[:100]}  [{kind[:40]}]")


def _time_round(step, state, batches, dropout_key, steps):
  start = time.perf_counter()
  for i in range(steps):
    state, metrics = step(state, batches[i % len(batches)], dropout_key)
  jax.block_until_ready((state, metrics))
  return state, time.perf_counter() - start, float(metrics["loss"])


def _contestants(dtype: str, mesh, batches, dropout_key) -> dict:
  """{name: (jitted step, initial state, model config)} of bert_jax and transformers at `dtype`."""
  from transformers import BertConfig as HFBertConfig
  from transformers import FlaxBertForPreTraining

  config = default.get_config()
  config.model.update(preset(_PRESET.value), dtype=dtype)
  config.update(batch_size=_BATCH.value, num_train_steps=10_000, warmup_steps=100)
  config.data.update(source="synthetic", max_seq_length=_SEQ.value, max_predictions_per_seq=_PREDICTIONS.value)
  config.mesh.update(data=1, fsdp=1, tensor=1)
  model_cfg = jobs.check(config, "pretrain").model
  run = pretraining.make_run(config, mesh.devices.flat)
  tx = run.tx
  ours_state, ours_step = run.init_state(0), run.train_step

  # The reference, built from the same config with random weights (no download).
  hf_model = FlaxBertForPreTraining(HFBertConfig(**hf_config(model_cfg)), seed=0, dtype=jnp.dtype(dtype), _do_init=True)
  hf_params = jax.tree.map(jnp.asarray, hf_model.params)
  # Placed where the step returns it (with the batches), so that the second step does not compile again.
  hf_state = jax.device_put((hf_params, tx.init(hf_params), jnp.zeros((), jnp.int32)), sharding.replicated(mesh))
  hf_step = jax.jit(
    functools.partial(hf_train_step, module=hf_model.module, loss=hf_pretraining_loss, tx=tx), donate_argnums=0
  )
  return {
    f"bert_jax {dtype}": (ours_step, ours_state, model_cfg),
    f"transformers {dtype}": (hf_step, hf_state, model_cfg),
  }


def main(argv):
  del argv
  batch, seq, predictions = _BATCH.value, _SEQ.value, _PREDICTIONS.value
  mesh = sharding.make_mesh(dict(data=-1), jax.devices()[:1])
  source = SyntheticSource(
    seed=0,
    global_batch_size=batch,
    max_seq_length=seq,
    max_predictions_per_seq=predictions,
    vocab_size=default.get_config().model.vocab_size,
  )
  batches = [sharding.global_batch(next(source), mesh) for _ in range(2)]
  dropout_key = jax.random.key(1)

  contestants = {}
  for dtype in _DTYPES.value:
    start = time.perf_counter()
    contestants.update(_contestants(dtype, mesh, batches, dropout_key))
    print(f"{dtype}: both models initialised in {time.perf_counter() - start:.1f} s", flush=True)
  model_cfg = next(iter(contestants.values()))[2]
  flops = flops_lib.train_flops_per_step(model_cfg, batch, seq, predictions)
  peak = flops_lib.peak_flops_per_device(jax.devices()[0].device_kind, _PEAK_TFLOPS.value)

  compiled = {}
  for name, (step, state, _) in contestants.items():
    print(f"{name}: compiling the train step", flush=True)
    start = time.perf_counter()
    cost = step.lower(state, batches[0], dropout_key).compile().cost_analysis()
    compiled[name] = dict(xla_flops=float(cost.get("flops", float("nan"))) if cost else float("nan"))
    state, _, _ = _time_round(step, state, batches, dropout_key, 1)  # Compile and warm up.
    compiled[name].update(compile_s=time.perf_counter() - start, state=state)

  best = dict.fromkeys(contestants, float("inf"))
  for round_index in range(_ROUNDS.value):  # Alternating rounds: machine noise hits every contestant alike.
    for name, (step, _, _) in contestants.items():
      compiled[name]["state"], seconds, loss = _time_round(
        step, compiled[name]["state"], batches, dropout_key, _STEPS.value
      )
      best[name] = min(best[name], seconds / _STEPS.value)
      print(f"round {round_index}: {name:22s} {seconds / _STEPS.value:.3f} s/step  loss {loss:.3f}", flush=True)

  tokens = batch * seq
  # The encoder's two matmul shapes: the feed-forward layer (most of the FLOPs) and the attention projections.
  hidden, intermediate = model_cfg.hidden_size, model_cfg.intermediate_size
  matmuls = {
    dtype: {
      shape: _matmul_flops_per_second(tokens, *shape, dtype) for shape in ((hidden, intermediate), (hidden, hidden))
    }
    for dtype in _DTYPES.value
  }
  print(
    f"\n{jax.devices()[0].device_kind} x1, {jax.__version__=}; {_PRESET.value}, batch {batch}, seq {seq}, "
    f"{predictions} predictions"
  )
  for dtype, rates in matmuls.items():
    print(
      f"XLA {dtype} matmul, measured in this run: "
      + ", ".join(f"[{tokens}x{k}]x[{k}x{n}] {rate / 1e9:.1f} GFLOP/s" for (k, n), rate in rates.items())
    )
  for name in best:
    mfu = f"  MFU {100 * flops / best[name] / peak:5.1f}%" if peak else ""
    ceiling = matmuls[name.split()[-1]][(hidden, intermediate)]
    mfu += f"  {100 * flops / best[name] / ceiling:5.1f}% of the feed-forward matmul's FLOP/s"
    print(
      f"{name:22s} {tokens / best[name]:10,.0f} tokens/s  {best[name]:.3f} s/step  "
      f"model {flops / best[name] / 1e9:8.1f} GFLOP/s{mfu}  XLA-counted {compiled[name]['xla_flops'] / 1e9:8.1f} "
      f"GFLOP/step  compile+first step {compiled[name]['compile_s']:.1f} s"
    )
  print(f"analytic model FLOPs per step: {flops / 1e9:.1f} GFLOP")
  for dtype in _DTYPES.value:
    ratio = best[f"transformers {dtype}"] / best[f"bert_jax {dtype}"]
    print(f"speedup bert_jax / transformers, {dtype}: {ratio:.3f}x")
  if _PROFILE.value:
    for name, (step, _, _) in contestants.items():
      _profile(name, step, compiled[name]["state"], batches, dropout_key, _PROFILE.value)


if __name__ == "__main__":
  app.run(main)
