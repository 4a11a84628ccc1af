"""How to run the configured job on a TPU slice: the remat policy with the least recomputation that fits the config's
batch, and (on request) the largest per-chip batch that fits for each policy. Searches over ahead-of-time compiles
(as MaxText's batch-size estimator does), since only XLA's TPU compiler knows the TPU's buffers.

    python -m bert_jax.main --config=configs/large_phase2.py --workdir=/tmp/plan --mode=plan \\
        --config.dry_run.topology=v6e-16

**The config's batch** (always): the policies of `dry_run.plan_remat`, in order of the recomputation they cost
(model/remat.py: none, save_dots, save_dense, save_qkv, full by default), are compiled at the config's
`batch_size` until one fits (the compiler accepts it and its peak is under the usable HBM); that one is chosen.
Each policy is tried at the config's `num_microbatches`, then at twice as many, ... before the next policy:
microbatches recompute nothing (the same update from sequential slices of the batch), as long as a microbatch keeps
`dry_run.plan_min_microbatch_tokens` tokens a chip for its matmuls. When nothing fits so, the smaller microbatches
are tried, every policy at each, down to a row per chip. The answer is printed as the flags that give it.

**The largest batch** (`dry_run.plan_largest=True`): for each policy, the per-chip batch doubles from
`dry_run.plan_batch_step` while the train step fits, then a bisection over multiples of `plan_batch_step` finds the
largest that fits, up to `dry_run.plan_max_batch`. Once two compiles have named their peaks, the batch tried next is
where the line through them meets the usable HBM (a step's peak grows about linearly with its batch), then the one
above it: four compiles where doubling and bisection take ten or more.

Everything else is the config's: mesh, sequence length, dtype, attention kernel, layer layout, job (pretraining or
fine-tuning). Every policy is applied to scanned and unrolled layers alike; a scan's peak is still higher than the
unrolled program's (BERT-Base at 512 tokens, remat none, XLA's peak: 1.19x at 16 rows a chip, 1.17x at 32; about 28
MiB a row and 40 MiB a layer more: docs/tpu.md, "Where the memory goes"), so a plan made with scanned layers, which
compile faster, holds for unrolled ones too; an unrolled step may hold a few more rows than the plan says.
"""

import dataclasses
import math
import time

from absl import logging

from bert_jax import console, sharding
from bert_jax.dry_run import ahead_of_time
from bert_jax.finetune import embeddings


@dataclasses.dataclass(frozen=True)
class Target:
  """What every trial of a plan shares: the devices and their usable HBM (None: no limit known), and, from the job
  described once at the config's batch (`target`), the mesh's data-parallel size and the tokens a row holds; what the
  front door's check found of the job (`ahead_of_time.Found`)."""

  devices: list
  usable: int | None
  data_parallel: int
  row_tokens: int
  found: ahead_of_time.Found = ahead_of_time.UNCHECKED


def target(config, devices, usable: int | None, found=ahead_of_time.UNCHECKED) -> Target:
  """The trials' `Target`, read off the configured job (described, not compiled) on `devices`."""
  job = ahead_of_time.make_job(config, devices, found=found)
  rows = config.batch_size * max(job.run.members, 1)
  return Target(devices, usable, sharding.data_parallel_size(job.run.mesh), job.spec.tokens_per_step // rows, found)


def _compile(config, to: Target, per_chip: int, remat: str, microbatches: int) -> dict:
  """The train step's report (ahead_of_time.compile_step) at `per_chip` rows per chip under `remat`, with the tokens
  a step of that job reads (its spec's: every sweep member's)."""
  trial = config.copy_and_resolve_references()
  trial.batch_size = per_chip * to.data_parallel
  trial.num_microbatches = microbatches
  trial.model.remat = remat
  model = None if to.found.model is None else dataclasses.replace(to.found.model, remat=remat)
  job = ahead_of_time.make_job(trial, to.devices, found=dataclasses.replace(to.found, model=model))
  step = ahead_of_time.compile_step(job.run.train_step, job.train_args, to.usable)
  logging.info(
    "  remat %-13s per-chip batch %5d, %d microbatch(es): %s (peak %s; %.1f s)",
    remat,
    per_chip,
    microbatches,
    "fits" if step["fits"] else "does not fit",
    ahead_of_time.gib(step["peak_bytes"]),
    step["compile_seconds"],
  )
  return dict(step, tokens_per_step=job.spec.tokens_per_step)


def candidates(config, per_chip: int, row_tokens: int) -> list[tuple[str, int]]:
  """(remat, microbatches) in the order `choose` tries them. Microbatches recompute nothing (the same update from
  sequential slices of the batch), so each policy is tried at the config's microbatches and at twice as many, ...,
  before the next policy, while a microbatch keeps at least `dry_run.plan_min_microbatch_tokens` tokens a chip (below
  that its matmuls read the weights for too few tokens, and the next policy's recomputation costs less). Then, for
  a batch that nothing fits so, the smaller microbatches, every policy at each, down to a row per chip. The embeddings
  task's batch stays whole: its loss's negatives are every document of the batch (no gradient caching)."""
  counts = [config.num_microbatches]
  whole = config.finetune.task == embeddings.NAME
  while not whole and per_chip % (2 * counts[-1]) == 0:
    counts.append(2 * counts[-1])
  minimum = config.dry_run.plan_min_microbatch_tokens
  roomy = [m for m in counts if per_chip // m * row_tokens >= minimum] or counts[:1]
  tight = counts[len(roomy) :]
  policies = config.dry_run.plan_remat
  return [(remat, m) for remat in policies for m in roomy] + [(remat, m) for m in tight for remat in policies]


def choose(config, to: Target) -> tuple[dict | None, list[dict]]:
  """(the first try that fits the config's batch, or None; every try), in `candidates`' order: the least
  recomputation first, then the fewest microbatches. A try is dict(remat, microbatches, per_chip_batch, step)."""
  per_chip, remainder = divmod(config.batch_size, to.data_parallel)
  if remainder or not per_chip or per_chip % config.num_microbatches:
    raise ValueError(
      f"batch_size={config.batch_size} must be a positive multiple of the mesh's data-parallel size "
      f"{to.data_parallel} on {config.dry_run.topology} times num_microbatches={config.num_microbatches}."
    )
  tries = []
  for remat, microbatches in candidates(config, per_chip, to.row_tokens):
    step = _compile(config, to, per_chip, remat, microbatches)
    tries.append(dict(remat=remat, microbatches=microbatches, per_chip_batch=per_chip, step=step))
    if step["fits"]:
      return tries[-1], tries
  return None, tries


def largest_batch(config, to: Target, remat: str, start: int = 0) -> tuple[int, dict | None, list]:
  """(largest per-chip batch that fits (0: none), its step report, every (batch, step) tried). The doubling
  starts at `start` when that fits (a policy that keeps less than one already planned fits at least its batch)."""

  def compile_at(per_chip: int) -> dict:
    return _compile(config, to, per_chip, remat, 1)

  return search(compile_at, config.dry_run.plan_batch_step, config.dry_run.plan_max_batch, start)


# Probes placed by the peaks' line before a search falls back to bisection alone.
_GUIDED_PROBES = 4


def _predicted(peaks: dict, usable: int | None, low: int, high: int) -> int | None:
  """The largest batch (in units) under `usable` by the line through the two peaks nearest it (peak memory grows
  about linearly with the batch), kept strictly between `low` and `high`; None without two peaks and a limit."""
  if not usable or len(peaks) < 2:
    return None
  near = sorted(peaks, key=lambda units: abs(peaks[units] - usable))[:2]
  slope = (peaks[near[1]] - peaks[near[0]]) / (near[1] - near[0])
  if slope <= 0:
    return None
  guess = near[0] + math.floor((usable - peaks[near[0]]) / slope)
  return min(max(guess, low + 1), high - 1)


def search(compile_at, step: int, most: int, start: int = 0) -> tuple[int, dict | None, list]:
  """The largest multiple of `step` up to `most` at which `compile_at(batch)` (a step report with "fits") fits:
  doubling from `step` (or from `start`, when that fits), then bisection. Once two reports name their peak and the
  usable HBM, the next batch tried is where the line through the two peaks nearest the limit meets it, and the one
  after it; a peak that bends moves the line, and after a few such probes bisection alone finishes. Returns (batch
  (0: none fits), its report, every (batch, report) tried)."""
  tries, peaks = [], {}
  usable, guided = None, 0

  def fits(units: int) -> bool:
    nonlocal usable
    report = compile_at(units * step)
    tries.append((units * step, report))
    if report.get("peak_bytes"):
      peaks[units] = report["peak_bytes"]
    usable = report.get("usable_bytes") or usable
    return report["fits"]

  def next_units(fallback: int, low: int, high: int) -> int:
    nonlocal guided
    guess = _predicted(peaks, usable, low, high) if guided < _GUIDED_PROBES else None
    guided += guess is not None
    return fallback if guess is None else guess

  # In units of `step`: the largest known to fit and the smallest known not to (or one past the range).
  low, high, top = 0, None, most // step
  units = 1
  if 1 < start // step <= top and fits(start // step):
    low, units = start // step, 2 * (start // step)
  while units <= top:
    units = next_units(units, low, top + 1)
    if not fits(units):
      high = units
      break
    low, units = units, units * 2
  if high is None:
    high = top + 1
  while high - low > 1:
    middle = next_units((low + high) // 2, low, high)
    if fits(middle):
      low = middle
    else:
      high = middle
  low *= step
  best = next((report for batch, report in tries if batch == low), None)
  return low, best, tries


def plan(config, model_cfg=None, members=None) -> dict:
  """`--mode=plan`: dict(choice=the try `choose` settled on (None: nothing fits), tries=its tries, rows=one row per
  remat policy of `dry_run.plan_remat` with the largest per-chip batch, its tokens per step, peak bytes per chip and
  the compiles it took (empty unless `dry_run.plan_largest`)). `model_cfg` and `members`: what the front door's check
  found (`jobs.run` calls this; None: made from the config, unchecked)."""
  if not config.dry_run.topology:
    raise ValueError("--mode=plan needs --config.dry_run.topology (e.g. v5e-8): it compiles for a TPU slice.")
  step, most = config.dry_run.plan_batch_step, config.dry_run.plan_max_batch
  if step < 1 or step & (step - 1) or most < step:
    raise ValueError(
      f"dry_run.plan_batch_step={step} must be a power of two and dry_run.plan_max_batch={most} at least as large."
    )
  devices, where = ahead_of_time.target_devices(config)
  usable = ahead_of_time.usable_hbm(devices)
  to = target(config, devices, usable, ahead_of_time.Found(model_cfg, members))
  logging.info("Planning for %s: usable HBM %s per chip.", where, ahead_of_time.gib(usable))
  choice, tries = choose(config, to)
  logging.info("%s", format_choice(choice, tries, where, config))
  rows = []
  batch = 0
  for remat in config.dry_run.plan_remat if config.dry_run.plan_largest else ():
    start = time.perf_counter()
    # Each policy's search starts from the batch the one before fitted, once a compile confirms it fits here too.
    batch, report, tries = largest_batch(config, to, remat, start=batch)
    rows.append(
      dict(
        remat=remat,
        per_chip_batch=batch,
        global_batch=batch * to.data_parallel,
        tokens_per_step=report["tokens_per_step"] if report else 0,
        peak_bytes=report["peak_bytes"] if report else None,
        usable_bytes=usable,
        compiles=len(tries),
        seconds=time.perf_counter() - start,
        capped=batch >= most // step * step,
      )
    )
  if rows:
    logging.info("%s", format_plan(rows, where, config))
  return dict(choice=choice, tries=tries, rows=rows)


def format_choice(choice: dict | None, tries: list[dict], target: str, config) -> str:
  """The tries at the config's batch and the flags of the one chosen."""
  lines = [f"{'remat':14s}  {'microbatches':>12s}  {'peak':>10s}  {'fits':>4s}  {'XLA FLOPs/chip':>14s}  compile"]
  for tried in tries:
    step = tried["step"]
    flops = step.get("xla_flops_per_device")
    lines.append(
      f"{tried['remat']:14s}  {tried['microbatches']:>12d}  {ahead_of_time.gib(step['peak_bytes']):>10s}  "
      f"{'yes' if step['fits'] else 'no':>4s}  {'-' if flops is None else f'{flops:.3g}':>14s}  "
      f"{step['compile_seconds']:.0f} s"
    )
  per_chip = tries[0]["per_chip_batch"] if tries else 0
  if choice is None:
    verdict = "nothing fits: a smaller batch per chip, FSDP (--config.mesh.fsdp) or a larger slice"
  else:
    flags = f"--config.model.remat={choice['remat']}"
    if choice["microbatches"] != config.num_microbatches:
      flags += f" --config.num_microbatches={choice['microbatches']}"
    peak, host = ahead_of_time.gib(choice["step"]["peak_bytes"]), ahead_of_time.in_host_memory(choice["step"])
    verdict = f"{flags} (the least recomputation that fits; peak {peak}{f', and {host}' if host else ''})"
  rows = [("", line) for line in lines] + [("chosen", verdict)]
  loops = ["scanned layers"] * bool(config.model.scan_layers)
  loops += ["microbatches"] * any(tried["microbatches"] > 1 for tried in tries)
  scanned = f" (XLA counts a loop's body once: {' and '.join(loops)} once)" if loops else ""
  return console.block(
    f"Plan for {target}: batch {config.batch_size} ({per_chip} rows per chip); remat policies in order of "
    f"recomputation{scanned}",
    rows,
  )


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
