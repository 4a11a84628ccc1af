"""Parameters recorded from runs of the code before a change, to show the change left behaviour alone.

`check(name, params)` compares params bitwise with the recordings `tests/golden/behaviour/<name>*.npz`: one per
kind of CPU it was recorded on, since XLA compiles for the host CPU's instruction set and the same program can
differ in the last bit on another (seen here: a CPU with AVX-512 FP16 and AMX against the first recording's, at
most 8e-8 apart after the pretraining run and 4e-6 after the fine-tuning sweep's 4 epochs). `<name>.npz` is the
first recording (2026-11-25, the CI machine of its day, whose CPU was not noted); `<name>.<cpu>.npz` one made on
the CPU kind `cpu_kind()` names. When they were recorded again, why, and by how much: docs/benchmarks.md
("Golden re-recordings").

- Bitwise equal to the recording of this CPU kind (or, without one, to any recording): passes.
- A CPU kind with no recording of its own: bitwise is not defined there, so it passes within CPU_TOLERANCE of the
  nearest recording, and says so (a real change of behaviour, such as another dropout mask, data order or
  initialisation, moves parameters by far more).
- `BERT_JAX_RECORD_GOLDEN=1` writes this CPU kind's recording instead; the test then fails, so that a recording
  never passes as a check. Record at a commit whose behaviour is the one to keep.
"""

import glob
import hashlib
import os
import re
import warnings

import numpy as np
from flax import traverse_util

DIRECTORY = os.path.join(os.path.dirname(__file__), "golden", "behaviour")
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


def _mismatch(flat: dict, expected) -> str | None:
  """None if `flat` equals the recording `expected` bitwise, else the first difference."""
  if sorted(flat) != sorted(expected.files):
    return f"parameter names {sorted(flat)} vs {sorted(expected.files)}"
  for key, value in flat.items():
    if not np.array_equal(value, expected[key]):
      return f"{key}: max |difference| {np.max(np.abs(value - expected[key])):.3g}"
  return None


def check(name: str, params) -> None:
  flat, kind = _flat(params), cpu_kind()
  own = os.path.join(DIRECTORY, f"{name}.{kind}.npz")
  if os.environ.get("BERT_JAX_RECORD_GOLDEN") == "1":
    np.savez_compressed(own, **flat)
    raise AssertionError(f"recorded {own}; run again without BERT_JAX_RECORD_GOLDEN to check it")
  recordings = [own] if os.path.exists(own) else sorted(glob.glob(os.path.join(DIRECTORY, f"{name}*.npz")))
  mismatches = {path: _mismatch(flat, np.load(path)) for path in recordings}
  if None in mismatches.values():
    return
  if not os.path.exists(own):
    nearest = np.load(recordings[0])
    if sorted(flat) == sorted(nearest.files):
      for key, value in flat.items():
        np.testing.assert_allclose(value, nearest[key], **CPU_TOLERANCE, err_msg=f"{name}: {key}")
      warnings.warn(
        f"{name}: no recording for this CPU kind ({kind}), so not bitwise: within {CPU_TOLERANCE} of "
        f"{os.path.basename(recordings[0])}. Record one with BERT_JAX_RECORD_GOLDEN=1 at a known-good commit.",
        stacklevel=2,
      )
      return
  raise AssertionError(f"{name} differs from its recordings (CPU kind {kind}): {mismatches}")
