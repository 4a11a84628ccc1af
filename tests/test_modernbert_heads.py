"""ModernBERT's fine-tuning heads (model/heads.py) against transformers' ModernBertFor{SequenceClassification,
TokenClassification, QuestionAnswering, MultipleChoice} built from a config with random weights: the logits, the loss
and every parameter's gradient, on padded rows longer than the local window, with "cls" and "mean" pooling; the
task models' Hugging Face files both ways; a fine-tuning run's start from a masked LM (its prediction head, and the
classifier_* it leaves to the source) against transformers' from_pretrained; and a short fine-tuning run from a
ModernBertForMaskedLM directory, whose export transformers' task class loads."""

import dataclasses
import json
import os
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import jobs
from bert_jax.finetune import losses
from bert_jax.finetune import plan as plan_lib
from bert_jax.handoff import hf_format, pretrained
from bert_jax.model.bert_config import BertConfig
from bert_jax.model.encoder import BertForPretraining, abstract_params, init_params
from bert_jax.model.heads import TaskHead, task_model
from configs import glue
from tests import helpers
from tests.helpers import check_exports, config_of_hf, hf_loss_and_logits, write_sst2
from tests.test_modernbert import _hf_config, _masked_lm, bpe_files  # noqa: F401 (bpe_files: a fixture)
from tests.test_roberta import check_hf_round_trip, write_hf_directory

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

NUM_LABELS = {"classification": 3, "regression": 1, "span": 2, "token": 5, "choice": 1}
HF_CLASSES = {
  "classification": "ModernBertForSequenceClassification",
  "regression": "ModernBertForSequenceClassification",
  "span": "ModernBertForQuestionAnswering",
  "token": "ModernBertForTokenClassification",
  "choice": "ModernBertForMultipleChoice",
}
# Rows of 24 tokens, longer than _hf_config's local window of 8 (4 keys each side); the first row of each batch is full,
# the others padded.
CHOICES, BATCH, SEQ, PAD, HALF_WINDOW = 3, 4, 24, 0, 4
# The head's fields away from transformers' defaults, so that each is read where it should be: biases on the head's
# dense layer and every norm, an activation other than the layers'.
HEAD_FIELDS = dict(classifier_bias=True, norm_bias=True, classifier_activation="silu")


def _hf_task_model(head: str, pooling: str, **overrides):
  """transformers' task model of `head` with random weights, every norm and bias moved off its initial 1 or 0; two
  layers (a global one, then a local one) keep the compilation short."""
  config = _hf_config(
    num_hidden_layers=2,
    global_attn_every_n_layers=2,
    num_labels=NUM_LABELS[head],
    classifier_pooling=pooling,
    problem_type="regression" if head == "regression" else None,
    **overrides,
  )
  torch.manual_seed(0)
  model = getattr(transformers, HF_CLASSES[head])._from_config(config, attn_implementation="eager").float().eval()
  with torch.no_grad():
    for name, param in model.named_parameters():
      if "norm" in name or name.endswith("bias"):
        param.add_(0.1 * torch.randn_like(param))
  return model


def _batch(head: str, vocab_size: int) -> dict:
  rng = np.random.default_rng(0)
  shape = (BATCH, CHOICES, SEQ) if head == "choice" else (BATCH, SEQ)
  # The span head's softmax reads padded positions, so their outputs' gradients count: a padded query whose local
  # window holds only padding has every score masked, and torch's additive mask still passes each score a gradient
  # (rounding keeps its trace in score + float32's min), where bert_jax's `where` passes none. Its rows keep their
  # padding within half a window, so that every query sees a real key; the other heads' rows are padded further.
  lengths = rng.integers(SEQ - HALF_WINDOW if head == "span" else 5, SEQ, shape[:-1])
  lengths[0] = SEQ
  input_mask = (np.arange(SEQ) < lengths[..., None]).astype(np.int32)
  batch = dict(
    input_ids=(rng.integers(3, vocab_size, shape) * input_mask + PAD * (1 - input_mask)).astype(np.int32),
    input_mask=input_mask,
    segment_ids=np.zeros(shape, np.int32),
    weight=np.ones(BATCH, np.float32),
  )
  if head in ("classification", "choice"):
    batch["label"] = rng.integers(0, NUM_LABELS[head] if head != "choice" else CHOICES, BATCH).astype(np.int32)
  elif head == "regression":
    batch["label"] = rng.uniform(0, 5, BATCH).astype(np.float32)
  elif head == "span":
    start = rng.integers(0, lengths)
    batch["start_positions"] = start.astype(np.int32)
    batch["end_positions"] = np.minimum(start + 2, lengths - 1).astype(np.int32)
  else:
    batch["labels"] = rng.integers(0, NUM_LABELS[head], shape).astype(np.int32)
    batch["label_weights"] = (rng.uniform(size=shape) < 0.6).astype(np.float32) * input_mask
  return batch


# Pooling is what the sequence and choice heads read; the token and span heads read every token.
@pytest.mark.parametrize(
  "head, pooling",
  [
    ("classification", "cls"),
    ("choice", "mean"),
    # Slow: the other heads' logits against transformers' are checked fast by the task models' files (below), and
    # each pooling by the two rows above.
    pytest.param("classification", "mean", marks=pytest.mark.slow),
    pytest.param("regression", "mean", marks=pytest.mark.slow),
    pytest.param("choice", "cls", marks=pytest.mark.slow),
    pytest.param("token", "cls", marks=pytest.mark.slow),
    pytest.param("span", "cls", marks=pytest.mark.slow),
  ],
)
def test_each_head_equals_transformers_logits_loss_and_every_gradient(head, pooling):
  hf = _hf_task_model(head, pooling, **HEAD_FIELDS)
  config = config_of_hf(hf.config)
  assert (config.classifier_pooling, config.classifier_activation, config.classifier_bias) == (pooling, "silu", True)
  tensors = {name: value.detach().numpy() for name, value in hf.state_dict().items()}
  params = jax.tree.map(jnp.asarray, hf_format.params_from_hf(tensors, config))
  model = task_model(config, head, NUM_LABELS[head])
  shapes = nn.meta.unbox(abstract_params(config, model))
  assert jax.tree.map(np.shape, params) == jax.tree.map(np.shape, shapes)  # Every parameter from the file, none fresh.
  assert {name: np.shape(value) for name, value in params["head"]["dense"].items()} == {
    "kernel": (32, 32),
    "bias": (32,),
  }
  batch = _batch(head, config.vocab_size)

  hf_loss, hf_logits = hf_loss_and_logits(hf, head, batch)
  hf_loss.backward()
  hf_grads = hf_format.params_from_hf({name: p.grad.numpy() for name, p in hf.named_parameters()}, config)

  def loss_and_logits(params):  # The fine-tuning loss, and the logits evaluation reads (no dropout either way).
    return losses.make_loss(head).value(params, batch, model)[0], losses.logits(params, batch, model)

  (loss, logits), grads = jax.jit(jax.value_and_grad(loss_and_logits, has_aux=True))(params)
  expected = hf_logits.detach().numpy()
  np.testing.assert_allclose(np.asarray(logits), expected.reshape(logits.shape), atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(float(loss), hf_loss.item(), rtol=1e-5)
  flat, flat_expected = (jax.tree_util.tree_flatten_with_path(tree)[0] for tree in (jax.device_get(grads), hf_grads))
  assert [path for path, _ in flat] == [path for path, _ in flat_expected]
  for (path, value), (_, want) in zip(flat, flat_expected, strict=True):
    if head == "span" and path[-2].key == "word_embeddings":
      # torch's Embedding(padding_idx) never updates [PAD]'s row, which the span head's softmax over padded positions
      # reads; bert_jax trains it (as Google BERT does).
      value, want = np.delete(value, PAD, axis=0), np.delete(want, PAD, axis=0)
    np.testing.assert_allclose(value, want, atol=5e-5, rtol=1e-4, err_msg=jax.tree_util.keystr(path))


def test_mean_pooling_reads_real_tokens_only_and_a_row_without_any_pools_to_zeros():
  """The padding rows of a last evaluation batch (no real token, weight 0) give finite logits, where transformers'
  division gives NaN; a real row's padded tail, whatever its tokens, changes nothing."""
  config = config_of_hf(_hf_config(classifier_pooling="mean", num_labels=2))
  model = task_model(config, "classification", 2)
  params = init_params(model, jax.random.key(0))
  ids = np.random.default_rng(0).integers(3, config.vocab_size, (3, SEQ)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[1, 10:] = 0
  mask[2] = 0
  other_tail = ids.copy()
  other_tail[1, 10:] = 7
  apply = jax.jit(model.apply)  # One program for both rows, not the model op by op.
  out, again = (apply({"params": params}, x, mask, np.zeros_like(ids)) for x in (ids, other_tail))
  np.testing.assert_array_equal(out["pooled_output"][2], 0.0)
  assert np.isfinite(out["logits"]).all()
  np.testing.assert_allclose(again["logits"][1], out["logits"][1], atol=1e-6)
  np.testing.assert_allclose(again["pooled_output"][1], out["pooled_output"][1], atol=1e-6)


def test_classifier_dropout_drops_out_the_head_s_output_in_training_only():
  hf_config = _hf_config(num_labels=2)  # The encoder's own dropouts are 0.
  ids = np.random.default_rng(0).integers(3, 101, (2, SEQ)).astype(np.int32)
  inputs = (ids, np.ones_like(ids), np.zeros_like(ids))
  for dropout, differs in ((0.0, False), (0.5, True)):
    model = task_model(config_of_hf(hf_config, classifier_dropout=dropout), "token", 2)
    params = init_params(model, jax.random.key(0))
    evaluated = model.apply({"params": params}, *inputs)["logits"]
    trained = model.apply({"params": params}, *inputs, deterministic=False, rngs={"dropout": jax.random.key(1)})
    assert (not np.allclose(trained["logits"], evaluated)) == differs, dropout


def test_the_masked_lm_s_head_is_the_prediction_head_of_classifier_activation_and_bias():
  """ModernBertForMaskedLM's head is the task models' ModernBertPredictionHead: its dense layer has
  `classifier_bias` and `classifier_activation`, not the layers' `attention_bias` and `hidden_activation`."""
  torch.manual_seed(0)
  hf = transformers.ModernBertForMaskedLM._from_config(_hf_config(**HEAD_FIELDS), attn_implementation="eager").eval()
  config = config_of_hf(hf.config)
  assert (config.linear_bias, config.hidden_act) == (False, "gelu")
  params = hf_format.params_from_hf({name: value.numpy() for name, value in hf.state_dict().items()}, config)
  assert set(params["mlm_transform"]) == {"kernel", "bias"}
  batch = _batch("token", config.vocab_size)
  with torch.no_grad():
    ids, mask = (torch.from_numpy(batch[name]).long() for name in ("input_ids", "input_mask"))
    expected = hf(input_ids=ids, attention_mask=mask).logits.numpy()
  positions = np.tile(np.arange(0, SEQ, 5), (BATCH, 1)).astype(np.int32)
  out = jax.jit(BertForPretraining(config).apply)(  # One program, not the model op by op.
    {"params": params}, batch["input_ids"], batch["input_mask"], batch["segment_ids"], positions
  )
  np.testing.assert_allclose(out["mlm_logits"], np.take_along_axis(expected, positions[..., None], 1), atol=5e-5)


def test_bert_s_heads_refuse_modernbert_s_head_fields_naming_each():
  """A BERT family's heads read no `classifier_*`: a value other than the default is refused, for a baseline before
  anything is read and for `init_from`'s encoder."""
  config = glue.get_config()
  config.finetune.update(task="sst2", data_dir="/nowhere")
  for name, value in (("classifier_pooling", "mean"), ("classifier_bias", True), ("classifier_dropout", 0.1)):
    config.model[name] = value
    message = rf"^model.{name}={value!r} sets ModernBERT's task heads, and model.model_type='bert' fine-tunes with"
    with pytest.raises(ValueError, match=message):
      jobs.check(config, "finetune")
    config.init_from = "/a/bert"
    with pytest.raises(ValueError, match=r"^init_from=/a/bert: " + message[1:]):
      plan_lib.model_config(config, types.SimpleNamespace(config=BertConfig(vocab_size=99)))
    config.init_from = ""
    config.model[name] = None  # Unset: the source's, else the default.
  # A ModernBERT takes them, from a baseline's config or onto init_from's encoder.
  config.model.update(model_type="modernbert", rope_theta=160000.0, classifier_pooling="mean", classifier_dropout=0.1)
  jobs.check(config, "finetune")
  config.init_from = "/a/modernbert"
  source = types.SimpleNamespace(config=config_of_hf(_hf_config()))
  model = plan_lib.model_config(config, source)
  assert (model.classifier_pooling, model.classifier_dropout, model.num_layers) == ("mean", 0.1, 4)


@pytest.mark.parametrize("head", ["classification", "regression", "span", "token", "choice"])
def test_a_task_model_s_files_load_with_their_head_and_export_as_transformers_reads_them(bpe_files, head, tmp_path):  # noqa: F811
  """A transformers task model's directory (no biases on the head's dense layer and norms: transformers' defaults)
  loads with its head, exports to a directory its class loads with nothing missing or unexpected, holding the
  tensors transformers writes, bitwise, and computes bert_jax's logits."""
  files, _ = bpe_files
  labels = {"classification": ("neg", "neutral", "pos"), "token": ("O", "B-PER", "I-PER", "B-LOC", "I-LOC")}
  hf_config = _masked_lm(bpe_files).config
  fields = dict(hf_config.to_dict(), classifier_pooling="mean" if head == "choice" else "cls")
  if head in labels:
    fields["id2label"] = dict(enumerate(labels[head]))
  else:
    fields.pop("id2label")
    fields.update(num_labels=NUM_LABELS[head], problem_type="regression" if head == "regression" else None)
  fields.pop("label2id")
  torch.manual_seed(0)
  reference = getattr(transformers, HF_CLASSES[head])(transformers.ModernBertConfig(**fields)).eval()
  config = config_of_hf(reference.config)
  loaded = check_hf_round_trip(reference, config, tmp_path, files)
  assert loaded.task == TaskHead("", head, labels.get(head, ()))
  assert set(loaded.params) == {"bert", "head", "classifier"} and set(loaded.params["head"]["dense"]) == {"kernel"}

  again = type(reference).from_pretrained(tmp_path / "exported", attn_implementation="eager").eval()
  batch = _batch(head, 405)
  with torch.no_grad():
    _, expected = hf_loss_and_logits(again, head, batch)
  ours = losses.logits(loaded.params, batch, loaded.task.model(loaded.config))
  np.testing.assert_allclose(np.asarray(ours), expected.numpy().reshape(ours.shape), atol=2e-5, rtol=1e-5)


@pytest.mark.slow
def test_a_modernbert_fine_tunes_from_a_masked_lm_directory_and_exports_its_task_model(bpe_files, tmp_path):  # noqa: F811
  """SST-2 from a transformers ModernBertForMaskedLM directory, with mean pooling (this run's, not the source's
  "cls"): it trains, evaluates each epoch, and the workdir loads and exports with its head, transformers'
  ModernBertForSequenceClassification computing bert_jax's logits from the export."""
  files, _ = bpe_files
  source = tmp_path / "modernbert"
  write_hf_directory(_masked_lm(bpe_files), source, 0, files)
  data = tmp_path / "SST-2"
  write_sst2(data, train_rows=64)
  config = glue.get_config()
  config.finetune.update(task="sst2", data_dir=str(data), max_seq_length=16, num_epochs=2.0, eval_batch_size=16)
  config.model.update(classifier_pooling="mean", hidden_dropout_prob=0.0, attention_dropout_prob=0.0)
  config.update(init_from=str(source), batch_size=8, learning_rate=1e-3, log_every_steps=1)
  workdir = str(tmp_path / "run")

  summary = jobs.run(config, workdir, "finetune")
  assert len(summary["evaluations"]) == 2 and 0 <= summary["final"]["dev"][0]["accuracy"] <= 1
  train_losses = helpers.train_losses(workdir)
  assert sorted(train_losses) == list(range(1, 17))
  # It trains: the second epoch's mean loss is below the first's (measured: 0.47 against 0.82).
  first, second = (np.mean([train_losses[step] for step in steps]) for steps in (range(1, 9), range(9, 17)))
  assert second < first - 0.1, train_losses
  tuned = pretrained.load(workdir)
  assert (tuned.config.model_type, tuned.config.classifier_pooling) == ("modernbert", "mean")
  assert pretrained.load(str(source)).config.classifier_pooling == "cls"
  check_exports(workdir, TaskHead("sst2", "classification", ("0", "1")), tmp_path / "exports")
  written = json.loads((tmp_path / "exports" / "hf" / "config.json").read_text())
  assert (written["architectures"], written["classifier_pooling"]) == (["ModernBertForSequenceClassification"], "mean")
  assert os.path.exists(os.path.join(workdir, "predictions", "SST-2.tsv"))


# A masked LM's config.json away from transformers' defaults in every field a run may take from it: mean pooling, a
# bias on the prediction head's dense layer, another activation.
SOURCE_FIELDS = dict(classifier_pooling="mean", **HEAD_FIELDS)


class _Started(Exception):
  """Raised where the loop would open the data: the job and its start, before any step."""


def _start(config, workdir, monkeypatch):
  """`jobs.run(config, workdir, "finetune")` up to its start (its checks, the source read, the members' initial state):
  returns (the job, its `start_order.Start`)."""
  from bert_jax.finetune import job

  def stop(self, begun):
    raise _Started(self, begun)

  monkeypatch.setattr(job.FinetuningJob, "open_data", stop)
  with pytest.raises(_Started) as started:
    jobs.run(config, str(workdir), "finetune")
  return started.value.args


def _masked_lm_directory(bpe, directory):
  """A transformers ModernBertForMaskedLM directory with SOURCE_FIELDS and `bpe` (`bpe_files`), its head's norm and
  biases moved off their initial 1 and 0 (so that a fresh head cannot equal it)."""
  model = _masked_lm(bpe, **SOURCE_FIELDS)
  with torch.no_grad():
    for name, param in model.named_parameters():
      if name.startswith("head."):
        param.add_(0.1 * torch.randn_like(param))
  write_hf_directory(model, directory, 0, bpe[0])
  return directory


def _pretraining_workdir(directory, workdir) -> str:
  """A bert_jax pretraining workdir whose step 1 holds the masked LM of the Hugging Face `directory`, saved as the
  pretraining loop saves (`checkpoints.save`: params, recorded config, tokenizer, data position)."""
  from bert_jax.train import step as step_lib
  from bert_jax.workdir import checkpoints
  from configs import default

  loaded = pretrained.load(str(directory))
  config = default.get_config()
  config.model.update(dataclasses.asdict(loaded.config))
  state = step_lib.TrainState(jnp.int32(1), loaded.params, {}, step_lib.initial_guard())
  manager = checkpoints.make_manager(str(workdir), 1)
  position = {"examples": 0, "step": 1, "tokenizer": loaded.tokenizer.identity()}
  checkpoints.save(manager, 1, state, position, config, checkpoints.tokenizer_item(loaded.tokenizer), {})
  checkpoints.finish(manager, 1)
  return str(workdir)


def _sst2_config(data, init_from: str):
  config = glue.get_config()
  config.finetune.update(task="sst2", data_dir=str(data), max_seq_length=16, eval_batch_size=16)
  config.update(init_from=init_from, batch_size=8)
  return config


@pytest.mark.parametrize(
  "source_format, pooling",
  [
    ("huggingface", None),
    ("huggingface", "cls"),
    # Slow: a bundle and a workdir load as the Hugging Face directory does (tests/test_pretrained.py, fast).
    pytest.param("bundle", None, marks=pytest.mark.slow),
    pytest.param("workdir", None, marks=pytest.mark.slow),
  ],
)
def test_a_modernbert_run_starts_where_transformers_from_pretrained_starts(
  bpe_files,  # noqa: F811
  tmp_path,
  monkeypatch,
  source_format,
  pooling,
):
  """From a masked LM (a transformers directory, its bert_jax bundle, a bert_jax pretraining workdir of it), the
  prediction head `head` starts as the masked LM's, and the classifier_* the run leaves unset are the source's
  (mean pooling, a biased silu head); an explicit `classifier_pooling` overrides the source's. With transformers'
  fresh `classifier` copied in, the members' initial logits are those of
  ModernBertForSequenceClassification.from_pretrained(the directory), which loads every tensor but `classifier.*`."""
  from bert_jax.handoff import export

  directory = _masked_lm_directory(bpe_files, tmp_path / "mlm")
  source = {
    "huggingface": lambda: str(directory),
    "bundle": lambda: export.export(str(directory), str(tmp_path / "bundle"), "bundle"),
    "workdir": lambda: _pretraining_workdir(directory, tmp_path / "pretrained"),
  }[source_format]()
  write_sst2(tmp_path / "SST-2", train_rows=16)
  config = _sst2_config(tmp_path / "SST-2", source)
  config.model.classifier_pooling = pooling
  started, begun = _start(config, tmp_path / "run", monkeypatch)
  expected = pooling or "mean"
  model_cfg = started.model_cfg
  assert (model_cfg.classifier_pooling, model_cfg.classifier_activation, model_cfg.classifier_bias) == (
    expected,
    "silu",
    True,
  )
  assert started.recorded_config.model.classifier_pooling == expected  # What the checkpoints record.
  assert "the prediction head as `from` says (its masked LM's transform and norm)" in begun.started
  params = jax.tree.map(lambda x: np.asarray(x[0]), jax.device_get(begun.state.params))  # The one member's.
  masked_lm = pretrained.load(str(directory)).params
  want = {"dense": masked_lm["mlm_transform"], "norm": masked_lm["mlm_layer_norm"]}
  assert jax.tree.map(np.shape, params["head"]) == jax.tree.map(np.shape, want)
  jax.tree.map(np.testing.assert_array_equal, params["head"], want)

  overrides = {"classifier_pooling": pooling} if pooling else {}
  reference, info = transformers.ModernBertForSequenceClassification.from_pretrained(
    directory, output_loading_info=True, attn_implementation="eager", **overrides
  )
  # Every tensor of the file but the masked LM's decoder bias, every parameter but the classifier's.
  assert (sorted(info["missing_keys"]), info["unexpected_keys"]) == (
    ["classifier.bias", "classifier.weight"],
    ["decoder.bias"],
  )
  assert reference.config.classifier_pooling == expected
  # The encoder's dropout, which glue.py leaves unset, is the source's too (ModernBERT's 0, not BERT's 0.1).
  theirs_dropout = (reference.config.mlp_dropout, reference.config.attention_dropout)
  assert (model_cfg.hidden_dropout_prob, model_cfg.attention_dropout_prob) == theirs_dropout == (0.0, 0.0)
  tensors = {name: value.detach().numpy() for name, value in reference.state_dict().items()}
  params["classifier"] = hf_format.params_from_hf(tensors, model_cfg)["classifier"]
  batch = _batch("classification", 405)
  with torch.no_grad():
    ids, mask = (torch.from_numpy(batch[name]).long() for name in ("input_ids", "input_mask"))
    theirs = reference.eval()(input_ids=ids, attention_mask=mask).logits.numpy()
  ours = losses.logits(params, batch, task_model(model_cfg, "classification", 2))
  np.testing.assert_allclose(np.asarray(ours), theirs, atol=2e-5, rtol=1e-5)


def test_the_prediction_head_comes_from_a_fine_tuned_source_and_not_from_a_source_of_another_head(
  bpe_files,  # noqa: F811
  tmp_path,
  monkeypatch,
):
  """A fine-tuned ModernBERT gives its own `head` (not its `classifier`); a run that sets `classifier_bias` or
  `classifier_activation` other than the masked LM's starts the head from the seed, saying which field; a BERT's
  run takes the encoder alone."""
  from bert_jax.finetune import job

  lines = []
  log = lambda message, *args, **_: lines.append(str(message) % args)  # noqa: E731
  monkeypatch.setattr(job, "logging", types.SimpleNamespace(info=log, warning=log))
  directory = _masked_lm_directory(bpe_files, tmp_path / "mlm")
  masked_lm = pretrained.load(str(directory))
  config = _sst2_config(tmp_path / "SST-2", str(directory))
  params, _ = job.initial_params(masked_lm, plan_lib.model_config(config, masked_lm))
  assert set(params) == {"bert", "head"}
  for name, value in (("classifier_bias", False), ("classifier_activation", "gelu")):
    config.model[name] = value
    params, started = job.initial_params(masked_lm, plan_lib.model_config(config, masked_lm))
    assert set(params) == {"bert"} and started == "the encoder as `from` says, each member's head from its own seed"
    shown = repr(getattr(masked_lm.config, name))
    assert lines.pop() == (
      f"The prediction head starts from each member's seed, not from its masked LM's transform and norm of "
      f"{directory}: model.{name}={value!r}, the source's {shown}."
    )
    config.model[name] = None

  torch.manual_seed(1)
  fields = dict(_masked_lm(bpe_files).config.to_dict(), num_labels=2)
  tuned_model = transformers.ModernBertForSequenceClassification(transformers.ModernBertConfig(**fields)).eval()
  write_hf_directory(tuned_model, tmp_path / "tuned", 0, bpe_files[0])
  tuned = pretrained.load(str(tmp_path / "tuned"))
  params, started = job.initial_params(tuned, plan_lib.model_config(config, tuned))
  assert set(params) == {"bert", "head"} and "(its prediction head)" in started
  jax.tree.map(np.testing.assert_array_equal, params["head"], tuned.params["head"])

  bert = types.SimpleNamespace(config=BertConfig(vocab_size=99), params={"bert": {}, "classifier": {}})
  assert job.initial_params(bert, bert.config)[0] == {"bert": {}}


def test_a_resume_compares_the_classifier_fields_as_the_run_resolves_them(bpe_files, tmp_path, monkeypatch):  # noqa: F811
  """A checkpoint records the `classifier_pooling` its run resolved: a resume that leaves it to the same source
  resumes; one that sets another, or whose source pools otherwise than the checkpoint's run did, is refused, naming
  the key, before any weight is read."""
  from bert_jax.finetune import job

  directory = _masked_lm_directory(bpe_files, tmp_path / "mlm")  # Pools the mean.
  write_sst2(tmp_path / "SST-2", train_rows=16)
  config = _sst2_config(tmp_path / "SST-2", str(directory))
  cases = (
    ("mean", None, None),
    ("mean", "cls", "'mean' in the checkpoint, 'cls' in the config"),
    ("cls", None, "'cls' in the checkpoint, 'mean' in the config"),
  )
  for index, (recorded, pooling, refused) in enumerate(cases):
    saved = config.copy_and_resolve_references()
    saved.model.update(classifier_pooling=recorded, classifier_activation="silu", classifier_bias=True)
    workdir = tmp_path / f"run_{index}"
    helpers.write_checkpoint(workdir, saved, {})
    config.model.classifier_pooling = pooling
    with monkeypatch.context() as patch:
      if refused:
        patch.setattr(pretrained, "load", None)  # Refused before any weight is read.
        with pytest.raises(ValueError, match=f"model.classifier_pooling={refused}"):
          jobs.run(config, str(workdir), "finetune")
      else:
        patch.setattr(job.loop, "train", _stop_at_train)
        with pytest.raises(_Started):  # Past the checks, where the loop would start.
          jobs.run(config, str(workdir), "finetune")


def _stop_at_train(job, workdir, started_at):
  raise _Started(job)
