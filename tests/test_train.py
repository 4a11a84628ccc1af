"""The loop: resumption is exact, bad configs stop before anything is compiled or written."""

import copy
import dataclasses
import json
import logging
import os
import shutil

import golden_params
import helpers
import jax
import numpy as np
import pytest

from bert_jax import jobs, progress
from bert_jax.model import param_layout
from bert_jax.train import pretraining


class Crash(Exception):
  pass


def _crash_after(monkeypatch, steps: int | None, batches: list | None = None, predictions: list | None = None):
  """Makes the train step raise on call `steps + 1`, as a machine lost mid-run would (None: never); `batches` gets
  each step's input_ids, `predictions` its masked-LM predictions per row."""
  real = pretraining.make_run

  def make(*args, **kwargs):
    run, calls = real(*args, **kwargs), []

    def counted(state, batch, *a):
      calls.append(1)
      if steps is not None and len(calls) > steps:
        raise Crash()
      if batches is not None:
        batches.append(np.asarray(batch["input_ids"]))
      if predictions is not None:
        predictions.append(np.asarray(batch["masked_lm_weights"]).sum() / len(batch["input_ids"]))
      return run.train_step(state, batch, *a)

    return dataclasses.replace(run, train_step=counted)

  monkeypatch.setattr(pretraining, "make_run", make)


# The runs below that do not test the schedule share one (schedule_end_step=9), and so one compiled train step: the
# persistent compilation cache (tests/conftest.py) serves the later runs.
SCHEDULE_END = 9


@pytest.mark.slow
def test_a_crashed_run_resumes_to_bitwise_the_same_params(small_config, tmp_path, monkeypatch):
  """... and the same moving average of the parameters (ema_decay), which its checkpoints keep."""
  small_config.update(num_train_steps=7, checkpoint_every_steps=2, schedule_end_step=SCHEDULE_END, ema_decay=0.9)
  straight = jobs.run(small_config, str(tmp_path / "a"), "pretrain")
  uninterrupted, uninterrupted_ema = helpers.state_params(straight), jax.device_get(straight.ema)

  with monkeypatch.context() as patch:
    _crash_after(patch, 5)  # Checkpoints at 2 and 4; step 5 is lost with the crash at step 6.
    with pytest.raises(Crash):
      jobs.run(small_config, str(tmp_path / "b"), "pretrain")
  assert sorted(os.listdir(tmp_path / "b" / "checkpoints"))[-1] == "4"
  state = jobs.run(small_config, str(tmp_path / "b"), "pretrain")
  jax.tree.map(np.testing.assert_array_equal, helpers.state_params(state), uninterrupted)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(state.ema), uninterrupted_ema)
  # An average, not the parameters: restarted at step 4's parameters it would differ.
  assert not all(jax.tree.leaves(jax.tree.map(np.array_equal, uninterrupted_ema, uninterrupted)))
  saved = helpers.final_params(tmp_path / "b", 7, item="ema")
  jax.tree.map(np.testing.assert_array_equal, saved, uninterrupted_ema)


@pytest.mark.slow
def test_a_batch_warmup_reads_its_rows_and_a_resume_mid_warmup_is_bitwise_the_uninterrupted_run(
  wordpiece_run, tmp_path, monkeypatch, caplog
):
  """8, 16 and then 24 rows a step from the prepared corpus's pipeline: the checkpoints record the rows read, the
  progress lines the batch, the speed leaves out each new size's compilation. A run lost in step 4 resumes from step
  2's checkpoint, across both changes of size, to the uninterrupted run's batches and parameters, bit for bit. With a
  masking-rate schedule (data.masking_phases) in the steps' reader batches: 15% to step 2, then down to 5% by step 7."""
  config = copy.deepcopy(wordpiece_run[1])
  # Sizes 8 and 16 for 2 steps each: 2 x (8 + 16) rows of 32 token positions; then 24.
  config.update(batch_size=24, batch_warmup_start=8, batch_warmup_tokens=2 * 24 * 32, num_train_steps=7)
  config.update(checkpoint_every_steps=2, keep_checkpoints=4, eval_steps=0)
  config.data.update(masking_phases="0: 0.15; 2: 0.15->0.05")
  caplog.set_level(logging.INFO, logger="absl")  # Whatever verbosity an earlier run in this process left.
  batches, predictions = {"a": [], "b": []}, []
  with monkeypatch.context() as patch:
    _crash_after(patch, None, batches["a"], predictions)
    uninterrupted = helpers.state_params(jobs.run(config, str(tmp_path / "a"), "pretrain"))
  assert [len(batch) for batch in batches["a"]] == [8, 8, 16, 16, 24, 24, 24]
  # Predictions per row (packed rows of up to 4 instances, each keeping one at any rate): 4.0 and 4.4 at 15%, 1.8 in
  # step 7 (reader batches 12 to 14 of the decay's 2 to 15: 7.3% to 5.8%).
  assert min(predictions[:2]) > 2 * predictions[-1], predictions
  for step, rows in {2: 16, 4: 48, 6: 96, 7: 120}.items():  # The rows of steps 1 to each checkpoint.
    saved = {
      item: json.loads((tmp_path / "a" / "checkpoints" / str(step) / item / "metadata").read_text())
      for item in ("data", "history")
    }
    assert saved["data"]["examples"] == saved["history"]["examples_seen"] == rows
    assert saved["history"]["token_positions_seen"] == rows * 32
  lines = [record.getMessage() for record in caplog.records]
  assert [line.split()[1] for line in lines if "compiled a new train step" in line] == ["3", "5"]
  assert [line.split("| batch ")[1].split()[0] for line in lines if line.startswith("step ")] == [
    "8",
    "8",
    "16",
    "16",
    "24",
    "24",
    "24",
  ]

  with monkeypatch.context() as patch:
    _crash_after(patch, 3)
    with pytest.raises(Crash):
      jobs.run(config, str(tmp_path / "b"), "pretrain")
  assert sorted(os.listdir(tmp_path / "b" / "checkpoints")) == ["2"]
  with monkeypatch.context() as patch:
    _crash_after(patch, None, batches["b"])
    resumed = helpers.state_params(jobs.run(config, str(tmp_path / "b"), "pretrain"))
  assert len(batches["b"]) == 5
  for batch, expected in zip(batches["b"], batches["a"][2:], strict=True):
    np.testing.assert_array_equal(batch, expected)
  jax.tree.map(np.testing.assert_array_equal, resumed, uninterrupted)
  history = json.loads((tmp_path / "b" / "checkpoints" / "7" / "history" / "metadata").read_text())
  assert history["examples_seen"] == 120 and history["token_positions_seen"] == 120 * 32


@pytest.mark.slow
def test_checkpoint_holds_params_optimizer_data_position_history_and_config_and_a_partial_one_is_never_read(
  small_config, tmp_path, monkeypatch
):
  monkeypatch.chdir(tmp_path.parent)
  small_config.schedule_end_step = SCHEDULE_END
  jobs.run(small_config, tmp_path.name, "pretrain")  # A relative workdir, as people type it.
  step_dir = tmp_path / "checkpoints" / "6"
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["3", "6"]
  assert {"params", "optimizer", "data", "history", "config"} <= set(os.listdir(step_dir))
  assert "tokenizer" not in os.listdir(step_dir)  # Synthetic data: no tokenizer (test_main has one).
  saved_data = json.loads((step_dir / "data" / "metadata").read_text())
  assert saved_data == {"examples": 6 * small_config.batch_size, "tokenizer": None, "step": 6, "readers": 1, "hosts": 1}
  assert not (tmp_path / "LEASE").exists()  # Given back at the end.
  history = json.loads((step_dir / "history" / "metadata").read_text())
  assert history["examples_seen"] == 6 * small_config.batch_size
  assert history["token_positions_seen"] == 6 * small_config.batch_size * small_config.data.max_seq_length
  assert history["train"]["step"] == 6 and history["eval"]["step"] == 6 and history["eval"]["mlm_loss"] > 0
  saved = helpers.restore_config(str(tmp_path))
  assert saved["model"]["hidden_size"] == 32 and saved["num_train_steps"] == 6
  assert os.listdir(tmp_path / "tensorboard" / "train") and os.listdir(tmp_path / "tensorboard" / "eval")

  # A partial checkpoint is never read: what a save killed half-way leaves behind, an uncommitted temporary
  # directory of a later step.
  partial = tmp_path / "checkpoints" / "9.orbax-checkpoint-tmp"
  (partial / "params").mkdir(parents=True)
  (partial / "params" / "garbage").write_bytes(b"\0" * 10)
  small_config.num_train_steps = 9
  state = jobs.run(small_config, str(tmp_path), "pretrain")
  assert int(state.step) == 9
  assert not partial.exists()


@pytest.mark.parametrize(
  "override, message",
  [
    (dict(data=dict(max_seq_length=64)), r"data.max_seq_length=64 exceeds model.max_position_embeddings=40"),
    (
      dict(model=dict(position_offset=2), data=dict(max_seq_length=40)),
      r"max_seq_length=40 exceeds model.max_position_embeddings=40 - model.position_offset=2",
    ),
    (dict(model=dict(layer_sharing="ffn", scan_layers=True)), r"layer_sharing='ffn' shares a part of each layer"),
    (dict(model=dict(num_heads=5)), r"hidden_size=32 is not divisible by model.num_heads=5"),
    (dict(batch_size=12), r"Global batch size 12 is not divisible by the data-parallel size 8"),
    (dict(mesh=dict(data=2)), r"Mesh \(data=2, fsdp=1, tensor=1\) needs 2 devices, but 8 are available"),
    (dict(data=dict(max_predictions_per_seq=33)), r"max_predictions_per_seq=33 must be in \[1, data.max_seq_len"),
    (dict(warmup_steps=7), r"warmup_steps=7 must be within \[0, num_train_steps=6\]"),
    (dict(data=dict(max_seq_length=4, max_predictions_per_seq=2)), r"max_seq_length=4 cannot fit a pair"),
    (dict(num_microbatches=3), r"num_microbatches=3 must be at least 1 and divide batch_size=8"),
    (dict(num_microbatches=2), r"size 8 \(mesh data x fsdp\) x 2 microbatch"),
    (dict(schedule_end_step=4), r"schedule_end_step=4 is before num_train_steps=6"),
    (dict(optimizer="sgd"), r"optimizer='sgd' is not supported"),
    (dict(model=dict(remat="some")), r"model.remat='some' is not supported"),
    (dict(init_from="/nonexistent/run"), r"init_from=/nonexistent/run: /nonexistent/run does not exist"),
    (dict(batch_warmup_tokens=-1), r"batch_warmup_tokens=-1 must be non-negative"),
    (dict(batch_warmup_tokens=1000, batch_warmup_start=16), r"batch_warmup_start=16 must be in \[1, batch_size=8\)"),
    (
      dict(batch_size=16, batch_warmup_tokens=1000, batch_warmup_start=4),
      r"batch_warmup_start=4 is not divisible by the data-parallel size 8 \(mesh data x fsdp\) x 1 microbatch",
    ),
  ],
)
def test_bad_config_fails_before_anything_is_written(small_config, tmp_path, override, message):
  small_config.update(override)
  workdir = tmp_path / "run"
  with pytest.raises((ValueError, FileNotFoundError), match=message):
    jobs.run(small_config, str(workdir), "pretrain")
  assert not workdir.exists()


@pytest.mark.slow
def test_a_checkpoint_loads_into_the_other_layer_layout(small_config, tmp_path):
  small_config.update(num_train_steps=3, eval_steps=0, schedule_end_step=SCHEDULE_END)
  unrolled = jobs.run(small_config, str(tmp_path), "pretrain")
  expected = jax.device_get(param_layout.convert((unrolled.params, unrolled.opt_state), scanned=True))

  small_config.model.update(scan_layers=True, remat="full")
  restored = jobs.run(small_config, str(tmp_path), "pretrain")  # Step 3 of 3: restores, trains nothing.
  assert helpers.is_scanned(restored.params) and int(restored.step) == 3
  jax.tree.map(np.testing.assert_array_equal, jax.device_get((restored.params, restored.opt_state)), expected)

  small_config.num_train_steps = 4  # And trains on in the scanned layout.
  assert int(jobs.run(small_config, str(tmp_path), "pretrain").step) == 4


@pytest.mark.slow
def test_phase_two_continues_phase_one_at_a_longer_sequence(small_config, tmp_path):
  phase_1, phase_2 = str(tmp_path / "phase1"), str(tmp_path / "phase2")
  small_config.update(num_train_steps=4, schedule_end_step=6, warmup_steps=1, eval_steps=0)
  small_config.data.update(max_seq_length=32, max_predictions_per_seq=5)
  end_of_phase_1 = jobs.run(small_config, phase_1, "pretrain")

  small_config.update(num_train_steps=6, init_from=phase_1)
  small_config.data.update(max_seq_length=40, max_predictions_per_seq=6)
  state = jobs.run(small_config, phase_2, "pretrain")
  assert int(state.step) == 6
  assert int(state.opt_state[1][0].count) == 6  # Adam's step count (and so the schedule) went on from 4.
  assert sorted(os.listdir(os.path.join(phase_2, "checkpoints"))) == ["6"]
  assert sorted(os.listdir(os.path.join(phase_1, "checkpoints"))) == ["3", "4"]  # Phase 1 is never written to.
  saved = helpers.restore_config(phase_2)
  assert saved["data"]["max_seq_length"] == 40 and saved["init_from"] == phase_1

  # Started from phase 1's final state: phase 2 stopped at step 4 is phase 1's end, bit for bit.
  small_config.num_train_steps = 4
  start = jobs.run(small_config, str(tmp_path / "phase2_at_4"), "pretrain")
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(start.params), jax.device_get(end_of_phase_1.params))

  # Once phase 2 has checkpoints of its own, it resumes from them even with phase 1's gone.
  shutil.rmtree(phase_1)
  small_config.num_train_steps = 6
  assert int(jobs.run(small_config, phase_2, "pretrain").step) == 6

  small_config.update(init_from=phase_2)
  small_config.model.update(hidden_size=64, num_heads=4)
  with pytest.raises(ValueError, match=r"init_from=.*phase2 does not fit .*model.hidden_size: 32 vs 64"):
    jobs.run(small_config, str(tmp_path / "mismatched"), "pretrain")
  assert not (tmp_path / "mismatched").exists()  # Refused before anything was written.


def test_progress_reports_model_flops_utilisation():
  ticker = progress.Progress(total_steps=10, tokens_per_step=1000, first_step=0, flops_per_step=1e12, peak_flops=4e12)
  ticker._last_time -= 2.0  # Two seconds for the two steps since the first: 1e12 FLOP/s of a 4e12 peak.
  speed = ticker.report(2, dict(loss=1.0, mlm_loss=1.0, mlm_accuracy=0.5, nsp_accuracy=0.5))
  np.testing.assert_allclose(speed["mfu"], 0.25, rtol=0.01)
  np.testing.assert_allclose(speed["tokens_per_sec"], 1000, rtol=0.01)
  assert "mfu" not in progress.Progress(10, 1000, 0).report(2, dict(mlm_loss=1, mlm_accuracy=0, nsp_accuracy=0))


def test_progress_under_a_batch_warmup_counts_each_steps_tokens_and_the_eta_the_tokens_left(monkeypatch):
  lines = []
  monkeypatch.setattr(progress.logging, "info", lambda message, *args: lines.append(message % args))
  # Steps 1-4 of 500 tokens, then 1,000; MFU from the model FLOPs of a 1,000-token step.
  ticker = progress.Progress(
    total_steps=10,
    tokens_per_step=1000,
    first_step=0,
    flops_per_step=1e12,
    peak_flops=4e12,
    tokens_through=lambda step: 500 * min(step, 4) + 1000 * max(step - 4, 0),
  )
  ticker._last_time -= 2.0  # Steps 1-4: 2,000 tokens in two seconds.
  speed = ticker.report(4, dict(loss=1.0, batch_size=8))
  np.testing.assert_allclose(speed["tokens_per_sec"], 1000, rtol=0.01)
  np.testing.assert_allclose(speed["mfu"], 0.25, rtol=0.01)  # 2,000 tokens: 2e12 FLOPs in 2 s of a 4e12 peak.
  # 6,000 tokens left at 1,000 a second (not 6 steps at half a second each).
  assert lines[-1].endswith("| ETA 0:00:06") and "| batch 8 |" in lines[-1]
  assert ticker.real_tokens == 2000


def test_the_first_progress_line_shows_the_compiling_step_not_a_speed(monkeypatch):
  lines = []
  monkeypatch.setattr(progress.logging, "info", lambda message, *args: lines.append(message % args))
  summary = dict(loss=1.0, mlm_loss=1.0, mlm_accuracy=0.5, nsp_accuracy=0.5)
  ticker = progress.Progress(total_steps=10, tokens_per_step=1000, first_step=1)  # Made once step 1 has compiled.
  ticker.first_step_seconds = 12.34
  assert ticker.report(1, summary) == {}  # No speed from a step that compiled, nor an ETA, nor a summary count.
  assert lines[-1].endswith("| compiling step 12.3 s | ETA -") and "tok/s" not in lines[-1]
  assert ticker.timed_steps == 0
  ticker._last_time -= 1.0
  assert ticker.report(2, summary)["tokens_per_sec"] > 0 and "tok/s" in lines[-1]


def test_pretraining_gives_its_golden_parameters(wordpiece_run):
  """Bitwise: the session's pretraining run (packed WordPiece rows, FSDP over 8 devices) against its recording."""
  golden_params.check("pretraining", wordpiece_run[2])
