"""The fine-tuning job end to end, in process, from the session's pretraining run (`wordpiece_run`): a sweep of
2 learning rates x 2 seeds in one program; one of its members equals the run trained alone; a crashed run
resumes to the same parameters; the workdir holds the best checkpoint, metrics.json and the predictions."""

import dataclasses
import json
import os

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from bert_jax import checkpoint, run
from bert_jax.finetune import job
from configs import glue

RATES = (1e-2, 3e-3)


def _write_sst2(directory):
  """SST-2 layout; the label is whether w1 (positive) or w2 (negative) is in the sentence."""
  rng = np.random.default_rng(0)
  os.makedirs(directory)

  def sentence(label):
    words = [f"w{i}" for i in rng.integers(3, 90, 6)]
    words.insert(int(rng.integers(0, 6)), "w1" if label else "w2")
    return " ".join(words)

  for split, rows in (("train", 64), ("dev", 24)):
    labels = rng.integers(0, 2, rows)
    lines = ["sentence\tlabel"] + [f"{sentence(y)}\t{y}" for y in labels]
    (directory / f"{split}.tsv").write_text("\n".join(lines) + "\n")
  (directory / "test.tsv").write_text("index\tsentence\n" + "".join(f"{i}\t{sentence(i % 2)}\n" for i in range(5)))


@pytest.fixture(scope="module")
def finetune_config(wordpiece_run, tmp_path_factory):
  workdir, _, _ = wordpiece_run
  data = tmp_path_factory.mktemp("sst2") / "SST-2"
  _write_sst2(data)

  def make(**sweep):
    config = glue.get_config()
    config.finetune.update(task="sst2", data_dir=str(data), max_seq_length=16, num_epochs=4.0, eval_batch_size=16)
    config.update(init_from=workdir, batch_size=8, learning_rate=RATES[1], log_every_steps=3)
    config.sweep.update(sweep)
    return config

  return make


def _params(workdir: str, name: str = checkpoint.CHECKPOINTS):
  with checkpoint.reader(os.path.join(workdir, name)) as manager:
    step = manager.latest_step()
    restored = manager.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore()))
  return jax.tree.map(np.asarray, restored["params"])


@pytest.fixture(scope="module")
def sweep_run(finetune_config, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("sweep") / "run")
  summary = job.finetune(finetune_config(learning_rates=",".join(map(str, RATES)), seeds=2), workdir)
  return workdir, summary


def test_a_sweep_trains_every_member_and_reports_each_learning_rate(sweep_run):
  workdir, summary = sweep_run
  assert [(m["learning_rate"], m["seed"]) for m in summary["members"]] == [(r, s) for r in RATES for s in (0, 1)]
  assert set(summary["sweep"]) == {f"{r:g}" for r in RATES}
  for row in summary["sweep"].values():
    assert row["n"] == 2 and row["best"] >= row["mean"] >= row["best"] - 2 * row["std"] - 1e-9
  assert len(summary["evaluations"]) == 4  # One per epoch.
  assert json.loads(open(os.path.join(workdir, job.METRICS_FILE)).read())["sweep"] == summary["sweep"]
  # The model learned the task (the label is one word of the sentence) with the larger learning rate.
  assert summary["sweep"][f"{RATES[0]:g}"]["best"] >= 0.75, summary["sweep"]
  # Members differ: their heads start from their own seeds.
  params = _params(workdir)
  kernel = params["classifier"]["kernel"]  # [members, hidden, labels]
  assert kernel.shape[0] == 4 and not np.allclose(kernel[0], kernel[1])
  # The best member at its best evaluation, alone, beside the rotating checkpoints.
  best = summary["best"]
  assert best["value"] == max(max(m["accuracy"] for m in e["results"]["dev"]) for e in summary["evaluations"])
  assert _params(workdir, checkpoint.BEST)["classifier"]["kernel"].shape == kernel.shape[1:]
  predictions = open(os.path.join(workdir, "predictions", "SST-2.tsv")).read().splitlines()
  assert predictions[0] == "index\tprediction" and len(predictions) == 6


def test_a_sweep_member_equals_the_run_trained_alone(sweep_run, finetune_config, tmp_path, monkeypatch):
  workdir, summary = sweep_run
  alone = str(tmp_path / "alone")
  real = run.make_run
  calls = []

  def crash_after_ten_steps(*args, **kwargs):  # After the checkpoint of epoch 1 (step 8).
    the_run = real(*args, **kwargs)

    def step(*a):
      calls.append(1)
      if len(calls) == 11:
        raise KeyboardInterrupt
      return the_run.train_step(*a)

    return dataclasses.replace(the_run, train_step=step)

  with monkeypatch.context() as patch:
    patch.setattr(run, "make_run", crash_after_ten_steps)
    with pytest.raises(KeyboardInterrupt):
      job.finetune(finetune_config(), alone)
  resumed = job.finetune(finetune_config(), alone)  # Resumes at step 8.

  member = summary["members"].index({"learning_rate": RATES[1], "seed": 0})
  for name, value in resumed["final"]["dev"][0].items():
    np.testing.assert_allclose(value, summary["final"]["dev"][member][name], atol=1e-6, err_msg=name)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a[0], b[member], atol=2e-5, rtol=1e-4), _params(alone), _params(workdir)
  )
