"""Each task config (configs/glue.py's SST-2 and STS-B, squad.py's v1.1 and v2.0, ner.py, swag.py), shrunk to 50
steps of a small BERT from a Hugging Face directory with dropout off, runs end to end and trains step for step as the
reference PyTorch loop (bert_jax/benchmarks/torch_reference.py) does on the same rows: every step's loss, the final
parameters and the evaluated logits."""

import functools
import json
import math
import os
import shutil

import flax.linen as nn
import jax
import numpy as np
import pytest
import torch
import transformers

from bert_jax import jobs
from bert_jax.benchmarks import torch_reference
from bert_jax.finetune import job, tasks
from bert_jax.finetune import losses as finetune_losses
from bert_jax.finetune import metrics as metrics_lib
from bert_jax.finetune import plan as plan_lib
from bert_jax.finetune import rows as rows_lib
from bert_jax.handoff import hf_format, hf_names, pretrained
from bert_jax.model.encoder import init_params
from bert_jax.model.heads import task_model
from bert_jax.train.optim import Steps
from bert_jax.workdir import checkpoints
from configs import glue, ner, squad, swag
from tests.helpers import check_exports, finetuned_params, train_losses, write_sst2


def _write_stsb(directory) -> None:
  """STS-B layout; the score is 5/4 of the words two sentences of 4 share."""
  rng = np.random.default_rng(4)
  columns = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"
  for split, rows in (("train", 200), ("dev", 24)):
    lines = [columns + "\tscore"]
    for i in range(rows):
      a, others = [f"w{w}" for w in rng.permutation(np.arange(5, 95))[:8].reshape(2, 4)]
      shared = int(rng.integers(0, 5))
      b = " ".join(rng.permutation(list(a[:shared]) + list(others[shared:])))
      lines.append(f"{i}\tmain\tvid\t2012\t{i:04d}\tnone\tnone\t{' '.join(a)}\t{b}\t{5 * shared / 4:.3f}")
    (directory / f"{split}.tsv").write_text("\n".join(lines) + "\n")


def _write_squad(directory) -> None:
  """Paragraphs of the session vocabulary; each question's answer is the word after its two query words."""
  rng = np.random.default_rng(1)
  for split, paragraphs in (("train", 18), ("dev", 2)):
    data = []
    for p in range(paragraphs):
      words = [f"w{i}" for i in rng.permutation(np.arange(5, 95))[:30]]
      context = " ".join(words) + " ."
      qas = []
      for q in range(4):
        at = int(rng.integers(2, 29))
        answer = words[at]
        qas.append(
          {
            "id": f"{split}-{p}-{q}",
            "question": f"{words[at - 2]} {words[at - 1]} ?",
            "answers": [{"text": answer, "answer_start": context.index(f" {answer} ") + 1}],
            "is_impossible": False,
          }
        )
      qas.append({"id": f"{split}-{p}-none", "question": "w1 w2 ?", "answers": [], "is_impossible": True})
      data.append({"title": f"t{p}", "paragraphs": [{"context": context, "qas": qas}]})
    for version in ("1.1", "2.0"):
      kept = data if version == "2.0" else [_answerable(d) for d in data]
      (directory / f"{split}-v{version}.json").write_text(json.dumps({"version": version, "data": kept}))


def _answerable(document: dict) -> dict:
  paragraph = document["paragraphs"][0]
  qas = [{k: v for k, v in qa.items() if k != "is_impossible"} for qa in paragraph["qas"] if qa["answers"]]
  return dict(document, paragraphs=[dict(paragraph, qas=qas)])


def _write_conll(directory) -> None:
  rng = np.random.default_rng(2)
  tags = ("B-PER", "I-PER", "O", "B-LOC", "O", "O")
  for name, sentences in (("train.txt", 200), ("valid.txt", 6), ("test.txt", 6)):
    lines = []
    for _ in range(sentences):
      lines += [f"w{rng.integers(5, 95)} NN O {tag}" for tag in tags[: int(rng.integers(2, 7))]] + [""]
    (directory / name).write_text("\n".join(lines) + "\n")


def _write_swag(directory) -> None:
  rng = np.random.default_rng(3)
  header = ",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3"
  for name, rows in (("train.csv", 200), ("val.csv", 8), ("test.csv", 4)):
    lines = [header + ("" if name == "test.csv" else ",label")]
    for i in range(rows):
      words = [f"w{w}" for w in rng.integers(5, 95, 8)]
      label = "" if name == "test.csv" else f",{rng.integers(0, 4)}"
      lines.append(f"{i},v{i},{i},x,{' '.join(words[:3])},{words[3]},gold,{','.join(words[4:])}{label}")
    (directory / name).write_text("\n".join(lines) + "\n")


# config module, task, data writer, the file of the dev predictions and how to read it, the learning rate schedule.
_TASK_RUNS = {
  "sst2": (glue, "sst2", functools.partial(write_sst2, train_rows=200), "dev.tsv", str.splitlines, "bert"),
  "stsb": (glue, "stsb", _write_stsb, "dev.tsv", str.splitlines, "transformers"),
  "squad_v1": (squad, "squad_v1", _write_squad, "dev.json", json.loads, "transformers"),
  "squad_v2": (squad, "squad_v2", _write_squad, "dev.json", json.loads, "bert"),
  "conll2003": (ner, "conll2003", _write_conll, "dev.txt", str.splitlines, "bert"),
  "swag": (swag, "swag", _write_swag, "test.csv", str.splitlines, "transformers"),
}


PARITY_STEPS = 50


# Measured (float32, 50 steps at learning rate 1e-3, which move parameters by up to 0.025): the losses agree within
# 3.2e-6 relative and the parameters within 5.2e-6; the choice head's within 2.5e-5, since the gradients of what its
# four sequences share (context tokens, positions) are small differences of large terms. Each of these bugs moves the
# losses by 1.4e-5 relative or more, or the parameters by 2.6e-4 or more: the other schedule, Adam epsilon 1e-8, a
# transformers head initialisation, no clipping (where gradients exceed the norm: regression, span, token heads),
# weight decay on LayerNorms and biases, a token loss over every real token, [PAD]'s embedding frozen (span head).
PARITY_LOSS_RTOL = 1e-5


PARITY_PARAMS_ATOL = {"classification": 2e-5, "regression": 2e-5, "span": 2e-5, "token": 2e-5, "choice": 1e-4}


PARITY_LOGITS_ATOL = 5e-5  # Of the evaluated split from the final parameters (measured: 9.2e-6).


# The loss is invariant to these biases (they add one constant to every choice's or every position's logit): their
# gradient is zero but for rounding, which Adam scales up to steps of the learning rate's size in either direction.
INVARIANT = {"choice": ("classifier", "bias"), "span": ("qa_outputs", "bias")}


@pytest.fixture(scope="module")
def hf_bert(wordpiece_run, tmp_path_factory) -> str:
  """A small BERT that transformers makes (`BertForPreTraining`, every LayerNorm and bias moved off its initial 1 or
  0 so that each matters), saved as a Hugging Face directory with the session's vocabulary."""
  directory = tmp_path_factory.mktemp("hf_bert")
  vocab = wordpiece_run[1].tokenizer.path
  shutil.copy(vocab, directory / "vocab.txt")
  config = transformers.BertConfig(
    vocab_size=len(open(vocab).read().split()),
    hidden_size=32,
    num_hidden_layers=1,
    num_attention_heads=4,
    intermediate_size=48,
    max_position_embeddings=40,
  )
  torch.manual_seed(0)
  model = transformers.BertForPreTraining(config)
  with torch.no_grad():
    for name, param in model.named_parameters():
      if "LayerNorm" in name or name.endswith("bias"):
        param.add_(0.1 * torch.randn_like(param))
  model.save_pretrained(directory, safe_serialization=True)
  return str(directory)


@pytest.mark.parametrize("name", list(_TASK_RUNS))
@pytest.mark.slow
def test_each_task_config_runs_end_to_end_and_trains_as_pytorch_does(name, hf_bert, tmp_path):
  """configs/glue.py (SST-2, STS-B), squad.py (v1.1 and v2.0), ner.py and swag.py, shrunk to 50 steps of a small
  BERT from a Hugging Face directory, dropout off: every step's loss and the final parameters equal those of the
  reference PyTorch loop (bert_jax/benchmarks/torch_reference.py) on the same rows in the same order."""
  module, task_name, write, prediction_file, parse, schedule = _TASK_RUNS[name]
  write(tmp_path)
  config = module.get_config()
  config.finetune.update(task=task_name, data_dir=str(tmp_path), max_seq_length=24, eval_batch_size=16)
  config.finetune.update(max_query_length=6, doc_stride=8)
  config.model.update(hidden_dropout_prob=0.0, attention_dropout_prob=0.0)
  # A learning rate that moves the parameters far enough for a bug's trace to stand out of float32's rounding.
  config.update(init_from=hf_bert, batch_size=8, learning_rate=1e-3, lr_schedule=schedule, log_every_steps=1)
  source = pretrained.load(hf_bert)
  task = tasks.make_task(config.finetune)
  train = task.encode(task.read(task.train_split), source.tokenizer, config.finetune.max_seq_length)
  config.finetune.num_epochs = (PARITY_STEPS * config.batch_size - 0.5) / train.num_rows
  workdir = str(tmp_path / "run")
  summary = jobs.run(config, workdir, "finetune")

  main = summary["main_metric"]
  assert len(summary["evaluations"]) == math.ceil(config.finetune.num_epochs)  # One per epoch.
  values = [e["results"]["dev"][0][main] for e in summary["evaluations"]]
  assert all(-1 <= v <= 100 for v in values), values  # STS-B's correlations may be negative.
  assert summary["best"]["value"] == max(values)
  assert json.loads(open(os.path.join(workdir, job.METRICS_FILE)).read())["final"] == summary["final"]
  assert finetuned_params(workdir, checkpoints.BEST).keys() == finetuned_params(workdir).keys()
  predictions = parse(open(os.path.join(workdir, "predictions", prediction_file)).read())
  if task_name.startswith("squad"):  # {question id: answer text}, every dev question (v2.0: 2 without an answer).
    assert len(predictions) == (10 if task_name == "squad_v2" else 8)
    assert all(isinstance(v, str) for v in predictions.values())
    if task_name == "squad_v2":
      assert {"HasAns_f1", "NoAns_f1", "best_f1_thresh"} <= set(summary["final"]["dev"][0])
      # The threshold chosen on dev is the one of the prediction file: its answers score dev's best F1.
      assert summary["calibration"]["f1"] == summary["final"]["dev"][0]["best_f1"]
      dataset = json.loads((tmp_path / "dev-v2.0.json").read_text())["data"]
      scored = metrics_lib.squad_v2(dataset, predictions)
      np.testing.assert_allclose(scored["f1"], summary["final"]["dev"][0]["best_f1"], atol=1e-6)
  elif task_name == "conll2003":  # conlleval's input: word, gold tag, predicted tag; a blank line between sentences.
    assert sum(1 for line in predictions if line) == sum(
      1 for line in open(tmp_path / "valid.txt").read().splitlines() if line
    )
  elif task_name == "swag":  # The leaderboard CSV of the unlabelled test split.
    assert predictions[0] == ",pred" and len(predictions) == 5
  else:  # GLUE's layout, for the dev split too.
    assert predictions[0] == "index\tprediction" and len(predictions) == 1 + 24
  if module is not glue:  # Left, for time, to test_the_fine_tuned_model_loads_and_exports_with_its_head (SST-2).
    check_exports(workdir, task.task_head, tmp_path / "exports")
  _check_trains_as_pytorch_does(config, workdir, source, task, train, summary)


def _check_trains_as_pytorch_does(config, workdir: str, source, task, train, summary: dict) -> None:
  """The reference PyTorch loop from the same Hugging Face directory and the same fresh head (bert_jax's, from the
  run's seed) on the job's rows of every step: each step's loss, the final parameters and the final evaluation are
  the job's."""
  losses = train_losses(workdir)
  assert sorted(losses) == list(range(1, PARITY_STEPS + 1))
  model_cfg = plan_lib.model_config(config, source)
  model = task_model(model_cfg, task.head, task.num_labels)
  fresh = init_params(model, jax.random.key(config.seed))
  tensors = hf_format.hf_from_params(nn.meta.unbox(fresh), model_cfg)
  head = {name: value for name, value in tensors.items() if name.split(".")[0] in hf_names.TASK_HEADS}
  reference = torch_reference.load_model(config.init_from, task.head, task.num_labels, head, pad_embedding_trains=True)
  rows = [rows_lib.training_rows(s, train.num_rows, config.batch_size, config.seed) for s in range(1, PARITY_STEPS + 1)]
  steps = Steps(warmup_steps=PARITY_STEPS // 10, end_step=PARITY_STEPS)  # 10% warmup.
  hyperparameters = torch_reference.Hyperparameters.of(config, steps)
  threads = torch.get_num_threads()
  # One thread: the model is tiny, and two OpenMP threads spinning against XLA's on a busy 2-core machine made these
  # 50 steps take 15 s instead of 1 s.
  torch.set_num_threads(1)
  try:
    trained = torch_reference.train(
      reference, task.head, train.features, rows, hyperparameters, dropout=False, seed=config.seed
    )
    split = task.eval_splits[0]
    evaluated = task.encode(task.read(split), source.tokenizer, config.finetune.max_seq_length)
    logits = torch_reference.logits(trained.model, task.head, evaluated.features, config.finetune.eval_batch_size)
  finally:
    torch.set_num_threads(threads)
  ours = [losses[step] for step in range(1, PARITY_STEPS + 1)]
  np.testing.assert_allclose(ours, trained.losses, rtol=PARITY_LOSS_RTOL, atol=0, err_msg="loss per step")

  theirs = hf_format.params_from_hf(torch_reference.tensors(trained.model), model_cfg)
  final = jax.tree.map(lambda x: x[0], finetuned_params(workdir))  # The run's one member.
  for path, expected in jax.tree_util.tree_flatten_with_path(theirs)[0]:
    keys = tuple(key.key for key in path)
    if keys != INVARIANT.get(task.head):
      got = functools.reduce(lambda tree, key: tree[key], keys, final)
      np.testing.assert_allclose(got, expected, rtol=0, atol=PARITY_PARAMS_ATOL[task.head], err_msg="/".join(keys))
  # The evaluation helper: the reference's logits are bert_jax's of the final parameters, and the task's metrics read
  # them. (The metrics themselves may differ: STS-B's correlations of 50 steps' nearly constant scores are noise.)
  our_logits = jax.jit(functools.partial(finetune_losses.logits, model=model))(final, dict(evaluated.features))
  if task.head in INVARIANT:  # Up to the constant that the bias adds over choices or positions (axis 1).
    logits, our_logits = (x - np.mean(x, axis=1, keepdims=True) for x in (logits, np.asarray(our_logits)))
  np.testing.assert_allclose(logits, our_logits, rtol=0, atol=PARITY_LOGITS_ATOL, err_msg=f"{split} logits")
  assert task.metrics(evaluated, logits).keys() == summary["final"][split][0].keys()
