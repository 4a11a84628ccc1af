"""Checkpoint averaging (`--mode=merge`, handoff/merge.py): the bundle it writes holds the (weighted) mean of the
checkpoints' parameters or moving averages, computed here, and loads as every bundle does; what cannot be merged is
refused before any parameter is read, naming what is wrong."""

import json
import shutil

import jax
import ml_collections
import numpy as np
import pytest

from bert_jax import jobs
from bert_jax.data.tokenizer import file_sha256
from bert_jax.handoff import export, pretrained
from bert_jax.model.bert_config import model_config
from bert_jax.train import pretraining, pretraining_start
from bert_jax.train import step as step_lib
from bert_jax.workdir import checkpoints, reading
from tests.helpers import write_checkpoint


def _noisy(params: dict, seed: int) -> dict:
  """`params` plus noise of a hundredth: another checkpoint of the same model."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda x: (x + 0.01 * rng.standard_normal(x.shape)).astype(x.dtype), params)


def _add_step(workdir, step: int, params: dict, ema: dict | None = None, vocab_extra: str = "") -> None:
  """Saves checkpoint `step` in `workdir` (a copy of the session's run) with `params` (and `ema`, the moving average)
  through `checkpoints.save`, as the loop saves one: step 2's config, data position, history and tokenizer (with
  `vocab_extra` appended to the vocabulary: another tokenizer)."""
  with checkpoints.read_only_manager(str(workdir)) as manager:
    config = ml_collections.ConfigDict(reading.read_config(manager, 2))
    position = dict(reading.read_data_position(manager, 2), step=step)
    history = reading.read_history(manager, 2)
    tokenizer = reading.read_tokenizer(manager, 2)
  content = open(tokenizer["file"], "rb").read() + vocab_extra.encode()
  identity = {name: value for name, value in tokenizer.items() if name != "file"}
  if vocab_extra:
    changed = workdir.parent / f"vocab-{step}.txt"
    changed.write_bytes(content)
    identity["sha256"] = position["tokenizer"]["sha256"] = file_sha256(str(changed))
  state = step_lib.TrainState(np.int32(step), params, {}, step_lib.initial_guard(), ema)
  manager = checkpoints.make_manager(str(workdir), 10)
  checkpoints.save(manager, step, state, position, config, {"identity": identity, "content": content}, history)
  checkpoints.finish(manager, step)


@pytest.fixture
def runs(wordpiece_run, tmp_path):
  """Two workdirs of the session's model: `a` (steps 2, 3 and 4; 3 and 4 with a moving average) and `b` (its step 2
  and a step 5). Returns (a, b, config, {name: params}, {name: moving average})."""
  workdir, config, trained = wordpiece_run
  a, b = tmp_path / "a", tmp_path / "b"
  shutil.copytree(workdir, a)
  shutil.copytree(workdir, b)
  params = {"a2": trained, "a3": _noisy(trained, 3), "a4": _noisy(trained, 4), "b5": _noisy(trained, 5)}
  ema = {"a3": _noisy(trained, 13), "a4": _noisy(trained, 14)}
  _add_step(a, 3, params["a3"], ema["a3"])
  _add_step(a, 4, params["a4"], ema["a4"])
  _add_step(b, 5, params["b5"])
  return a, b, config, params, ema


def _merge_config(config, **merge):
  config = ml_collections.ConfigDict(config.to_dict())
  config.merge.update(merge)
  return config


def _mean(trees: list[dict], weights: list[float]) -> dict:
  """The weighted mean, in float64 on the host."""
  shares = np.asarray(weights, np.float64) / np.sum(weights)
  return jax.tree.map(
    lambda *leaves: sum(s * np.asarray(x, np.float64) for s, x in zip(shares, leaves, strict=True)), *trees
  )


def _assert_close(actual: dict, expected: dict) -> None:
  assert jax.tree.structure(actual) == jax.tree.structure(expected)
  jax.tree.map(lambda a, e: np.testing.assert_allclose(a, e, rtol=1e-6, atol=1e-7), jax.device_get(actual), expected)


def test_the_last_checkpoints_weighted_mean_is_a_bundle_that_every_consumer_reads(runs, tmp_path):
  a, _, config, params, _ = runs
  output = tmp_path / "merged"
  merging = _merge_config(config, last=3, weights="1,2,5", output_dir=str(output))
  assert jobs.run(merging, str(a), "merge") == str(output)

  loaded = pretrained.load(str(output))  # Every file checked against the manifest's SHA-256.
  _assert_close(loaded.params, _mean([params["a2"], params["a3"], params["a4"]], [1, 2, 5]))
  assert loaded.source.format == "bundle" and loaded.source.step == 4  # The newest checkpoint's.
  assert loaded.tokenizer.encode("w3 w7 .") == [9, 13, 5]
  manifest = export.verify_bundle(str(output))
  steps = a / "checkpoints"
  assert manifest["source"] == {"path": str(steps / "4"), "format": "workdir", "step": 4}
  assert manifest["merge"] == {
    "of": "params",
    "named": "merge.last=3",
    "sources": [
      {"path": str(steps / str(step)), "format": "workdir", "step": step, "weight": weight, "share": weight / 8}
      for step, weight in ((2, 1.0), (3, 2.0), (4, 5.0))
    ],
  }
  assert manifest["history"]["examples_seen"] > 0  # The newest checkpoint's history: init_from carries it on.
  # A pretraining run from it (init_from): checked against the config and its tokenizer, and read onto its mesh.
  phase2 = ml_collections.ConfigDict(config.to_dict())
  phase2.init_from = str(output)
  origin, _ = pretraining_start.find_origin(
    phase2, str(tmp_path / "phase2"), model_config(phase2), pretraining.make_run(phase2)
  )
  assert origin.source.format == "bundle" and origin.tokenizer is not None
  _assert_close(origin.params, jax.device_get(loaded.params))


@pytest.mark.slow  # The weighted mean's bundle stays fast (the test above).
def test_named_steps_and_several_workdirs_average_equally_or_as_weighted(runs, tmp_path):
  a, b, config, params, _ = runs
  jobs.run(_merge_config(config, steps="4,2", output_dir=str(tmp_path / "steps")), str(a), "merge")
  _assert_close(pretrained.load(str(tmp_path / "steps")).params, _mean([params["a2"], params["a4"]], [1, 1]))

  # Several workdirs of one model (each its newest step) and a bundle, as mmBERT merges its decay-phase variants.
  bundle = export.export(str(a / "checkpoints" / "3"), str(tmp_path / "bundle3"))
  sources = f"{a},{b},{bundle}"
  jobs.run(
    _merge_config(config, sources=sources, weights="0.5,0.25,0.25", output_dir=str(tmp_path / "runs")), "", "merge"
  )
  merged = pretrained.load(str(tmp_path / "runs"))
  _assert_close(merged.params, _mean([params["a4"], params["b5"], params["a3"]], [2, 1, 1]))
  recorded = json.loads((tmp_path / "runs" / "manifest.json").read_text())["merge"]
  assert [(entry["format"], entry["step"], entry["share"]) for entry in recorded["sources"]] == [
    ("workdir", 4, 0.5),
    ("workdir", 5, 0.25),
    ("bundle", 3, 0.25),
  ]
  assert merged.source.step == 5  # b's step 5 is the newest.


def test_the_moving_averages_are_merged_or_written_out_alone(runs, tmp_path):
  a, _, config, _, ema = runs
  jobs.run(_merge_config(config, ema=True, output_dir=str(tmp_path / "ema")), str(a), "merge")
  alone = pretrained.load(str(tmp_path / "ema"))
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(alone.params), ema["a4"])  # Exactly the average kept.
  record = json.loads((tmp_path / "ema" / "manifest.json").read_text())["merge"]
  assert record["of"] == "ema" and record["sources"][0]["step"] == 4 and "ema_decay" in record["sources"][0]

  jobs.run(_merge_config(config, ema=True, last=2, output_dir=str(tmp_path / "ema2")), str(a), "merge")
  _assert_close(pretrained.load(str(tmp_path / "ema2")).params, _mean([ema["a3"], ema["a4"]], [1, 1]))

  with pytest.raises(ValueError, match=r"merge.ema: .*/checkpoints/2 holds no moving average of the parameters"):
    jobs.run(_merge_config(config, ema=True, last=3, output_dir=str(tmp_path / "ema3")), str(a), "merge")


@pytest.mark.parametrize(
  "merge, message",
  [
    (dict(last=2, weights="1,-1"), r"merge.weights='1,-1': weight 2 is -1; every weight must be a positive finite"),
    (dict(last=2, weights="0,1"), r"weight 1 is 0; every weight must be a positive finite number"),
    (dict(last=2, weights="1,nan"), r"weight 2 is nan; every weight must be a positive finite number"),
    (dict(last=2, weights="1,two"), r"weight 2, 'two', is not a number"),
    (dict(last=3, weights="1,2"), r"merge.weights has 2 weight\(s\) for the 3 checkpoint\(s\) of merge.last=3"),
    (dict(sources="x,y,z", weights="1,1"), r"2 weight\(s\) for the 3 checkpoint\(s\) of merge.sources \(3\)"),
    (dict(last=2, steps="1,2"), r"merge.last=2 and merge.steps='1,2' both name the steps"),
    (dict(sources="x,y", last=2), r"merge.last=2 names steps of one workdir, but merge.sources names 2"),
    (dict(steps="4,x"), r"merge.steps='4,x': 'x' is not a step number"),
    (dict(sources="x,x"), r"merge.sources names \['x'\] twice"),
    (dict(last=1), r"merge.last=1 names one checkpoint: its mean is itself"),
    (dict(last=2, output_dir=""), r"merge.output_dir is empty"),
  ],
)
def test_bad_merge_settings_are_refused_by_the_check(small_config, merge, message):
  settings = {"output_dir": "/tmp/unused-merge", **merge}
  with pytest.raises(ValueError, match=message):
    jobs.check(_merge_config(small_config, **settings), "merge")


def test_what_cannot_be_merged_is_refused_before_any_parameter_is_read(runs, tmp_path, monkeypatch):
  a, b, config, params, _ = runs
  monkeypatch.setattr(pretrained, "read_weights", lambda *args, **kwargs: pytest.fail("a parameter was read"))
  output = tmp_path / "merged"

  def refused(error, message, workdir=str(a), **merge):
    with pytest.raises(error, match=message):
      jobs.run(_merge_config(config, output_dir=str(output), **merge), workdir, "merge")
    assert not output.exists()

  refused(ValueError, rf"merge.last=4, but {a}/checkpoints holds 3 committed checkpoint\(s\): \[2, 3, 4\]", last=4)
  refused(ValueError, r"merge.steps=\(3, 7\): step\(s\) \[7\] are not committed checkpoints", steps="3,7")
  refused(
    ValueError,
    rf"merge.sources=\['{a}', '{a}/checkpoints/4'\] names the checkpoint\(s\)",
    sources=f"{a},{a}/checkpoints/4",
  )

  other = tmp_path / "wider"
  wider = ml_collections.ConfigDict(config.to_dict())
  wider.model.hidden_size = 64
  write_checkpoint(other, wider, {})
  refused(
    ValueError,
    rf"{a}/checkpoints/4 and {other}/checkpoints/1 are not checkpoints of one model \(first vs second\): "
    r"\['model.hidden_size: 32 vs 64'",
    sources=f"{a},{other}",
  )
  _add_step(b, 6, params["b5"], vocab_extra="w95\n")
  refused(
    ValueError, rf"{a}/checkpoints/4 and {b}/checkpoints/6 were trained with different tokenizers", sources=f"{a},{b}"
  )

  output.mkdir()
  (output / "notes.txt").write_text("mine")
  with pytest.raises(FileExistsError, match=rf"merge.output_dir={output} exists; it is never replaced"):
    jobs.run(_merge_config(config, output_dir=str(output), last=2), str(a), "merge")
  assert (output / "notes.txt").read_text() == "mine"
  with pytest.raises(ValueError, match=rf"merge.output_dir={a}/merged overlaps the source {a}"):
    jobs.run(_merge_config(config, output_dir=str(a / "merged"), last=2), str(a), "merge")
