"""What a checkpoint must survive: a flipped bit, a damaged file, a garbage JSON item, each named with its step and
file, with the previous step restored instead when `restore_fallback` is set; and the format of today's checkpoints
still restoring bitwise (a committed golden checkpoint)."""

import os
import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from etils import epath

from bert_jax import paths
from bert_jax.train import pretraining
from bert_jax.workdir import checkpoints
from configs import default


def _params(state):
  return jax.tree.map(np.asarray, jax.device_get(state.params))


def _flip_a_bit_through_orbax(step_dir) -> None:
  """Rewrites `params` with one bit of one weight flipped, as storage that corrupts silently would: every Orbax and
  tensorstore check still passes."""
  item = epath.Path(step_dir) / "params"
  params = ocp.StandardCheckpointer().restore(item)
  kernel = np.array(params["bert"]["layer_1"]["attention"]["query"]["kernel"])
  kernel.reshape(-1).view(np.uint32)[17] ^= 1 << 29  # An exponent bit: the weight grows by orders of magnitude.
  params["bert"]["layer_1"]["attention"]["query"]["kernel"] = kernel
  shutil.rmtree(item)
  with ocp.StandardCheckpointer() as writer:
    writer.save(item, params)
  (item / "commit_success.txt").write_text("")


def _truncate_files(step_dir) -> None:
  """Cuts every data file of `params` in half, as a copy that ran out of space would."""
  for path in paths.files(epath.Path(step_dir) / "params"):
    if path.parent.name == "d":
      path.write_bytes(path.read_bytes()[: path.stat().length // 2])


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # tensorstore, after a failed read.
def test_a_corrupt_checkpoint_is_named_and_the_previous_step_restored_when_asked(small_config, tmp_path, caplog):
  small_config.update(eval_steps=0)
  original = str(tmp_path / "original")
  uninterrupted = _params(pretraining.pretrain(small_config, original))  # Checkpoints 3 and 6.

  faults = {
    "flipped bit": (
      _flip_a_bit_through_orbax,
      r"array params/bert/layer_1/attention/query/kernel read from .*/6/params",
    ),
    "truncated files": (_truncate_files, r"Checkpoint step 6: cannot read \['data', 'optimizer', 'params'\] in .*/6"),
    "garbage JSON": (lambda d: (epath.Path(d) / "data" / "metadata").write_text("{garbage"), r"step 6.*'data'.*/6"),
  }
  for name, (damage, named) in faults.items():
    workdir = tmp_path / name.replace(" ", "_")
    shutil.copytree(original, workdir)
    damage(workdir / "checkpoints" / "6")
    small_config.restore_fallback = False
    with pytest.raises(checkpoints.CorruptCheckpointError, match=named):
      pretraining.pretrain(small_config, str(workdir))
    assert sorted(os.listdir(workdir / "checkpoints")) == ["3", "6"]  # Nothing written, nothing deleted.

  # With the fallback: step 3 is restored, the damaged step is kept aside, and the run ends where it would have.
  small_config.restore_fallback = True
  workdir = tmp_path / "flipped_bit"
  run = pretraining.make_run(small_config)
  with checkpoints.read_only_manager(str(workdir)) as manager:  # pretrained.load's (and fine-tuning's) reader.
    with pytest.raises(checkpoints.CorruptCheckpointError, match="query/kernel"):
      checkpoints.restore_params(manager, 6, run.abstract.params, run.shardings.params)
  resumed = _params(pretraining.pretrain(small_config, str(workdir)))
  assert "Restored step 3 instead of step 6; moving step 6 to" in caplog.text
  assert os.listdir(workdir / "corrupt_checkpoints") == ["6"]
  assert sorted(os.listdir(workdir / "checkpoints")) == ["3", "6"]
  jax.tree.map(np.testing.assert_array_equal, resumed, uninterrupted)


GOLDEN = os.path.join(os.path.dirname(__file__), "golden")


def _todays_config(saved: dict):
  """Today's default config with the saved config's values for every key both have (keys come and go)."""
  config = default.get_config()
  known = {}

  def flatten(tree, prefix=""):
    for key, value in tree.items():
      if isinstance(value, dict) and key != "mesh":
        flatten(value, f"{prefix}{key}.")
      else:
        known[f"{prefix}{key}"] = value

  flatten(saved)
  for key, value in known.items():
    *parents, leaf = key.split(".")
    node = config
    for parent in parents:
      node = node.get(parent) if node is not None else None
    if node is not None and leaf in node:
      node[leaf] = tuple(map(tuple, value)) if key == "logical_axis_rules" else value
  return config


def test_a_checkpoint_in_todays_format_restores_bitwise():
  """tests/golden: step 2 of a tiny synthetic run (its config is in the checkpoint) written by this format, and the
  state it held (`expected_state.npz`). A dependency upgrade that cannot read it fails here, not in a user's
  resume. Rewrite both only with a deliberate format change that still reads the old ones."""
  with checkpoints.read_only_manager(GOLDEN) as manager:
    assert manager.all_steps() == [2]
    config = _todays_config(checkpoints.read_config(manager, 2))
    config.mesh.update(data=1, fsdp=1, tensor=1)
    run = pretraining.make_run(config, jax.devices()[:1])
    state, position = checkpoints.restore(manager, 2, run.abstract, run.shardings)  # Checksums verified too.
  assert position["examples"] == 2 * config.batch_size and position["step"] == 2
  expected = np.load(os.path.join(GOLDEN, "expected_state.npz"))
  restored = {jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_flatten_with_path(state)[0]}
  assert sorted(restored) == sorted(expected.files)
  for name in expected.files:
    np.testing.assert_array_equal(restored[name], expected[name], err_msg=name)
