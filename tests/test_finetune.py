"""The fine-tuning job end to end, in process, from the session's pretraining run (`wordpiece_run`): a sweep of
2 learning rates x 2 seeds in one program; one of its members equals the run trained alone; a crashed run
resumes to the same parameters; the workdir holds the best checkpoint, metrics.json and the predictions; a resume
knows its inputs by content. Each task config against the reference PyTorch loop: tests/test_finetune_parity.py."""

import dataclasses
import json
import os
import re
import shutil
import signal

import golden_params
import jax
import numpy as np
import pytest

from bert_jax import jobs
from bert_jax.data.tokenizer import load_tokenizer
from bert_jax.finetune import glue as glue_tasks
from bert_jax.finetune import job, tasks
from bert_jax.finetune import plan as plan_lib
from bert_jax.model.heads import TaskHead
from bert_jax.train import init_from, run, start_order
from bert_jax.workdir import checkpoints
from configs import default, glue
from tests import helpers
from tests.helpers import (
  check_exports,
  finetuned_params,
  flip_a_bit_through_orbax,
  logged_by_start_order,
  write_sst2,
)

RATES = (1e-2, 3e-3)


@pytest.fixture(scope="module")
def finetune_config(wordpiece_run, tmp_path_factory):
  workdir, _, _ = wordpiece_run
  data = tmp_path_factory.mktemp("sst2") / "SST-2"
  write_sst2(data)

  def make(**sweep):
    config = glue.get_config()
    config.finetune.update(task="sst2", data_dir=str(data), max_seq_length=16, num_epochs=4.0, eval_batch_size=16)
    config.update(init_from=workdir, batch_size=8, learning_rate=RATES[1], log_every_steps=3)
    config.lr_schedule = "bert"  # The schedule the golden parameters (golden_params "finetuning") were recorded with.
    # And the dropout: glue.py's 0.1 then; unset now, it would be the source's (the tiny run's 0).
    config.model.update(hidden_dropout_prob=0.1, attention_dropout_prob=0.1)
    config.sweep.update(sweep)
    return config

  return make


@pytest.fixture(scope="module")
def sweep_run(finetune_config, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("sweep") / "run")
  lines = []
  with pytest.MonkeyPatch.context() as patch:  # The console lines, as logged (absl's records evade caplog).
    patch.setattr(job.logging, "info", lambda message, *args, **_: lines.append(str(message) % args))
    summary = jobs.run(finetune_config(learning_rates=",".join(map(str, RATES)), seeds=2), workdir, "finetune")
  return workdir, summary, lines


@pytest.mark.slow
def test_a_sweep_trains_every_member_and_reports_each_learning_rate(sweep_run):
  workdir, summary, lines = sweep_run
  assert [(m["learning_rate"], m["seed"]) for m in summary["members"]] == [(r, s) for r in RATES for s in (0, 1)]
  assert set(summary["sweep"]) == {f"{r:g}" for r in RATES}
  for row in summary["sweep"].values():
    assert row["n"] == 2 and row["best"] >= row["mean"] >= row["best"] - 2 * row["std"] - 1e-9
  assert len(summary["evaluations"]) == 4  # One per epoch.
  assert json.loads(open(os.path.join(workdir, job.METRICS_FILE)).read())["sweep"] == summary["sweep"]
  # The model learned the task (the label is one word of the sentence) with the larger learning rate.
  assert summary["sweep"][f"{RATES[0]:g}"]["best"] >= 0.75, summary["sweep"]
  # Members differ: their heads start from their own seeds.
  params = finetuned_params(workdir)
  kernel = params["classifier"]["kernel"]  # [members, hidden, labels]
  assert kernel.shape[0] == 4 and not np.allclose(kernel[0], kernel[1])
  # The best member at its best evaluation, alone, beside the rotating checkpoints.
  best = summary["best"]
  assert best["value"] == max(max(m["accuracy"] for m in e["results"]["dev"]) for e in summary["evaluations"])
  assert finetuned_params(workdir, checkpoints.BEST)["classifier"]["kernel"].shape == kernel.shape[1:]
  predictions = open(os.path.join(workdir, "predictions", "SST-2.tsv")).read().splitlines()
  assert predictions[0] == "index\tprediction" and len(predictions) == 6
  # The console: a header before the first step, a summary after the predictions.
  (header,) = [line for line in lines if line.startswith("Fine-tuning\n")]
  assert "sst2 (classification head): " in header and "4 member(s) (learning rate, seed): " in header, header
  assert "  start    step 0: " in header and f"  workdir  {workdir}" in header, header
  (end,) = [line for line in lines if line.startswith("Fine-tuning finished at step ")]
  assert os.path.join(workdir, job.METRICS_FILE) in end and re.search(rf"\n  best +{best['value']:.4f} ", end), end
  assert lines.index(header) < lines.index(end)


@pytest.mark.slow
def test_the_fine_tuned_model_loads_and_exports_with_its_head(sweep_run, tmp_path):
  check_exports(sweep_run[0], TaskHead("sst2", "classification", ("0", "1")), tmp_path)


@pytest.mark.slow
def test_a_sweep_member_equals_the_run_trained_alone_through_sigterm_a_crash_and_a_corrupt_checkpoint(
  sweep_run, finetune_config, tmp_path, monkeypatch
):
  """The run alone gets SIGTERM during step 11: it stops there with a checkpoint and returns (main exits 0), leaving
  no lease behind. The same command resumes; it refuses a changed sweep, naming both values, or a changed training
  file, naming it, before anything is written; with the same config it crashes after its epoch-2 checkpoint (step
  16), which storage then corrupts: the same command, with its data and init_from copied elsewhere, falls back to step
  11, moves step 16 aside, and ends where the sweep's member of its seed did: a member is a restart of everything
  (head, dropout and training order from its seed), in one program."""
  workdir, summary, _ = sweep_run
  alone = str(tmp_path / "alone")
  real = run.make_run

  def interrupted(at_call: int, interrupt):
    calls = []

    def make_run(*args, **kwargs):
      the_run = real(*args, **kwargs)

      def step(*a):
        calls.append(1)
        if len(calls) == at_call:
          interrupt()
        return the_run.train_step(*a)

      return dataclasses.replace(the_run, train_step=step)

    return make_run

  def keyboard_interrupt():
    raise KeyboardInterrupt

  def config(**sweep):
    made = finetune_config(**sweep)
    made.update(keep_checkpoints=2, seed=1)  # The sweep's member (RATES[1], 1): its own head, dropout and order.
    return made

  with monkeypatch.context() as patch:
    patch.setattr(run, "make_run", interrupted(11, lambda: os.kill(os.getpid(), signal.SIGTERM)))
    assert jobs.run(config(), alone, "finetune") is None  # Stopped: no summary, no predictions.
  assert checkpoints.committed_steps(checkpoints.checkpoint_dir(alone)) == [8, 11]
  assert not os.path.exists(os.path.join(alone, "predictions"))

  other_sweep = config(learning_rates="0.01,0.003")
  with pytest.raises(
    ValueError,
    match=r"alone/checkpoints/11 is a checkpoint of another run: sweep.learning_rates="
    r"'' in the checkpoint, '0.01,0.003' in the config",
  ):
    jobs.run(other_sweep, alone, "finetune")
  data = finetune_config().finetune.data_dir
  other_data = config()
  other_data.finetune.data_dir = str(tmp_path / "other")
  shutil.copytree(data, other_data.finetune.data_dir)
  rows = (tmp_path / "other" / "train.tsv").read_text().splitlines()
  (tmp_path / "other" / "train.tsv").write_text("\n".join(rows[:17]) + "\n")  # 16 of its 64 rows.
  with pytest.raises(
    ValueError, match=re.escape(f"finetune.data_dir={tmp_path}/other: train.tsv differs from {data}'s (")
  ):
    jobs.run(other_data, alone, "finetune")
  # A checkpoint written before lr_schedule was recorded ran Google's schedule: it resumes with "bert" only.
  step, saved, position = start_order.newest_saved(config(), alone)
  with monkeypatch.context() as patch:
    del saved["lr_schedule"]
    patch.setattr(start_order, "newest_saved", lambda *_: (step, saved, position))
    inputs = job.run_inputs(config(), tasks.make_task(config().finetune))
    start_order.check_same_run(resolved(config()), alone, job.RUN_KEYS, job.RUN_KEYS_ABSENT, inputs)  # "bert".
    other_schedule = config()
    other_schedule.lr_schedule = "transformers"
    with pytest.raises(ValueError, match="lr_schedule='bert' in the checkpoint, 'transformers' in the config"):
      jobs.run(other_schedule, alone, "finetune")

  with monkeypatch.context() as patch:
    patch.setattr(run, "make_run", interrupted(8, keyboard_interrupt))  # Resumed at 11: dies in step 19.
    with pytest.raises(KeyboardInterrupt):
      jobs.run(config(), alone, "finetune")
  assert checkpoints.committed_steps(checkpoints.checkpoint_dir(alone)) == [11, 16]
  flip_a_bit_through_orbax(checkpoints.checkpoint_dir(alone) / "16")
  copied = config()  # The same data and init_from, copied: they are known by content.
  copied.finetune.data_dir, copied.init_from = str(tmp_path / "data_copy"), str(tmp_path / "init_copy")
  copied_from = finetune_config().init_from
  shutil.copytree(data, copied.finetune.data_dir)
  shutil.copytree(copied_from, copied.init_from)
  with monkeypatch.context() as patch:
    lines = logged_by_start_order(patch)
    resumed = jobs.run(copied, alone, "finetune")  # Resumes at step 11.
  assert f"init_from={tmp_path}/init_copy has the same content as {copied_from}, which trained the checkpoint." in lines
  assert os.listdir(os.path.join(alone, start_order.CORRUPT)) == ["16"]

  member = summary["members"].index({"learning_rate": RATES[1], "seed": 1})
  for name, value in resumed["final"]["dev"][0].items():
    np.testing.assert_allclose(value, summary["final"]["dev"][member][name], atol=1e-6, err_msg=name)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a[0], b[member], atol=2e-5, rtol=1e-4),
    finetuned_params(alone),
    finetuned_params(workdir),
  )


def resolved(config):
  """`config` as `job.finetune` compares it with a checkpoint's: its model's classifier_* resolved (init_from's)."""
  source = init_from.read_source(config.init_from, "init_from") if config.init_from else None
  return plan_lib.with_model(config, plan_lib.model_config(config, source))


def test_wsds_keys_define_the_run_and_older_checkpoints_ran_with_their_defaults():
  """A resume refuses another wsd decay; a checkpoint written before the keys existed read none of them (its
  schedule was a linear one), so it resumes with the defaults."""
  for key in ("lr_decay", "lr_decay_fraction", "lr_decay_floor"):
    assert key in job.RUN_KEYS
    assert job.RUN_KEYS_ABSENT[key] == default.get_config()[key]


def test_a_resume_knows_its_data_and_init_from_by_content_not_by_path(tmp_path, monkeypatch):
  """A fine-tuning checkpoint records what its task read, file by file, and init_from, by content. train.tsv
  replaced in place (its first 16 rows kept) is refused naming the file before anything is written; the same files
  and init_from copied elsewhere resume, each with a line saying so; a checkpoint from before the record resumes
  with a warning, compared by path as before."""
  data, source = tmp_path / "SST-2", tmp_path / "pretrained"
  write_sst2(data)
  helpers.write_checkpoint(source, default.get_config(), {})  # A pretraining workdir's step (metadata and checksums).
  config = glue.get_config()
  config.finetune.update(task="sst2", data_dir=str(data))
  config.init_from = str(source)
  inputs = job.run_inputs(config, tasks.make_task(config.finetune))
  assert set(inputs[0].content) == {"train.tsv", "dev.tsv", "test.tsv"} and [i.key for i in inputs[1:]] == ["init_from"]
  workdir = tmp_path / "run"
  helpers.write_checkpoint(workdir, config, {start_order.INPUTS: start_order.record_inputs(inputs)})

  def check(config):
    inputs = job.run_inputs(config, tasks.make_task(config.finetune))
    start_order.check_same_run(resolved(config), str(workdir), job.RUN_KEYS, job.RUN_KEYS_ABSENT, inputs)

  copied = config.copy_and_resolve_references()
  copied.finetune.data_dir, copied.init_from = str(tmp_path / "copy"), str(tmp_path / "pretrained_copy")
  shutil.copytree(data, copied.finetune.data_dir)
  shutil.copytree(source, copied.init_from)
  with monkeypatch.context() as patch:
    lines = logged_by_start_order(patch)
    check(copied)
  assert lines == [
    f"finetune.data_dir={tmp_path}/copy has the same content as {data}, which trained the checkpoint.",
    f"init_from={tmp_path}/pretrained_copy has the same content as {source}, which trained the checkpoint.",
  ]

  before = (data / "train.tsv").stat().st_size
  rows = (data / "train.tsv").read_text().splitlines()
  (data / "train.tsv").write_text("\n".join(rows[:17]) + "\n")  # Replaced in place: the header and 16 rows.
  written = sorted(workdir.rglob("*"))
  changed = f"finetune.data_dir={data}: train.tsv changed since the checkpoint ({before:,} bytes, sha256 "
  with pytest.raises(ValueError, match=re.escape(changed)) as refused:
    jobs.run(config, str(workdir), "finetune")
  assert f"-> {(data / 'train.tsv').stat().st_size:,} bytes" in str(refused.value)
  assert "dev.tsv" not in str(refused.value) and sorted(workdir.rglob("*")) == written  # Nothing written.

  old = tmp_path / "old"  # Written before checkpoints recorded their inputs: compared by path, with a warning.
  helpers.write_checkpoint(old, config, {})
  workdir = old
  with monkeypatch.context() as patch:
    lines = logged_by_start_order(patch)
    check(config)
  assert lines == [
    f"{old}/checkpoints/1 was written before checkpoints recorded their inputs' content: finetune.data_dir, "
    "init_from compared by path only."
  ]
  with pytest.raises(ValueError, match=re.escape(f"finetune.data_dir={str(data)!r} in the checkpoint")):
    check(copied)


def test_a_fine_tuning_resume_refuses_a_tokenizer_changed_in_place(tmp_path):
  """A checkpoint records its tokenizer's SHA-256 (its data position); a resume whose tokenizer file was changed in
  place is refused, as pretraining's is, before anything is written."""
  data, vocab = tmp_path / "SST-2", tmp_path / "vocab.txt"
  write_sst2(data)
  vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(95))]) + "\n")
  config = glue.get_config()
  config.finetune.update(task="sst2", data_dir=str(data))
  config.tokenizer.update(kind="wordpiece", path=str(vocab))
  inputs = job.run_inputs(config, tasks.make_task(config.finetune))
  identity = load_tokenizer("wordpiece", str(vocab)).identity()
  position = {"examples": 8, "step": 1, "tokenizer": identity}
  workdir = tmp_path / "run"
  helpers.write_checkpoint(
    workdir, config, {start_order.INPUTS: start_order.record_inputs(inputs)}, data_position=position
  )
  vocab.write_text(vocab.read_text().replace("w94", "w95"))
  written = sorted(workdir.rglob("*"))
  with pytest.raises(
    ValueError, match=re.escape(f"The checkpoint was trained with tokenizer {identity}; the config's")
  ):
    jobs.run(config, str(workdir), "finetune")
  assert sorted(workdir.rglob("*")) == written


def test_a_baseline_run_refuses_a_tokenizer_with_more_ids_than_the_models_table(tmp_path):
  """Without init_from, the model is config.model and the tokenizer config.tokenizer's: ids past the embedding table
  (which the lookup would clamp, silently) are refused before anything is written."""
  data, vocab = tmp_path / "SST-2", tmp_path / "vocab.txt"
  write_sst2(data)
  vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(195))]) + "\n")
  config = glue.get_config()
  config.finetune.update(task="sst2", data_dir=str(data))
  config.tokenizer.update(kind="wordpiece", path=str(vocab))
  config.model.vocab_size = 101
  workdir = tmp_path / "run"
  with pytest.raises(ValueError, match=re.escape(f"tokenizer.path={vocab} has 200 ids but model.vocab_size=101")):
    jobs.run(config, str(workdir), "finetune")
  assert not workdir.exists()


def test_a_missing_test_file_skips_its_predictions_but_a_missing_dev_file_fails(tmp_path, fixture_tokenizers):
  write_sst2(tmp_path / "SST-2")
  (tmp_path / "SST-2" / "test.tsv").unlink()
  task = glue_tasks.make_task("sst2", str(tmp_path / "SST-2"))
  splits = job._read_splits(task, fixture_tokenizers["wordpiece"], 16)
  assert (splits.train.num_rows, list(splits.evaluation), splits.test) == (64, ["dev"], {})
  (tmp_path / "SST-2" / "dev.tsv").unlink()
  with pytest.raises(FileNotFoundError, match="dev.tsv"):
    job._read_splits(task, fixture_tokenizers["wordpiece"], 16)


@pytest.mark.slow
def test_fine_tuning_gives_its_golden_parameters(sweep_run):
  """Bitwise: the sweep's final parameters (4 members, 4 epochs) against their recording. The members of seed 1 were
  recorded again when each member got its own training order (issue 23); those of seed 0 kept theirs, bitwise."""
  golden_params.check("finetuning", finetuned_params(sweep_run[0]))
