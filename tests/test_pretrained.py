"""The hand-off: `pretrained.load` from a workdir, a step or a bundle, onto any mesh in either layout; the export bundle
complete on its own; every source that does not fit or is damaged refused naming its file. The outside formats:
tests/test_hf_and_google_formats.py; what an export writes: tests/test_export.py."""

import gc
import json
import os
import pathlib
import shutil
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from bert_jax import jobs, sharding
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.handoff import export, formats, pretrained
from bert_jax.handoff.hf_format import load_safetensors, save_safetensors
from bert_jax.model import param_layout
from bert_jax.model.bert_config import to_bert_json
from bert_jax.train import pretraining
from bert_jax.workdir import checkpoints, reading
from tests.helpers import assert_params_equal, is_scanned


@pytest.fixture
def workdir_copy(wordpiece_run, tmp_path):
  workdir, _, _ = wordpiece_run
  shutil.copytree(workdir, tmp_path / "run")
  return tmp_path / "run"


def test_load_reads_only_the_params_onto_any_mesh_in_either_layout(wordpiece_run, workdir_copy):
  _, config, params = wordpiece_run
  step_dir = workdir_copy / "checkpoints" / "2"
  # The optimizer moments are never read: gone, or garbage, the load does not notice.
  shutil.rmtree(step_dir / "optimizer")
  (step_dir / "optimizer").mkdir()
  (step_dir / "optimizer" / "_METADATA").write_bytes(b"\0garbage")

  loaded = pretrained.load(str(workdir_copy))  # One device, unrolled.
  assert loaded.source.format == "workdir" and loaded.source.step == 2
  assert loaded.config.hidden_size == 32 and not loaded.config.scan_layers
  assert set(loaded.params) == {"bert", "mlm_transform", "mlm_layer_norm", "mlm_output_bias", "nsp"}
  assert_params_equal(loaded.params, params)
  assert (
    loaded.tokenizer.vocab_size == 101
    and loaded.config.vocab_size == 104
    and loaded.tokenizer.encode("w3 w7 .") == [9, 13, 5]
  )
  # The tokenizer file travels inside the checkpoint step.
  assert loaded.tokenizer.path == str(step_dir / "tokenizer" / "vocab.txt")

  # Saved under FSDP 8; loaded on DP 4 x TP 2 of the 8 devices, from the step directory, bitwise.
  mesh = sharding.make_mesh(dict(data=4, fsdp=1, tensor=2))
  on_mesh = pretrained.load(str(step_dir), mesh=mesh, rules=config.logical_axis_rules)
  query = on_mesh.params["bert"]["layer_0"]["attention"]["query"]["kernel"]
  assert query.sharding.mesh.shape == mesh.shape and query.sharding.spec == jax.sharding.PartitionSpec(
    "fsdp", "tensor", None
  )
  assert_params_equal(on_mesh.params, params)

  scanned = pretrained.load(str(workdir_copy), scan_layers=True, mesh=mesh, rules=config.logical_axis_rules)
  assert scanned.config.scan_layers and is_scanned(scanned.params)
  assert_params_equal(param_layout.convert(jax.device_get(scanned.params), scanned=False), params)


def test_a_source_that_does_not_fit_is_refused_with_its_path(wordpiece_run, workdir_copy, small_model_config, tmp_path):
  with pytest.raises(FileNotFoundError, match=r"/nowhere does not exist"):
    pretrained.load(str(tmp_path / "nowhere"))
  # A step Orbax has not committed (a save killed half-way) is never read.
  partial = workdir_copy / "checkpoints" / "4.orbax-checkpoint-tmp-1234"
  shutil.copytree(workdir_copy / "checkpoints" / "2", partial)
  with pytest.raises(ValueError, match=r"4.orbax-checkpoint-tmp-1234 is an uncommitted checkpoint"):
    pretrained.load(str(partial))
  assert pretrained.load(str(workdir_copy)).source.step == 2  # Nor chosen as the newest.
  (tmp_path / "other").mkdir()
  (tmp_path / "other" / "notes.txt").write_text("hi")
  with pytest.raises(ValueError, match=r"other is not a bert_jax workdir.*notes.txt"):
    pretrained.load(str(tmp_path / "other"))
  # Metadata that cannot be what it claims: named with its file.
  (tmp_path / "bad_bundle").mkdir()
  (tmp_path / "bad_bundle" / "manifest.json").write_text(json.dumps({"format": formats.BUNDLE_FORMAT}))
  (tmp_path / "bad_bundle" / "bert_config.json").write_text(json.dumps(to_bert_json(wordpiece_run[1].model)))
  with pytest.raises(ValueError, match=r"bad_bundle/manifest.json records no file hashes"):
    pretrained.load(str(tmp_path / "bad_bundle"))
  (tmp_path / "bad_hf").mkdir()
  (tmp_path / "bad_hf" / "model.safetensors").write_bytes(b"")
  (tmp_path / "bad_hf" / "config.json").write_text(
    json.dumps(dict(to_bert_json(small_model_config), num_attention_heads=5))
  )
  with pytest.raises(
    ValueError, match=r"bad_hf/config.json: model.hidden_size=32 is not divisible by model.num_heads=5"
  ):
    pretrained.load(str(tmp_path / "bad_hf"))
  # A tokenizer file that is not the one the checkpoint recorded.
  vocab = workdir_copy / "checkpoints" / "2" / "tokenizer" / "vocab.txt"
  vocab.write_text(vocab.read_text().replace("w94", "w95"))
  with pytest.raises(ValueError, match=r"/checkpoints/2/tokenizer does not match its checksum"):
    pretrained.load(str(workdir_copy))


def test_the_bundle_is_complete_on_its_own_verified_and_never_overwritten_unasked(
  wordpiece_run, workdir_copy, tmp_path, monkeypatch
):
  _, _, params = wordpiece_run
  bundle = tmp_path / "bundle"
  export.export(str(workdir_copy), str(bundle))
  assert sorted(os.listdir(bundle)) == ["bert_config.json", "manifest.json", "params", "vocab.txt"]
  assert not [name for name in os.listdir(tmp_path) if name.startswith(".bundle")]  # No staging left behind.
  manifest = export.verify_bundle(str(bundle))
  assert manifest["source"] == {"path": str(workdir_copy / "checkpoints" / "2"), "format": "workdir", "step": 2}
  assert manifest["history"]["examples_seen"] == 16 and manifest["history"]["token_positions_seen"] == 16 * 32
  assert manifest["history"]["eval"]["step"] == 2 and manifest["history"]["train"]["step"] == 2
  assert manifest["parameters"] == sum(x.size for x in jax.tree.leaves(params))
  assert manifest["tokenizer"]["kind"] == "wordpiece" and manifest["tokenizer"]["lower_case"] is True
  assert {"bert_jax", "jax", "flax", "orbax-checkpoint"} <= set(manifest["versions"])
  assert "vocab.txt" in manifest["files"] and any(name.startswith("params/") for name in manifest["files"])
  assert json.loads((bundle / "bert_config.json").read_text())["num_hidden_layers"] == 2

  shutil.rmtree(workdir_copy)  # The bundle needs nothing else.
  loaded = pretrained.load(str(bundle))
  assert loaded.source.format == "bundle" and loaded.tokenizer.encode("w3 w7 .") == [9, 13, 5]
  assert_params_equal(loaded.params, params)

  export.export(str(bundle), str(tmp_path / "again"))
  with pytest.raises(FileExistsError, match=r"again exists and is not empty; set export.overwrite=True"):
    export.export(str(bundle), str(tmp_path / "again"))
  for target in (bundle, tmp_path):  # The source itself, or a directory holding it, is never replaced.
    with pytest.raises(ValueError, match=rf"export.dir={target} overlaps the source"):
      export.export(str(bundle), str(target), overwrite=True)
  (tmp_path / "notes").mkdir()
  (tmp_path / "notes" / "mine.txt").write_text("mine")
  with pytest.raises(ValueError, match=r"notes is not an export .*refusing to replace it"):
    export.export(str(bundle), str(tmp_path / "notes"), overwrite=True)
  assert (tmp_path / "notes" / "mine.txt").read_text() == "mine"
  monkeypatch.chdir(tmp_path)  # Relative paths, as people type them.
  export.export("again", "bundle", overwrite=True)
  assert json.loads((bundle / "manifest.json").read_text())["source"]["path"] == str(tmp_path / "again")  # Replaced.
  assert_params_equal(pretrained.load("bundle").params, params)

  data_file = next(p for p in sorted((bundle / "params").rglob("*")) if p.is_file() and p.stat().st_size > 1000)
  content = bytearray(data_file.read_bytes())
  content[len(content) // 2] ^= 1
  data_file.write_bytes(bytes(content))
  with pytest.raises(ValueError, match=rf"does not match its manifest.*{data_file.name}: changed"):
    export.verify_bundle(str(bundle))
  (bundle / "manifest.json").unlink()  # What a reader sees of a bundle still being written on GCS.
  with pytest.raises(ValueError, match=r"bundle is an incomplete export bundle: it has no manifest.json"):
    pretrained.load(str(bundle))


@pytest.mark.slow
def test_checkpoints_written_with_one_state_item_still_resume_and_load(wordpiece_run, tmp_path):
  workdir, config, params = wordpiece_run
  legacy = tmp_path / "legacy"
  with checkpoints.read_only_manager(workdir) as manager:
    position = reading.read_data_position(manager, 2)
    saved_config = reading.read_config(manager, 2)
  run = pretraining.make_run(config)
  abstract, shardings = run.abstract, run.shardings
  with checkpoints.read_only_manager(workdir) as manager:
    state, _ = reading.restore(manager, 2, abstract, shardings)
  with ocp.CheckpointManager(legacy / "checkpoints") as manager:  # The layout before params had an item.
    manager.save(
      2,
      args=ocp.args.Composite(
        state=ocp.args.StandardSave(state.replace(guard=None)),  # Nor had the state a step guard then.
        data=ocp.args.JsonSave(position),
        config=ocp.args.JsonSave(saved_config),
      ),
    )
  loaded = pretrained.load(str(legacy))  # Its tokenizer from the recorded path, checked by hash.
  assert_params_equal(loaded.params, params)
  resumed = jobs.run(config, str(legacy), "pretrain")  # Step 2 of 2: restores, trains nothing.
  assert int(resumed.step) == 2
  assert_params_equal(resumed.opt_state, jax.device_get(state.opt_state))


def test_a_vocabulary_larger_than_the_embedding_table_is_refused(exports, tmp_path):
  hf_dir = tmp_path / "hf"
  shutil.copytree(exports["huggingface"], hf_dir)
  with open(hf_dir / "vocab.txt", "a") as f:
    f.write("".join(f"extra{i}\n" for i in range(10)))
  with pytest.raises(ValueError, match=r"vocab.txt has 111 ids but the model in .*/hf has vocab_size=104"):
    pretrained.load(str(hf_dir))


def _flip_a_byte(path: pathlib.Path) -> None:
  content = bytearray(path.read_bytes())
  content[len(content) // 2] ^= 1
  path.write_bytes(bytes(content))


def _rehash(bundle: pathlib.Path, name: str) -> None:
  """Records the present SHA-256 of `name` in the bundle's manifest: damage that the hashes do not catch."""
  manifest = json.loads((bundle / "manifest.json").read_text())
  manifest["files"][name] = tokenizer_lib.file_sha256(bundle / name)
  (bundle / "manifest.json").write_text(json.dumps(manifest))


def test_a_flipped_bit_in_a_bundle_is_refused_by_every_read_naming_the_file(exports, tmp_path, monkeypatch):
  bundle = tmp_path / "bundle"
  shutil.copytree(exports["bundle"], bundle)
  hashed = []
  monkeypatch.setattr(formats, "file_sha256", lambda path: hashed.append(str(path)) or tokenizer_lib.file_sha256(path))
  pretrained.load(str(bundle))
  manifest = json.loads((bundle / "manifest.json").read_text())
  assert sorted(hashed) == sorted(str(bundle / name) for name in manifest["files"] if name != "vocab.txt")  # Once.
  data_file = next(p for p in sorted((bundle / "params").rglob("*")) if p.is_file() and p.stat().st_size > 1000)
  _flip_a_byte(data_file)
  name = str(data_file.relative_to(bundle))
  with pytest.raises(ValueError, match=rf"Bundle {bundle} does not match its manifest: \['{name}: changed'\]"):
    pretrained.load(str(bundle))
  with pytest.raises(ValueError, match=rf"{name}: changed"):  # --mode=export's path: nothing is written.
    export.export(str(bundle), str(tmp_path / "hf"), "huggingface")
  assert not (tmp_path / "hf").exists() and os.listdir(tmp_path) == ["bundle"]


def test_a_loaded_config_out_of_range_or_a_non_finite_weight_is_refused_naming_the_file(exports, tmp_path):
  hf_dir, bundle = tmp_path / "hf", tmp_path / "bundle"
  shutil.copytree(exports["huggingface"], hf_dir)
  shutil.copytree(exports["bundle"], bundle)
  for config_file in (hf_dir / "config.json", bundle / "bert_config.json"):
    fields = json.loads(config_file.read_text())
    config_file.write_text(json.dumps(dict(fields, layer_norm_eps=-1.0)))
    _rehash(bundle, "bert_config.json")
    with pytest.raises(ValueError, match=rf"{config_file}: model.layer_norm_eps=-1.0 must be positive"):
      pretrained.load(str(config_file.parent))
    config_file.write_text(json.dumps(dict(fields, initializer_range=0)))
    _rehash(bundle, "bert_config.json")
    with pytest.raises(ValueError, match=rf"{config_file}: model.initializer_range=0 must be positive"):
      pretrained.load(str(config_file.parent))
    config_file.write_text(json.dumps(dict(fields, vocab_size=10**12)))  # JAX's OverflowError, naming nothing.
    _rehash(bundle, "bert_config.json")
    with pytest.raises(ValueError, match=rf"{config_file}: model.vocab_size=1000000000000 must be in \[1, 16777216\]"):
      pretrained.load(str(config_file.parent))
    config_file.write_text(json.dumps(fields))
  tensors = load_safetensors(hf_dir / "model.safetensors")
  tensors["bert.encoder.layer.1.output.dense.weight"][3, 5] = np.nan
  save_safetensors(tensors, hf_dir / "model.safetensors")
  with pytest.raises(
    ValueError, match=r"hf/model.safetensors: tensors \['bert.encoder.layer.1.output.dense.weight'\] hold NaN or inf"
  ):
    pretrained.load(str(hf_dir))


def test_a_damaged_file_is_refused_naming_its_path_not_with_a_bare_library_error(exports, tmp_path, monkeypatch):
  # A damaged OCDBT index met by Orbax's reads of every array at once left dozens of "Event loop is closed" from their
  # callbacks after the error (pytest's unraisable-exception warning at the end of the session).
  unraisable = []
  monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
  hf_dir, bundle = tmp_path / "hf", tmp_path / "bundle"
  shutil.copytree(exports["huggingface"], hf_dir)
  weights = hf_dir / "model.safetensors"
  weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
  with pytest.raises(ValueError, match=rf"{weights} is not a readable safetensors file \(truncated or damaged\?\)"):
    pretrained.load(str(hf_dir))
  for name in ("params/_METADATA", "params/manifest.ocdbt"):  # Damage that the manifest's hashes do not catch.
    shutil.rmtree(bundle, ignore_errors=True)
    shutil.copytree(exports["bundle"], bundle)
    (bundle / name).write_bytes((bundle / name).read_bytes()[:40])
    _rehash(bundle, name)
    with pytest.raises(ValueError, match=rf"{bundle}/params cannot be restored as this bundle's parameters"):
      pretrained.load(str(bundle))
  gc.collect()  # What is left of the failed reads goes now, while the hook listens.
  assert not unraisable, [str(u.exc_value) for u in unraisable]
