"""Parameters recorded from runs of the code before a change, to show the change left behaviour alone.

`check(name, params)` compares params bitwise with `tests/golden/behaviour/<name>.npz`. With
`BERT_JAX_RECORD_GOLDEN=1` it writes that file instead (then the test fails, so that a recording never passes
as a check). Recorded on this project's CI machine; XLA's CPU code can differ in the last bit on another CPU.
"""

import os

import numpy as np
from flax import traverse_util

DIRECTORY = os.path.join(os.path.dirname(__file__), "golden", "behaviour")


def check(name: str, params) -> None:
  flat = {"/".join(map(str, k)): np.asarray(v) for k, v in traverse_util.flatten_dict(params).items()}
  path = os.path.join(DIRECTORY, f"{name}.npz")
  if os.environ.get("BERT_JAX_RECORD_GOLDEN") == "1":
    np.savez_compressed(path, **flat)
    raise AssertionError(f"recorded {path}; run again without BERT_JAX_RECORD_GOLDEN to check it")
  expected = np.load(path)
  assert sorted(flat) == sorted(expected.files), (sorted(flat), sorted(expected.files))
  for key, value in flat.items():
    np.testing.assert_array_equal(value, expected[key], err_msg=f"{name}: {key}")
