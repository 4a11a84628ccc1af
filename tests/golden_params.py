"""Parameters recorded from runs of the code before a change, to show the change left behaviour alone.

`check(name, params)` compares params with the recordings `tests/golden/behaviour/<name>.<cpu>.npz`, one per kind of
CPU (`cpu_kind()`: XLA compiles for the host CPU's instruction set, and the same program can differ in the last bit
on another). Each recording stores the numerics it was made under (`NUMERICS`, its `__numerics__` entry): a
number bumped by every change that moves the float results (a new fusion, a recomputation, a cast), at which the
recordings are made again on the kinds at hand. How and when: docs/testing.md ("Golden files").

- This CPU kind's recording is of today's numerics: bitwise equal, or it fails.
- This CPU kind has none, or only one of older numerics (made before a change that moved the numbers, and not
  refreshed on that kind since): bitwise is not defined, so it passes within CPU_TOLERANCE of a recording of today's
  numerics from another kind, and warns saying so (a real change of behaviour, such as another dropout mask, data
  order or initialisation, moves parameters by far more).
- `BERT_JAX_RECORD_GOLDEN=1` writes this CPU kind's recording of today's numerics instead; the test then fails, so
  that a recording never passes as a check. Record at a commit whose behaviour is the one to keep.
"""

import glob
import hashlib
import os
import re
import warnings

import numpy as np
from flax import traverse_util

DIRECTORY = os.path.join(os.path.dirname(__file__), "golden", "behaviour")
# Bumped by each change that moves the float results, with the recordings made again (docs/benchmarks.md, "Golden
# re-recordings"). 1: the recordings of 2026-12-02 (main at df30a14: the step guard's recomputation behind an
# optimization barrier, the scanned kernels cast to bfloat16 outside the loop).
NUMERICS = 1
_KEY = "__numerics__"  # A recording's numerics; one without it predates them (0).
CPU_TOLERANCE = dict(rtol=1e-4, atol=1e-5)
# The instruction-set extensions XLA's CPU compiler may use: what makes two CPUs compile one program differently.
_ISA = re.compile(r"^(avx|amx|fma|f16c|sse|ssse|bmi|adx|vnni|vpclmul|vaes|gfni|sha_ni)")


def cpu_kind() -> str:
  """A short name for this CPU's instruction-set extensions (the `flags` line of /proc/cpuinfo), or "unknown"."""
  try:
    with open("/proc/cpuinfo") as cpuinfo:
      flags = next(line for line in cpuinfo if line.startswith("flags")).split(":", 1)[1].split()
  except (OSError, StopIteration):
    return "unknown"
  extensions = sorted(flag for flag in flags if _ISA.match(flag))
  return hashlib.sha256(" ".join(extensions).encode()).hexdigest()[:10]


def _flat(params) -> dict[str, np.ndarray]:
  return {"/".join(map(str, k)): np.asarray(v) for k, v in traverse_util.flatten_dict(params).items()}


def _load(path: str) -> tuple[int, dict[str, np.ndarray]]:
  """A recording: its numerics (0 if it predates them) and its parameters."""
  with np.load(path) as recording:
    arrays = {key: recording[key] for key in recording.files}
  return int(arrays.pop(_KEY, 0)), arrays


def _mismatch(flat: dict, expected: dict) -> str | None:
  """None if `flat` equals the recording `expected` bitwise, else the first difference."""
  if sorted(flat) != sorted(expected):
    return f"parameter names {sorted(flat)} vs {sorted(expected)}"
  for key, value in flat.items():
    if not np.array_equal(value, expected[key]):
      return f"{key}: max |difference| {np.max(np.abs(value - expected[key])):.3g}"
  return None


def check(name: str, params) -> None:
  flat, kind = _flat(params), cpu_kind()
  own = os.path.join(DIRECTORY, f"{name}.{kind}.npz")
  if os.environ.get("BERT_JAX_RECORD_GOLDEN") == "1":
    np.savez_compressed(own, **flat, **{_KEY: np.int64(NUMERICS)})
    raise AssertionError(f"recorded {own} (numerics {NUMERICS}); run again without BERT_JAX_RECORD_GOLDEN to check it")
  recordings = {path: _load(path) for path in sorted(glob.glob(os.path.join(DIRECTORY, f"{name}.*.npz")))}
  if own in recordings and recordings[own][0] == NUMERICS:
    if (mismatch := _mismatch(flat, recordings[own][1])) is not None:
      raise AssertionError(f"{name} differs from this CPU kind's recording ({kind}, numerics {NUMERICS}): {mismatch}")
    return
  current = [path for path, (numerics, _) in recordings.items() if numerics == NUMERICS]
  if not current:
    raise AssertionError(
      f"{name}: no recording of numerics {NUMERICS} on any CPU kind; record one with BERT_JAX_RECORD_GOLDEN=1 at a "
      "known-good commit."
    )
  reference = recordings[current[0]][1]
  assert sorted(flat) == sorted(reference), f"{name}: parameter names {sorted(flat)} vs {sorted(reference)}"
  for key, value in flat.items():
    np.testing.assert_allclose(value, reference[key], **CPU_TOLERANCE, err_msg=f"{name}: {key}")
  why = f"its recording is of numerics {recordings[own][0]}" if own in recordings else "it has no recording"
  warnings.warn(
    f"{name}: not bitwise on this CPU kind ({kind}): {why}, today's are {NUMERICS}; within {CPU_TOLERANCE} of "
    f"{os.path.basename(current[0])}. Record one with BERT_JAX_RECORD_GOLDEN=1 at a known-good commit.",
    stacklevel=2,
  )
