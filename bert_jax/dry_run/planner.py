"""The largest per-chip batch that fits a TPU slice, for each remat policy: a search over ahead-of-time compiles (as
MaxText's batch-size estimator does), since only XLA's TPU compiler knows the TPU's buffers.

    python -m bert_jax.main --config=configs/large.py --workdir=/tmp/plan --mode=plan \\
        --config.dry_run.topology=v5e-8 --config.model.scan_layers=True

For each policy of `dry_run.plan_remat`, the per-chip batch doubles from `dry_run.plan_batch_step` while the train
step fits (the compiler accepts it and its peak is under the usable HBM), then a bisection over multiples of
`plan_batch_step` finds the largest that fits, up to `dry_run.plan_max_batch`. Everything else is the config's:
mesh, sequence length, dtype, attention kernel, job (pretraining or fine-tuning). Scanned layers compile in a
fraction of the time of unrolled ones and have the same activation memory.
"""

import time

from absl import logging

from bert_jax import console, sharding
from bert_jax.dry_run import ahead_of_time


def _fits(config, devices, per_chip: int, remat: str, usable: int | None, tries: list) -> bool:
  trial = config.copy_and_resolve_references()
  data_parallel = sharding.data_parallel_size(sharding.make_mesh(config.mesh.to_dict(), devices))
  trial.batch_size = per_chip * data_parallel
  trial.num_microbatches = 1
  trial.model.remat = remat
  job = ahead_of_time.make_job(trial, devices)
  step = ahead_of_time.compile_step(job.run.train_step, job.train_args, usable)
  tries.append((per_chip, step))
  logging.info(
    "  remat %-9s per-chip batch %5d: %s (peak %s; %.1f s)",
    remat,
    per_chip,
    "fits" if step["fits"] else "does not fit",
    ahead_of_time.gib(step["peak_bytes"]),
    step["compile_seconds"],
  )
  return step["fits"]


def largest_batch(config, devices, remat: str, usable: int | None, start: int = 0) -> tuple[int, dict | None, list]:
  """(largest per-chip batch that fits (0: none), its step report, every (batch, step) tried). The doubling
  starts at `start` when that fits (a policy that keeps less than one already planned fits at least its batch)."""
  step, most = config.dry_run.plan_batch_step, config.dry_run.plan_max_batch
  tries = []
  fits = lambda units: _fits(config, devices, units * step, remat, usable, tries)
  # In units of `step`: the largest known to fit and the smallest known not to (or one past the range).
  low, high, top = 0, None, most // step
  units = 1
  if 1 < start // step <= top and fits(start // step):
    low, units = start // step, 2 * (start // step)
  while units <= top:
    if not fits(units):
      high = units
      break
    low, units = units, units * 2
  if high is None:
    high = top + 1
  while high - low > 1:
    middle = (low + high) // 2
    if fits(middle):
      low = middle
    else:
      high = middle
  low *= step
  best = next((report for batch, report in tries if batch == low), None)
  return low, best, tries


def plan(config) -> list[dict]:
  """One row per remat policy of `dry_run.plan_remat`: the largest per-chip batch, its tokens per step, peak
  bytes per chip and the compiles it took."""
  if not config.dry_run.topology:
    raise ValueError("--mode=plan needs --config.dry_run.topology (e.g. v5e-8): it compiles for a TPU slice.")
  step, most = config.dry_run.plan_batch_step, config.dry_run.plan_max_batch
  if step < 1 or step & (step - 1) or most < step:
    raise ValueError(
      f"dry_run.plan_batch_step={step} must be a power of two and dry_run.plan_max_batch={most} at least as large."
    )
  devices, target = ahead_of_time.target_devices(config)
  usable = ahead_of_time.usable_hbm(devices)
  seq = config.finetune.max_seq_length if config.finetune.task else config.data.max_seq_length
  data_parallel = sharding.data_parallel_size(sharding.make_mesh(config.mesh.to_dict(), devices))
  logging.info("Planning for %s: usable HBM %s per chip.", target, ahead_of_time.gib(usable))
  rows = []
  batch = 0
  for remat in config.dry_run.plan_remat:
    start = time.perf_counter()
    # Policies from keeping most to keeping least ("none", "save_dots", "full"): each fits what the one before did.
    batch, report, tries = largest_batch(config, devices, remat, usable, start=batch)
    rows.append(
      dict(
        remat=remat,
        per_chip_batch=batch,
        global_batch=batch * data_parallel,
        tokens_per_step=batch * data_parallel * seq,
        peak_bytes=report["peak_bytes"] if report else None,
        usable_bytes=usable,
        compiles=len(tries),
        seconds=time.perf_counter() - start,
        capped=batch >= most // step * step,
      )
    )
  logging.info("%s", format_plan(rows, target, config))
  return rows


def format_plan(rows: list[dict], target: str, config) -> str:
  lines = [
    f"{'remat':10s}  {'per-chip batch':>14s}  {'global batch':>12s}  {'tokens/step':>12s}  {'peak':>10s}  compiles"
  ]
  for row in rows:
    batch = f"{row['per_chip_batch']}{'+' if row['capped'] else ''}" if row["per_chip_batch"] else "none fits"
    lines.append(
      f"{row['remat']:10s}  {batch:>14s}  {row['global_batch']:>12,d}  {row['tokens_per_step']:>12,d}  "
      f"{ahead_of_time.gib(row['peak_bytes']):>10s}  {row['compiles']} in {row['seconds']:.0f} s"
    )
  return console.block(
    f"Plan for {target}: the largest per-chip batch (a multiple of {config.dry_run.plan_batch_step}) that fits",
    [("", line) for line in lines],
  )
