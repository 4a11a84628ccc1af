"""Distillation: DistilBERT's loss and task distillation's against hand computations, the student's start from its
teacher's layers, the teacher as a frozen input sharded on the mesh, and a run from a teacher workdir."""

import dataclasses
import functools
import re
import shutil
import time
import types

import flax.linen as nn
import jax
import numpy as np
import pytest
from etils import epath

from bert_jax import flops, jobs, sharding
from bert_jax.dry_run import ahead_of_time
from bert_jax.finetune import job, losses, tasks
from bert_jax.finetune import plan as plan_lib
from bert_jax.handoff import export, pretrained
from bert_jax.model import bert_config, param_layout
from bert_jax.model.encoder import BertForPretraining, init_params
from bert_jax.model.heads import TaskHead
from bert_jax.train import pretraining_start, start_order
from bert_jax.train import run as run_lib
from bert_jax.train.objectives import bert, distillation, registry
from bert_jax.train.optim import make_optimizer
from bert_jax.workdir import checkpoints, reading
from configs import default, distil, glue
from tests import helpers
from tests.helpers import log_softmax, logged_by_start_order, synthetic_batches, write_sst2
from tests.test_roberta import check_fine_tunes

T, ALPHA_CE, ALPHA_MLM, ALPHA_COS = 2.0, 5.0, 2.0, 1.0


def _params(model, seed: int) -> dict:
  return jax.device_get(jax.jit(lambda key: nn.meta.unbox(init_params(model, key)))(jax.random.key(seed)))


def _kl(student, teacher):
  """T^2 KL(softmax(teacher / T) || softmax(student / T)), float64."""
  s, t = log_softmax(np.float64(student) / T), log_softmax(np.float64(teacher) / T)
  return T**2 * (np.exp(t) * (t - s)).sum(-1)


def _xent(logits, labels):
  return -np.take_along_axis(log_softmax(np.float64(logits)), labels[..., None], -1)[..., 0]


@pytest.fixture
def teacher_and_student(small_model_config):
  """A 2-layer teacher and a 1-layer student of the small BERT, with different random weights."""
  teacher_cfg = dataclasses.replace(small_model_config, hidden_dropout_prob=0.0, attention_dropout_prob=0.0)
  student_cfg = dataclasses.replace(small_model_config, num_layers=1)
  teacher, student = BertForPretraining(teacher_cfg), BertForPretraining(student_cfg)
  return teacher, _params(teacher, 1), student, _params(student, 2)


@pytest.mark.slow
def test_the_distillation_loss_equals_a_hand_computation(small_config, teacher_and_student):
  teacher, teacher_params, student, student_params = teacher_and_student
  # A teacher that prefers some words: its soft targets are far from the student's, and the KL term counts.
  teacher_params = dict(teacher_params, mlm_output_bias=np.random.default_rng(0).normal(0, 3, 101).astype(np.float32))
  small_config.data.max_seq_length = 24
  batch = synthetic_batches(small_config, 1)[0]
  assert (batch["input_mask"] == 0).any() and (batch["masked_lm_weights"] == 0).any()  # Padding in both.
  frozen = run_lib.Frozen("teacher", teacher, {}, None)
  small_config.distill.update(temperature=T, alpha_ce=ALPHA_CE, alpha_mlm=ALPHA_MLM, alpha_cos=ALPHA_COS)
  loss = distillation.make_loss(small_config, frozen)
  value = jax.jit(functools.partial(loss.value, model=student))
  got, metrics = value(student_params, batch, frozen=teacher_params)

  inputs = bert.model_inputs(batch)
  outputs = jax.jit(lambda a, b: (student.apply({"params": a}, **inputs), teacher.apply({"params": b}, **inputs)))
  s, t = jax.device_get(outputs(student_params, teacher_params))
  weights, labels, real = batch["masked_lm_weights"], batch["masked_lm_ids"], batch["input_mask"] > 0
  kl = (_kl(s["mlm_logits"], t["mlm_logits"]) * weights).sum()
  xent = (_xent(s["mlm_logits"], labels) * weights).sum()
  a, b = np.float64(s["sequence_output"]), np.float64(t["sequence_output"])
  cosine = (1 - (a * b).sum(-1) / np.sqrt((a * a).sum(-1) * (b * b).sum(-1)))[real].sum()
  expected = (ALPHA_CE * kl + ALPHA_MLM * xent) / (weights.sum() + 1e-5) + ALPHA_COS * cosine / real.sum()
  np.testing.assert_allclose(float(got), expected, rtol=1e-5)
  assert kl > 0.1 * xent  # Each term weighs in the total.
  np.testing.assert_allclose(
    [metrics["kl_loss"], metrics["mlm_loss"], metrics["cosine_loss"]], [kl, xent, cosine], rtol=1e-5
  )
  assert metrics["kl_count"] == metrics["mlm_count"] == weights.sum() and metrics["cosine_count"] == real.sum()
  teacher_xent = (_xent(t["mlm_logits"], labels) * weights).sum()
  np.testing.assert_allclose(metrics["teacher_loss"], teacher_xent, rtol=1e-5)

  # Microbatches add up: each half, divided by the whole batch's normalizers, sums to the whole batch's loss.
  normalizers = loss.normalizers(batch)
  half = lambda i: jax.tree.map(lambda x: x[i::2], batch)  # noqa: E731
  halves = [value(student_params, half(i), normalizers=normalizers, frozen=teacher_params)[0] for i in (0, 1)]
  np.testing.assert_allclose(float(sum(halves)), float(got), rtol=1e-6)


@pytest.mark.slow
def test_the_student_starts_from_every_other_teacher_layer_copied(small_config, small_model_config):
  teacher_cfg = dataclasses.replace(small_model_config, num_layers=4)
  teacher = _params(BertForPretraining(teacher_cfg), 0)
  placed = jax.device_put(teacher)
  student = distillation.student_params(placed, (0, 2), 4, scanned=False)
  assert sorted(student["bert"]) == ["embeddings", "layer_0", "layer_1", "pooler"]
  expected = dict(
    teacher, bert=dict(teacher["bert"], layer_0=teacher["bert"]["layer_0"], layer_1=teacher["bert"]["layer_2"])
  )
  del expected["bert"]["layer_2"], expected["bert"]["layer_3"]
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(student), expected)
  # Copies: the train state is donated every step, the teacher's parameters must survive it.
  pointers = lambda tree: {x.unsafe_buffer_pointer() for x in jax.tree.leaves(tree)}  # noqa: E731
  assert not pointers(student) & pointers(placed)
  # Either layout gives the same student.
  scanned = distillation.student_params(param_layout.convert(placed, scanned=True), (0, 2), 4, scanned=True)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(param_layout.convert(scanned, scanned=False)), expected)
  # DistilBERT's own choice of layers, by config.
  small_config.model.num_layers = 6
  assert distillation.student_layers(small_config) == (0, 2, 4, 6, 8, 10)
  small_config.distill.student_layers = (0, 2, 4, 7, 9, 11)
  assert distillation.student_layers(small_config) == (0, 2, 4, 7, 9, 11)


def _distillation_run(config, devices, teacher, teacher_params):
  """The distillation run of `config` on `devices` with `teacher` read from host memory into the shardings
  `pretrained.param_shardings` gives on the run's mesh."""
  frozen = run_lib.Frozen(
    "teacher",
    teacher,
    {"path": "in memory"},
    lambda mesh, rules: jax.device_put(teacher_params, pretrained.param_shardings(teacher.config, mesh, rules)),
  )
  student = BertForPretraining(dataclasses.replace(bert_config.model_config(config), num_layers=1))
  loss = distillation.make_loss(config, frozen)
  return run_lib.make_run(config, student, loss, make_optimizer(config), devices=devices, frozen=frozen).read_frozen()


@pytest.mark.slow
def test_one_step_with_the_teacher_sharded_fsdp_over_eight_devices_equals_one_device(small_config, teacher_and_student):
  teacher, teacher_params, _, _ = teacher_and_student
  small_config.model.update(hidden_dropout_prob=0.0, attention_dropout_prob=0.0)  # The step's loss: the plain one.
  small_config.mesh.update(data=1, fsdp=-1, tensor=1)
  batch = synthetic_batches(small_config, 1)[0]
  the_run = _distillation_run(small_config, jax.devices(), teacher, teacher_params)
  expected = pretrained.param_shardings(teacher.config, the_run.mesh, the_run.rules)
  assert jax.tree.map(lambda x: x.sharding, the_run.frozen_args[0]) == expected
  query = expected["bert"]["layer_0"]["attention"]["query"]["kernel"]
  assert query.spec[0] == "fsdp" and query.mesh.shape["fsdp"] == 8
  state = the_run.init_state(small_config.seed)
  student_params = jax.device_get(state.params)
  args = (state, sharding.global_batch(batch, the_run.mesh), jax.random.key(3), *the_run.frozen_args)
  compiled = the_run.train_step.lower(*args).compile()
  # The compiled step takes the teacher in those shardings (None: parameters it never reads, its pooler and NSP).
  taken = jax.tree.leaves(compiled.input_shardings[0][3], is_leaf=lambda x: x is None)
  assert [s.spec for s in taken if s is not None] == [
    e.spec for s, e in zip(taken, jax.tree.leaves(expected), strict=True) if s is not None
  ]
  assert sum(s is None for s in taken) == 4
  _, metrics = compiled(*args)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(the_run.frozen_args[0]), teacher_params)  # Not donated.

  one_device = jax.jit(functools.partial(the_run.loss.value, model=the_run.model))
  expected_loss, _ = one_device(student_params, batch, frozen=teacher_params)  # Host arrays: on one device.
  np.testing.assert_allclose(float(metrics["loss"]), float(expected_loss), rtol=1e-6)


class _Tiny(nn.Module):
  """A stand-in for a task model (the loss's arithmetic is under test, not BERT's): logits from an embedding of each
  token, [batch, seq, width]; of the first token for the row heads, [batch, width]."""

  head: str
  width: int

  def dummy_inputs(self):
    ids = jax.numpy.zeros((1, 1), jax.numpy.int32)
    return ids, ids, ids

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, deterministic=True):
    out = nn.Embed(101, self.width, embedding_init=nn.initializers.normal(3.0))(input_ids)
    return {"logits": out if self.head in ("span", "token") else out[:, 0]}


WIDTHS = {"classification": 3, "regression": 1, "span": 2, "token": 4, "choice": 1}


def _task_batch(head: str, rows: int, rng) -> dict:
  batch = {name: np.zeros(shape, dtype) for name, (shape, dtype) in losses.batch_shapes(head, rows, 10).items()}
  batch["input_ids"] = rng.integers(5, 101, batch["input_ids"].shape).astype(np.int32)
  batch["weight"][:] = 1.0
  batch["weight"][-1] = 0.0  # A padding row.
  if head == "span":
    batch["start_positions"], batch["end_positions"] = rng.integers(0, 10, (2, rows)).astype(np.int32)
  elif head == "token":
    batch["labels"] = rng.integers(0, 4, (rows, 10)).astype(np.int32)
    batch["label_weights"] = (rng.random((rows, 10)) < 0.5).astype(np.float32)
  elif head == "regression":
    batch["label"] = rng.normal(size=rows).astype(np.float32)
  else:
    batch["label"] = rng.integers(0, 3, rows).astype(np.int32)
  return batch


@functools.partial(jax.jit, static_argnums=(0, 1))
def _task_outputs(head: str, model, student, teacher, batch):
  """(the distilled loss and metrics (alpha_hard 0.3), the undistilled metrics, the student's and teacher's logits)."""
  got = losses.distilled(head, model, T, alpha_hard=0.3).value(student, batch, model, frozen=teacher)
  undistilled = losses.make_loss(head).value(student, batch, model)[1]
  return got, undistilled, losses.logits(student, batch, model), losses.logits(teacher, batch, model)


def test_the_task_distillation_loss_equals_a_hand_computation():
  rng = np.random.default_rng(0)
  for head in ("classification", "regression", "span", "token"):
    model = _Tiny(head, WIDTHS[head])
    batch = _task_batch(head, 6, rng)
    student, teacher = (_params(model, seed) for seed in (1, 2))
    (got, metrics), undistilled, s, t = jax.device_get(_task_outputs(head, model, student, teacher, batch))
    s, t = np.float64(s), np.float64(t)
    weights = batch["weight"]
    if head == "regression":
      hard, soft = (s[:, 0] - batch["label"]) ** 2, (s[:, 0] - t[:, 0]) ** 2
    elif head == "span":
      hard = (_xent(s[..., 0], batch["start_positions"]) + _xent(s[..., 1], batch["end_positions"])) / 2
      soft = (_kl(s[..., 0], t[..., 0]) + _kl(s[..., 1], t[..., 1])) / 2
    elif head == "token":
      hard, soft = _xent(s, batch["labels"]), _kl(s, t)
      weights = batch["label_weights"] * weights[:, None]
    else:
      hard, soft = _xent(s, batch["label"]), _kl(s, t)
    expected = ((0.3 * hard + 0.7 * soft) * weights).sum() / (weights.sum() + 1e-5)
    assert (soft * weights).sum() > 0.1 * (hard * weights).sum(), head  # Both terms weigh in.
    np.testing.assert_allclose(float(got), expected, rtol=1e-5, err_msg=head)
    sums = [metrics["task_loss"], metrics["distill_loss"], metrics["distill_count"]]
    np.testing.assert_allclose(sums, [(hard * weights).sum(), (soft * weights).sum(), weights.sum()], rtol=1e-5)
    np.testing.assert_allclose(undistilled["task_loss"], metrics["task_loss"], rtol=1e-6)  # The hard part.


def test_a_sweep_shares_one_teacher_and_each_member_trains_as_it_would_alone(small_config):
  """The members' vmap takes the teacher unbatched (in_axes None): member 0 of two is the run of one."""
  model = _Tiny("classification", 3)
  teacher = _params(model, 2)
  frozen = run_lib.Frozen("teacher", model, {}, lambda mesh, rules: jax.device_put(teacher))
  rows = _task_batch("classification", 8, np.random.default_rng(0))
  batch = jax.tree.map(lambda x, y: np.stack([x, y]), rows, _task_batch("classification", 8, np.random.default_rng(1)))
  small_config.mesh.update(data=-1, fsdp=1, tensor=1)
  loss = losses.distilled("classification", model, T, 0.5)
  results = []
  for members, seeds, rows_of in ((2, [0, 1], batch), (0, 0, rows)):
    the_run = run_lib.make_run(small_config, model, loss, make_optimizer(small_config), members=members, frozen=frozen)
    the_run = the_run.read_frozen()
    keys = jax.numpy.stack([jax.random.key(5)] * 2) if members else jax.random.key(5)
    rows_of = sharding.global_batch(rows_of, the_run.mesh, members=bool(members))
    _, metrics = the_run.train_step(the_run.init_state(seeds), rows_of, keys, *the_run.frozen_args)
    results.append(jax.device_get(metrics))
  np.testing.assert_allclose(results[0]["loss"][0], results[1]["loss"], rtol=1e-6)
  assert results[0]["loss"][0] != results[0]["loss"][1]  # The other member: its own rows and seed.


@pytest.mark.slow
def test_a_distillation_run_from_a_teacher_workdir_records_it_and_a_resume_refuses_another_but_takes_a_copy(
  wordpiece_run, tmp_path
):
  teacher_dir, config, teacher_params = wordpiece_run
  config = config.copy_and_resolve_references()
  config.update(objective="distillation", eval_steps=0, num_train_steps=1, checkpoint_every_steps=1)
  config.data.instances = "doc_sentences"  # DistilBERT has no sentence task.
  config.distill.teacher = teacher_dir
  config.model.num_layers = 1
  workdir = str(tmp_path / "student")
  # A teacher that does not fit is named, with the values, before anything is written.
  wide = config.copy_and_resolve_references()
  wide.model.update(hidden_size=64, intermediate_size=64, hidden_act="gelu_new")
  sizes = "['model.hidden_size: 32 vs 64', 'model.intermediate_size: 48 vs 64', 'model.hidden_act: gelu vs gelu_new']"
  with pytest.raises(ValueError, match=re.escape(f"(teacher vs student): {sizes}")):
    jobs.run(wide, workdir, "pretrain")
  deep = config.copy_and_resolve_references()
  deep.distill.student_layers = (2,)
  with pytest.raises(ValueError, match=r"from teacher layers \(2,\), but distill.teacher=.* has 2 layers \(0 to 1\)"):
    jobs.run(deep, workdir, "pretrain")
  other_vocab = config.copy_and_resolve_references()
  other_vocab.tokenizer.path = str(tmp_path / "vocab.txt")
  (tmp_path / "vocab.txt").write_text(open(config.tokenizer.path).read().replace("w94", "w95"))
  with pytest.raises(ValueError, match=r"distill.teacher=.* was trained with tokenizer .* the config's is"):
    jobs.run(other_vocab, workdir, "pretrain")
  assert not (tmp_path / "student").exists()

  state = jobs.run(config, workdir, "pretrain")
  # Warmup: step 0's learning rate is 0, so the student is still the teacher's layer 0 and the rest of it.
  expected = dict(teacher_params, bert={k: v for k, v in teacher_params["bert"].items() if k != "layer_1"})
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(state.params), expected)
  identity = {"path": f"{teacher_dir}/checkpoints/2", "format": "workdir", "step": 2}
  with checkpoints.read_only_manager(workdir) as manager:
    assert reading.read_history(manager, 1)["teacher"] == identity
    assert reading.read_config(manager, 1)["objective"] == "distillation"
  assert pretrained.load(workdir).config.num_layers == 1  # The student is a BERT: every hand-off reads it.
  check_fine_tunes(workdir, tmp_path)  # And fine-tuning starts from it.
  objective = registry.of("distillation")
  frozen = objective.frozen(config, bert_config.model_config(config))
  assert frozen.identity == identity
  start_order.check_frozen(workdir, 1, frozen)  # The same teacher resumes.
  # The dry run compiles the step with the abstract teacher (its HBM counted) and counts its forward pass.
  planned = ahead_of_time.make_job(config, jax.devices())
  teacher_cfg = frozen.model.config
  expected = pretrained.param_shardings(teacher_cfg, planned.run.mesh, config.logical_axis_rules)
  assert jax.tree.map(lambda a: a.sharding, planned.train_args[3]) == expected == planned.run.frozen_shardings
  assert jax.tree.map(lambda a: a.shape, planned.eval_args[2]) == jax.tree.map(np.shape, teacher_params)
  seq, preds = config.data.max_seq_length, config.data.max_predictions_per_seq
  student_flops = flops.train_flops_per_step(planned.spec.model_cfg, config.batch_size, seq, preds)
  teacher_flops = flops.train_flops_per_step(teacher_cfg, config.batch_size, seq, preds) / 3
  assert planned.spec.train_flops == pytest.approx(student_flops + teacher_flops)
  assert planned.spec.eval_flops == pytest.approx(student_flops / 3 + teacher_flops)

  config.num_train_steps = 2
  config.distill.teacher = workdir  # Another teacher (the student itself fits): refused before anything is written.
  files = sorted(p.name for p in (tmp_path / "student").rglob("*"))
  message = (
    f"checkpoints/1 was trained with other inputs: distill.teacher={workdir}: its content differs from {teacher_dir}'s"
  )
  with pytest.raises(ValueError, match=re.escape(message)):
    jobs.run(config, workdir, "pretrain")
  assert sorted(p.name for p in (tmp_path / "student").rglob("*")) == files
  other = tmp_path / "other_teacher"  # The same teacher at another path resumes, with a line saying so.
  shutil.copytree(teacher_dir, other)
  config.distill.teacher = str(other)
  with pytest.MonkeyPatch.context() as patch:
    lines = logged_by_start_order(patch)
    jobs.run(config, workdir, "pretrain")
  assert f"distill.teacher={other} has the same content as {teacher_dir}, which trained the checkpoint." in lines
  with checkpoints.read_only_manager(workdir) as manager:
    assert reading.read_history(manager, 2)[start_order.INPUTS]["distill.teacher"]["path"] == str(other)
  config.update(objective="bert")
  config.distill.teacher = ""
  with pytest.raises(ValueError, match=r"was trained with objective='distillation'; this config's is 'bert'"):
    jobs.run(config, workdir, "pretrain")


def test_fine_tuning_reads_a_teacher_fine_tuned_on_its_task_onto_its_mesh(wordpiece_run, tmp_path):
  pretrained_dir = wordpiece_run[0]
  # The teacher: the session's encoder with an SST-2 head, as transformers' BertForSequenceClassification.
  loaded = pretrained.load(pretrained_dir)
  task = TaskHead("sst2", "classification", ("0", "1"))
  head = {"kernel": np.random.default_rng(0).normal(0, 1, (32, 2)).astype(np.float32), "bias": np.zeros(2, np.float32)}
  teacher = dataclasses.replace(
    loaded,
    params=dict(bert=loaded.params["bert"], classifier=head),
    source=dataclasses.replace(loaded.source, task=task),
  )
  (tmp_path / "teacher").mkdir()
  export._write_huggingface(teacher, epath.Path(tmp_path / "teacher"))
  write_sst2(tmp_path / "SST-2")
  config = glue.get_config()
  config.finetune.update(task="sst2", data_dir=str(tmp_path / "SST-2"), max_seq_length=16)
  config.update(init_from=pretrained_dir, batch_size=8, learning_rate=1e-3)
  config.distill.teacher = pretrained_dir  # Not fine-tuned.
  with pytest.raises(ValueError, match=r"is not a fine-tuned model; task distillation needs one fine-tuned on 'sst2'"):
    distillation.task_teacher(config, loaded.config, task)
  config.distill.teacher = str(tmp_path / "teacher")
  other_task = TaskHead("mrpc", "classification", ("0", "1"))
  with pytest.raises(ValueError, match=r"was fine-tuned on 'sst2' \(classification head, labels \['0', '1'\]\); this"):
    distillation.task_teacher(config, loaded.config, other_task)

  # The job reads the teacher onto its mesh in its model's shardings, as the loss's frozen input (the loop, the
  # sweep's shared teacher and the loss are tested above; a changed distill.teacher is a run key: a resume refuses it).
  checked = jobs.check(config, "finetune")
  sst2 = tasks.make_task(config.finetune)
  splits = job._read_splits(sst2, loaded.tokenizer, 16)
  plan = plan_lib.make_plan(config, checked.members, loaded, splits.train.num_rows)
  spec = plan_lib.job_spec(config, plan, sst2, tokenizer_identity=loaded.tokenizer.identity())
  finetuning = job.FinetuningJob(config, plan, str(tmp_path / "student"), sst2, loaded, loaded.tokenizer, splits, spec)
  the_run = finetuning.run
  (read,) = the_run.frozen_args
  expected = pretrained.param_shardings(the_run.frozen.model.config, the_run.mesh, the_run.rules, task)
  assert jax.tree.map(lambda x: x.sharding, read) == expected
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(read), jax.device_get(teacher.params))
  assert the_run.frozen.identity == {"path": str(tmp_path / "teacher"), "format": "huggingface", "step": None}
  assert the_run.loss.value.func is losses.distilled_loss and "distill.teacher" in job.RUN_KEYS
  assert not (tmp_path / "student").exists()


def test_a_resume_knows_its_teacher_and_init_from_by_content_not_by_path(tmp_path, monkeypatch):
  """A distillation checkpoint records its teacher and init_from by content. Copies at other paths resume, each with
  a line saying so; an init_from that is gone is not read on a resume, so not compared; a teacher or init_from with
  other content is refused naming it. A checkpoint from before the record resumes with a warning, its teacher
  compared by path as before."""
  teacher, other, copy = tmp_path / "teacher", tmp_path / "other", tmp_path / "copy"
  helpers.write_checkpoint(teacher, default.get_config(), {})  # Pretraining workdirs' steps: metadata and checksums.
  helpers.write_checkpoint(other, default.get_config(), {}, value=2.0)  # Other weights.
  shutil.copytree(teacher, copy)
  config = default.get_config()
  config.update(objective="distillation", init_from=str(teacher))
  config.distill.teacher = str(teacher)
  student = tmp_path / "student"
  inputs = pretraining_start.run_inputs(config)
  assert [i.key for i in inputs] == ["distill.teacher", "init_from"]
  helpers.write_checkpoint(student, config, {start_order.INPUTS: start_order.record_inputs(inputs)})

  def resume(teacher, init_from, workdir=student):
    named = config.copy_and_resolve_references()
    named.distill.teacher, named.init_from = str(teacher), str(init_from)
    identity = {"path": f"{teacher}/checkpoints/1", "format": "workdir", "step": 1}  # As distillation.teacher says.
    run = types.SimpleNamespace(frozen=run_lib.Frozen("teacher", None, identity, None), read_frozen=lambda: run)
    return pretraining_start.find_origin(named, str(workdir), None, run)[0]

  with monkeypatch.context() as patch:
    lines = logged_by_start_order(patch)
    assert [i.key for i in resume(copy, copy).inputs] == ["distill.teacher", "init_from"]
    resume(copy, tmp_path / "gone")
  same = "has the same content as {}, which trained the checkpoint."
  assert lines == [
    f"distill.teacher={copy} {same.format(teacher)}",
    f"init_from={copy} {same.format(teacher)}",
    f"distill.teacher={copy} {same.format(teacher)}",
    f"init_from={tmp_path}/gone is not read on a resume and is not compared: init_from={tmp_path}/gone: "
    f"{tmp_path}/gone does not exist.",
  ]
  differs = f"its content differs from {teacher}'s (step 1, checksums "
  with pytest.raises(
    ValueError, match=re.escape(f"checkpoints/1 was trained with other inputs: distill.teacher={other}: {differs}")
  ):
    resume(other, teacher)
  with pytest.raises(ValueError, match=re.escape(f": init_from={other}: {differs}")):
    resume(teacher, other)

  old = tmp_path / "old"  # Written before checkpoints recorded their inputs: its teacher compared by path.
  helpers.write_checkpoint(
    old, config, {"teacher": {"path": f"{teacher}/checkpoints/1", "format": "workdir", "step": 1}}
  )
  with monkeypatch.context() as patch:
    lines = logged_by_start_order(patch)
    resume(teacher, teacher, old)
  assert lines == [
    f"{old}/checkpoints/1 was written before checkpoints recorded their inputs' content: distill.teacher, init_from "
    "compared by path only."
  ]
  with pytest.raises(ValueError, match=re.escape(f"checkpoints/1 was trained with the teacher {{'path': '{teacher}/")):
    resume(copy, teacher, old)


def test_the_shipped_distil_config_is_refused_at_once_naming_its_placeholder_teacher():
  """configs/distil.py ships `gs://BUCKET/bert-base`: refused by the config checks, before any network call (it
  spent 51 s on credential retries, then a traceback that never named the key)."""
  start = time.perf_counter()
  with pytest.raises(ValueError, match=re.escape("distill.teacher='gs://BUCKET/bert-base' names the placeholder buc")):
    jobs.check(distil.get_config(), "pretrain")
  assert time.perf_counter() - start < 0.5


BAD_SETTINGS = [
  (
    dict(objective="spanbert"),
    "objective='spanbert'; expected one of ('bert', 'distillation', 'electra', 'span_boundary').",
  ),
  (dict(objective="bert"), "distill.teacher='/a/bert-base' is set, but objective='bert'"),
  (dict(distill=dict(teacher="")), "objective='distillation' needs distill.teacher"),
  (dict(data=dict(instances="nsp")), "objective='distillation' with data.instances='nsp': this objective has no"),
  (dict(distill=dict(temperature=0.0)), "distill.temperature=0.0 must be positive."),
  (dict(distill=dict(alpha_cos=-1.0)), "distill.alpha_cos=-1.0 must be non-negative."),
  (dict(distill=dict(alpha_ce=0.0, alpha_mlm=0.0, alpha_cos=0.0)), "alpha_mlm and alpha_cos are all 0"),
  (dict(distill=dict(student_layers=(0, 2))), "distill.student_layers=(0, 2) must name one teacher layer (from 0) per"),
  (dict(distill=dict(student_layers=(0, 2, 4, 7, 9, -1))), "student layer: model.num_layers=6 of them"),
]


@pytest.mark.parametrize("overrides,message", BAD_SETTINGS, ids=[m[:40] for _, m in BAD_SETTINGS])
def test_a_bad_distillation_setting_is_refused_naming_it(overrides, message):
  config = distil.get_config()
  config.distill.teacher = "/a/bert-base"  # For the shipped placeholder: the test above.
  jobs.check(config, "pretrain")  # As shipped, and with DistilBERT's own layers.
  config.distill.student_layers = (0, 2, 4, 7, 9, 11)
  jobs.check(config, "pretrain")
  config.update(overrides)
  with pytest.raises(ValueError, match=re.escape(message)):
    jobs.check(config, "pretrain")
  finetuning = glue.get_config()
  finetuning.distill.update(teacher="/a/teacher", alpha_hard=1.5)
  with pytest.raises(ValueError, match=re.escape("distill.alpha_hard=1.5 must be in [0, 1].")):
    jobs.check(finetuning, "finetune")
