"""The loop: resumption is exact, bad configs stop before anything is compiled or written."""

import json
import os

import jax
import numpy as np
import pytest

from bert_jax import checkpoint, train, train_step


class Crash(Exception):
  pass


def _crash_after(monkeypatch, steps: int):
  """Makes the train step raise on call `steps + 1`, as a machine lost mid-run would."""
  real = train_step.make_train_step

  def make(*args, **kwargs):
    step_fn, calls = real(*args, **kwargs), []

    def counted(*a):
      calls.append(1)
      if len(calls) > steps:
        raise Crash()
      return step_fn(*a)

    return counted

  monkeypatch.setattr(train_step, "make_train_step", make)


def _params(state):
  return jax.tree.map(np.asarray, jax.device_get(state.params))


def test_a_crashed_run_resumes_to_bitwise_the_same_params(small_config, tmp_path, monkeypatch):
  small_config.update(num_train_steps=7, checkpoint_every_steps=2)
  uninterrupted = _params(train.train_and_evaluate(small_config, str(tmp_path / "a")))

  with monkeypatch.context() as patch:
    _crash_after(patch, 5)  # Checkpoints at 2 and 4; step 5 is lost with the crash at step 6.
    with pytest.raises(Crash):
      train.train_and_evaluate(small_config, str(tmp_path / "b"))
  assert sorted(os.listdir(tmp_path / "b" / "checkpoints"))[-1] == "4"
  resumed = _params(train.train_and_evaluate(small_config, str(tmp_path / "b")))
  jax.tree.map(np.testing.assert_array_equal, resumed, uninterrupted)


def test_checkpoint_holds_state_data_position_and_config(small_config, tmp_path):
  train.train_and_evaluate(small_config, str(tmp_path))
  step_dir = tmp_path / "checkpoints" / "6"
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["3", "6"]
  assert {"state", "data", "config"} <= set(os.listdir(step_dir))
  saved_data = json.loads((step_dir / "data" / "metadata").read_text())
  assert saved_data == {"examples": 6 * small_config.batch_size, "tokenizer": None}  # Synthetic: no tokenizer.
  saved = checkpoint.restore_config(str(tmp_path))
  assert saved["model"]["hidden_size"] == 32 and saved["num_train_steps"] == 6
  assert os.listdir(tmp_path / "tensorboard" / "train") and os.listdir(tmp_path / "tensorboard" / "eval")


def test_a_partial_checkpoint_is_never_read(small_config, tmp_path):
  train.train_and_evaluate(small_config, str(tmp_path))
  # What a save killed half-way leaves behind: an uncommitted temporary directory of a later step.
  partial = tmp_path / "checkpoints" / "9.orbax-checkpoint-tmp"
  (partial / "state").mkdir(parents=True)
  (partial / "state" / "garbage").write_bytes(b"\0" * 10)
  small_config.num_train_steps = 9
  state = train.train_and_evaluate(small_config, str(tmp_path))
  assert int(state.step) == 9
  assert not partial.exists()


@pytest.mark.parametrize(
  "override, message",
  [
    (dict(data=dict(max_seq_length=64)), r"data.max_seq_length=64 exceeds model.max_position_embeddings=40"),
    (dict(model=dict(num_heads=5)), r"hidden_size=32 is not divisible by model.num_heads=5"),
    (dict(batch_size=12), r"Global batch size 12 is not divisible by the data-parallel size 8"),
    (dict(mesh=dict(data=2)), r"Mesh \(data=2, fsdp=1, tensor=1\) needs 2 devices, but 8 are available"),
    (dict(data=dict(max_predictions_per_seq=33)), r"max_predictions_per_seq=33 must be in \[1, data.max_seq_len"),
    (dict(warmup_steps=7), r"warmup_steps=7 must be within \[0, num_train_steps=6\]"),
    (dict(data=dict(max_seq_length=4, max_predictions_per_seq=2)), r"max_seq_length=4 cannot fit a pair"),
  ],
)
def test_bad_config_fails_before_anything_is_written(small_config, tmp_path, override, message):
  small_config.update(override)
  workdir = tmp_path / "run"
  with pytest.raises(ValueError, match=message):
    train.train_and_evaluate(small_config, str(workdir))
  assert not workdir.exists()
