"""The golden check itself (tests/golden_params.py): bitwise where this CPU kind's recording is of today's numerics,
within the tolerance (and saying so) where it is older or missing, never passing with no recording of today's."""

import golden_params
import numpy as np
import pytest


@pytest.fixture
def recordings(tmp_path, monkeypatch):
  """An empty recordings directory, on a CPU kind named "here"; returns a writer of recordings."""
  monkeypatch.setattr(golden_params, "DIRECTORY", str(tmp_path))
  monkeypatch.setattr(golden_params, "cpu_kind", lambda: "here")

  def record(kind: str, value: float, numerics: int | None = golden_params.NUMERICS):
    stamp = {} if numerics is None else {"__numerics__": np.int64(numerics)}
    np.savez(tmp_path / f"run.{kind}.npz", **{"layer/kernel": np.full(3, value, np.float32)}, **stamp)

  return record


def _params(value: float) -> dict:
  return {"layer": {"kernel": np.full(3, value, np.float32)}}


def test_this_kinds_recording_of_todays_numerics_is_bitwise(recordings):
  recordings("here", 1.0)
  recordings("other", 1.0 + 1e-7)
  golden_params.check("run", _params(1.0))
  with pytest.raises(AssertionError, match=r"this CPU kind's recording \(here, numerics .*max \|difference\|"):
    golden_params.check("run", _params(np.nextafter(np.float32(1.0), np.float32(2.0))))


def test_an_older_recording_falls_back_to_the_tolerance_and_says_so(recordings):
  recordings("here", 5.0, numerics=golden_params.NUMERICS - 1)  # Made before a change that moved the numbers.
  recordings("other", 1.0)
  with pytest.warns(UserWarning, match=r"not bitwise on this CPU kind \(here\): its recording is of numerics 0"):
    golden_params.check("run", _params(1.0 + 1e-6))
  with pytest.raises(AssertionError, match="run: layer/kernel"):  # A change of behaviour is still caught.
    golden_params.check("run", _params(1.01))


def test_a_kind_without_a_recording_is_held_within_the_tolerance(recordings):
  recordings("other", 1.0)
  recordings("unstamped", 7.0, numerics=None)  # Predates the numerics: never a reference.
  with pytest.warns(UserWarning, match="it has no recording.*run.other.npz"):
    golden_params.check("run", _params(1.0 + 1e-6))


def test_no_recording_of_todays_numerics_fails(recordings):
  recordings("here", 1.0, numerics=golden_params.NUMERICS - 1)
  with pytest.raises(AssertionError, match="no recording of numerics"):
    golden_params.check("run", _params(1.0))


def test_recording_writes_todays_numerics_and_fails(recordings, monkeypatch):
  monkeypatch.setenv("BERT_JAX_RECORD_GOLDEN", "1")
  with pytest.raises(AssertionError, match="recorded"):
    golden_params.check("run", _params(2.0))
  monkeypatch.delenv("BERT_JAX_RECORD_GOLDEN")
  golden_params.check("run", _params(2.0))
