"""The plain helpers that more than one test file uses, in one place (the fixtures they share are in conftest.py):
what a run wrote, `python -m bert_jax.main`'s command, pretraining and fine-tuning inputs, references to compare
with. A helper one test file uses stays in that file. transformers, torch and TensorFlow are imported by the helpers
that use them."""

import dataclasses
import glob
import inspect
import os
import pathlib
import shutil
import sys
import types
from collections.abc import Mapping

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from etils import epath

from bert_jax.data.masking_schedule import MaskingRates
from bert_jax.model.param_layout import SCANNED_KEY
from bert_jax.workdir import checkpoints, reading

ROOT = pathlib.Path(__file__).resolve().parents[1]


# What a run wrote.


def restore_config(workdir: str, step: int | None = None) -> dict:
  """The config a checkpoint was written with (newest step by default), as a plain dict."""
  with checkpoints.read_only_manager(workdir) as manager:
    step = manager.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"No checkpoint under {checkpoints.checkpoint_dir(workdir)}.")
    return reading.read_config(manager, step)


def is_scanned(params: Mapping) -> bool:
  """Whether `params` (a BertForPretraining or BertModel parameter tree) is in the scanned layout."""
  encoder = params.get("bert", params)
  return SCANNED_KEY in encoder


def state_params(state) -> dict:
  """A train state's parameters, as numpy."""
  return jax.tree.map(np.asarray, jax.device_get(state.params))


def final_params(workdir, step: int, item: str = "params") -> dict:
  """The parameters (`item`: or their moving average, "ema") of checkpoint `step` of a pretraining workdir, as
  numpy."""
  restored = ocp.StandardCheckpointer().restore(epath.Path(workdir) / "checkpoints" / str(step) / item)
  return jax.tree.map(np.asarray, restored)


def assert_params_equal(actual, expected):
  """Bitwise: the same tree of the same arrays (`actual` may be on devices)."""
  assert jax.tree.structure(actual) == jax.tree.structure(expected)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(actual), expected)


def write_checkpoint(workdir, config, history: dict, value: float = 1.0, step: int = 1, data_position=None) -> None:
  """A one-step checkpoint of a 4-parameter model (`value` each) in `workdir`, recording `config` and `history`: what
  the start checks read (config, data position, history, checksums), without training anything. The config is
  recorded as the jobs record theirs, its unset prediction-head fields resolved (without a source: the defaults)."""
  import jax.numpy as jnp
  import ml_collections

  from bert_jax.model.bert_config import PREDICTION_HEAD_FIELDS, model_config
  from bert_jax.train import step as step_lib

  model = dataclasses.asdict(model_config(config))
  recorded = ml_collections.ConfigDict(config.to_dict())
  recorded.model.update({name: model[name] for name in PREDICTION_HEAD_FIELDS})
  state = step_lib.TrainState(jnp.int32(step), {"w": jnp.full(4, value)}, {}, step_lib.initial_guard())
  manager = checkpoints.make_manager(str(workdir), 1)
  checkpoints.save(manager, step, state, data_position or {"examples": 0, "step": step}, recorded, None, history)
  checkpoints.finish(manager, step)


def flip_a_bit_through_orbax(step_dir) -> None:
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


# `python -m bert_jax.main` as a user runs it.

# The quick start (configs/tiny.py) shrunk to 40 steps.
SHRINK = [
  "--config.num_train_steps=40",
  "--config.log_every_steps=5",
  "--config.checkpoint_every_steps=1000",
  "--config.eval_every_steps=1000",
  "--config.eval_steps=1",
  "--config.warmup_steps=4",
]
# XLA's CPU backend compiling as in pytest's processes (tests/conftest.py), for a subprocess whose compiles are the
# cost and whose speed and memory figures are not what its test checks.
FAST_COMPILES = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"


def main_command(workdir) -> list[str]:
  """The quick start's command (configs/tiny.py, SHRINK) on `workdir`."""
  return [sys.executable, "-m", "bert_jax.main", "--config=configs/tiny.py", f"--workdir={workdir}", *SHRINK]


def main_env() -> dict:
  """The environment of a `python -m bert_jax.main` process: CPU, unbuffered, one device (as on a laptop)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
  env.pop("XLA_FLAGS", None)  # One device, as on a laptop.
  return env


# Pretraining steps on synthetic batches.


def synthetic_batches(config, n: int) -> list[dict]:
  """The first `n` batches of the synthetic source at `config`'s batch size, sequence and vocabulary (seed 0)."""
  from bert_jax.data.synthetic import SyntheticSource

  source = SyntheticSource(
    seed=0,
    global_batch_size=config.batch_size,
    max_seq_length=config.data.max_seq_length,
    max_predictions_per_seq=config.data.max_predictions_per_seq,
    vocab_size=config.model.vocab_size,
  )
  return [next(source) for _ in range(n)]


def data_parallel_run(config, devices):
  """The pretraining run on `devices` (all data-parallel) and its initial state."""
  from bert_jax.train import pretraining

  config.mesh.update(data=-1, fsdp=1, tensor=1)
  run = pretraining.make_run(config, devices)
  return run, run.init_state(config.seed)


# The pipeline tests' stream of conftest.py's `pipeline_corpus` (test_pipeline.py, test_pipeline_state.py).

# Its stream: rows of 128 tokens with up to 20 predictions, batches of 128 rows; shard s of the corpus uses words
# s*400 .. s*400+399, so that tokens tell which shard an example came from.
PIPELINE_SEQ, PIPELINE_PREDICTIONS, PIPELINE_BATCH = 128, 20, 128
PIPELINE_WORDS_PER_SHARD = 400
PIPELINE_NUM_SHARDS = 4


def pipeline_data(data_config, **overrides):
  """`config.data` at the pipeline tests' settings (`data_config`: conftest.py's fixture), with `overrides`."""
  settings = dict(
    max_seq_length=PIPELINE_SEQ, max_predictions_per_seq=PIPELINE_PREDICTIONS, shuffle_buffer=1000, num_readers=1
  )
  return data_config(**(settings | overrides))


def corpus_source(corpus, data_config, seed=0, batch_size=PIPELINE_BATCH, **overrides):
  """The pipeline's source of `corpus` ((prepared directory, manifest, tokenizer)): host 0 of 1 (every reader), or
  `host=(index, count)`, `start_example=`, `state_dir=`, `masking_rates=` (with `masking_phases`); other keys set
  `config.data`."""
  from bert_jax.data import sources

  prepared, manifest, tokenizer = corpus
  keys = ("host", "start_example", "state_dir", "masking_rates")
  source_keys = {k: overrides.pop(k) for k in keys if k in overrides}
  data = pipeline_data(data_config, **overrides)
  return sources.pipeline_source(data, prepared, manifest, tokenizer, seed=seed, batch_size=batch_size, **source_keys)


# A masking-rate schedule (data.masking_phases) over that stream's reader batches of PIPELINE_BATCH rows: 30% for two
# batches, 15% for two, then from 30% down to 5% over four, and 5% after; every instance selected at 30%.
PIPELINE_SCHEDULE = dict(
  masked_lm_prob=0.3,
  max_predictions_per_seq=40,
  masking_phases="0: 0.3; 2: 0.15; 4: 0.3->0.05",
  masking_rates=MaskingRates(bounds=(0, 2, 4, 8), firsts=(0.3, 0.15, 0.3), lasts=(0.3, 0.15, 0.05)),
)


def unmasked_ids(batch: dict) -> np.ndarray:
  """input_ids with the original token back at every masked position."""
  ids = batch["input_ids"].copy()
  for row in range(len(ids)):
    real = batch["masked_lm_weights"][row] > 0
    ids[row, batch["masked_lm_positions"][row][real]] = batch["masked_lm_ids"][row][real]
  return ids


def next_batches(source, n):
  """The next `n` batches of `source`."""
  return [next(source) for _ in range(n)]


def assert_same_batches(batches, expected):
  """The same batches, feature by feature, bitwise."""

  assert len(batches) == len(expected)
  for a, b in zip(batches, expected, strict=True):
    assert a.keys() == b.keys()
    for name in a:
      np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def concat_batches(host_batches: list[dict]) -> dict:
  """Hosts' batches (or steps' rows) joined into one, feature by feature."""
  return {name: np.concatenate([batch[name] for batch in host_batches]) for name in host_batches[0]}


# Masked-LM selection on generated rows (test_masking.py, test_masking_schedule.py): [CLS] a [SEP] b [SEP] [PAD]...
# of a vocabulary whose ids 0-4 are [PAD], [UNK], [CLS], [SEP], [MASK]; a piece id >= 500 continues a word.

MASKING_VOCAB, MASKING_SEQ, MASKING_PREDICTIONS = 1000, 128, 20
MASKING_CLS, MASKING_SEP, MASKING_MASK = 2, 3, 4
MASKING_SPECIAL = [0, 1, 2, 3, 4]
# What mask_tokens needs of a tokenizer, for generated_rows' ids.
GENERATED = dict(
  special_ids=MASKING_SPECIAL, word_start=np.arange(MASKING_VOCAB) < 500, vocab_size=MASKING_VOCAB, mask_id=MASKING_MASK
)


def generated_rows(n: int, seed: int = 0):
  """input_ids, input_mask [n, MASKING_SEQ] int32: rows of MASKING_SEQ / 2 to MASKING_SEQ tokens, words of 1-3
  pieces."""
  rng = np.random.default_rng(seed)
  ids = np.zeros((n, MASKING_SEQ), np.int32)
  mask = np.zeros((n, MASKING_SEQ), np.int32)
  for row in range(n):
    length = rng.integers(MASKING_SEQ // 2, MASKING_SEQ + 1)
    body = []
    while len(body) < length - 3:
      body += [rng.integers(5, 500)] + list(rng.integers(500, MASKING_VOCAB, rng.integers(0, 3)))
    body = body[: length - 3]
    split = rng.integers(1, len(body))
    ids[row, :length] = [MASKING_CLS, *body[:split], MASKING_SEP, *body[split:], MASKING_SEP]
    mask[row, :length] = 1
  return ids, mask


def masking_settings(**overrides):
  """BERT's masking (configs/default.py, a `masking.Masking`) with MASKING_PREDICTIONS predictions, and
  `overrides`."""
  from bert_jax.data.masking import Masking
  from configs import default

  bert = Masking.of(default.get_config().data)
  return dataclasses.replace(bert, **{"max_predictions_per_seq": MASKING_PREDICTIONS, **overrides})


def mask_all(ids, mask, scheme="tokens", seed=0, vocabulary=GENERATED, thresholds=False, **overrides):
  """mask_tokens of each row (seed (seed, row)) by `scheme` (data.masking), with `vocabulary` (GENERATED's keys),
  `thresholds` (a masking-rate schedule's) and `overrides` of masking_settings: numpy [n, ...] each."""
  from bert_jax.data.masking import mask_tokens
  from bert_jax.tensorflow_cpu import tf

  settings = masking_settings(scheme=scheme, **overrides)

  def apply(index, input_ids, input_mask):
    row_seed = tf.stack([tf.constant(seed, tf.int64), index])
    return mask_tokens(input_ids, input_mask, row_seed, **vocabulary, masking=settings, thresholds=thresholds)

  dataset = tf.data.Dataset.from_tensor_slices((tf.range(len(ids), dtype=tf.int64), ids, mask))
  dataset = dataset.map(apply, num_parallel_calls=tf.data.AUTOTUNE).batch(len(ids))
  return {k: v.numpy() for k, v in next(iter(dataset)).items()}


def words_of(ids, mask):
  """generated_rows' candidates (real tokens, not special) and word starts (a piece below 500, or the first after a
  special token): [n, MASKING_SEQ] bool each."""
  candidate = (mask > 0) & ~np.isin(ids, MASKING_SPECIAL)
  after_special = ~np.pad(candidate[:, :-1], ((0, 0), (1, 0)))
  return candidate, candidate & ((ids < 500) | after_special)


def selected_positions(out) -> np.ndarray:
  """[n, seq] bool: the positions whose prediction has weight (mask_tokens' selection, or what a trim kept)."""
  weights = out["masked_lm_weights"]
  selected = np.zeros(out["input_ids"].shape, bool)
  np.put_along_axis(selected, out["masked_lm_positions"], weights > 0, 1)
  return selected


# Fine-tuning.


def write_sst2(directory, train_rows: int = 64):
  """SST-2 layout; the label is whether w1 (positive) or w2 (negative) is in the sentence."""
  rng = np.random.default_rng(0)
  os.makedirs(directory, exist_ok=True)

  def sentence(label):
    words = [f"w{i}" for i in rng.integers(3, 90, 6)]
    words.insert(int(rng.integers(0, 6)), "w1" if label else "w2")
    return " ".join(words)

  for split, rows in (("train", train_rows), ("dev", 24)):
    labels = rng.integers(0, 2, rows)
    lines = ["sentence\tlabel"] + [f"{sentence(y)}\t{y}" for y in labels]
    (directory / f"{split}.tsv").write_text("\n".join(lines) + "\n")
  (directory / "test.tsv").write_text("index\tsentence\n" + "".join(f"{i}\t{sentence(i % 2)}\n" for i in range(5)))


def finetuned_params(workdir: str, name: str = checkpoints.CHECKPOINTS):
  """The parameters of a fine-tuning workdir's newest checkpoint (every member of its sweep), or of its best (`name`
  checkpoints.BEST), as numpy."""
  with checkpoints.reader(os.path.join(workdir, name)) as manager:
    step = manager.latest_step()
    restored = manager.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore()))
  return jax.tree.map(np.asarray, restored["params"])


def tensorboard_scalars(workdir: str, prefix: str, split: str = "train") -> dict[str, dict[int, float]]:
  """{tag: {step: value}} of the scalars whose tag starts with `prefix` that the job wrote to TensorBoard's `split`."""
  from bert_jax.tensorflow_cpu import tf

  scalars = {}
  for path in glob.glob(os.path.join(workdir, "tensorboard", split, "events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag.startswith(prefix):
          scalars.setdefault(value.tag, {})[event.step] = float(tf.make_ndarray(value.tensor))
  return scalars


def train_losses(workdir: str) -> dict[int, float]:
  """{step: the training loss that the job wrote to TensorBoard}."""
  return tensorboard_scalars(workdir, "loss").get("loss", {})


def logged_by(module, patch) -> list[str]:
  """The lines `module` logs through absl (info, warning, error) from now on, formatted (absl's records evade
  caplog)."""
  lines = []
  log = lambda message, *args, **_: lines.append(str(message) % args)  # noqa: E731
  patch.setattr(module, "logging", types.SimpleNamespace(info=log, warning=log, error=log))
  return lines


def logged_by_start_order(patch) -> list[str]:
  """The lines start_order logs from now on (`logged_by`)."""
  from bert_jax.train import start_order

  return logged_by(start_order, patch)


def check_exports(workdir: str, expected, tmp_path) -> None:
  """The fine-tuning workdir loads as its best member with its head (`expected`, a TaskHead); bundle and Hugging Face
  exports keep both, and transformers' task model computes from the latter what bert_jax computes; the sweep's
  checkpoints and the google format are refused."""
  import torch
  import transformers

  from bert_jax.finetune import swag as swag_task
  from bert_jax.handoff import export, pretrained
  from bert_jax.model.heads import HF_ARCHITECTURES

  best = finetuned_params(workdir, checkpoints.BEST)
  loaded = pretrained.load(workdir)
  assert loaded.task == expected and loaded.source.path.startswith(os.path.join(workdir, checkpoints.BEST))
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, loaded.params), best)
  with pytest.raises(ValueError, match="every member of its sweep.*best"):
    pretrained.load(os.path.join(workdir, checkpoints.CHECKPOINTS))
  with pytest.raises(ValueError, match="no place for its head|the google format is BERT's"):  # A ModernBERT's: both.
    export.export(workdir, str(tmp_path / "google"), "google")

  bundle = pretrained.load(export.export(workdir, str(tmp_path / "bundle"), "bundle"))
  assert bundle.task == expected
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, bundle.params), best)

  hf_dir = export.export(workdir, str(tmp_path / "hf"), "huggingface")
  from_hf = pretrained.load(hf_dir)
  assert from_hf.task == expected
  shape = (2, swag_task.NUM_CHOICES, 12) if expected.head == "choice" else (2, 12)
  ids = np.random.default_rng(0).integers(5, loaded.config.vocab_size, shape).astype(np.int32)
  inputs = (ids, np.ones_like(ids), np.zeros_like(ids))
  ours = np.asarray(expected.model(loaded.config).apply({"params": loaded.params}, *inputs)["logits"])
  np.testing.assert_allclose(expected.model(from_hf.config).apply({"params": from_hf.params}, *inputs)["logits"], ours)

  reference_class = getattr(transformers, HF_ARCHITECTURES[loaded.config.model_type][expected.head])
  reference, info = reference_class.from_pretrained(hf_dir, output_loading_info=True, attn_implementation="eager")
  assert info == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": [], "error_msgs": []}
  with torch.no_grad():
    out = reference.eval()(*(torch.from_numpy(x.astype(np.int64)) for x in inputs))
  theirs = np.stack([out.start_logits, out.end_logits], -1) if expected.head == "span" else out.logits.numpy()
  np.testing.assert_allclose(theirs, ours, atol=1e-5, rtol=0)


# References to compare with.


def hf_loss_and_logits(model, head: str, batch: dict):
  """A transformers task model's loss and logits on `batch` (bert_jax's feature names; a head of
  bert_jax.model.heads), the span head's start and end logits stacked last; the segment ids go to a model that takes
  token types (BERT's, not ModernBERT's)."""
  import torch

  tensor = lambda name: torch.from_numpy(batch[name]).long()  # noqa: E731
  kwargs = dict(input_ids=tensor("input_ids"), attention_mask=tensor("input_mask"))
  if "token_type_ids" in inspect.signature(model.forward).parameters:
    kwargs["token_type_ids"] = tensor("segment_ids")
  if head in ("classification", "choice"):
    kwargs["labels"] = tensor("label")
  elif head == "regression":
    kwargs["labels"] = torch.from_numpy(batch["label"])
  elif head == "span":
    kwargs.update(start_positions=tensor("start_positions"), end_positions=tensor("end_positions"))
  else:
    kwargs["labels"] = torch.from_numpy(np.where(batch["label_weights"] > 0, batch["labels"], -100)).long()
  out = model(**kwargs)
  if head == "span":
    return out.loss, torch.stack([out.start_logits, out.end_logits], -1)
  return out.loss, out.logits


def log_softmax(x):
  """numpy's log-softmax over the last axis (in `x`'s precision)."""
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def config_of_hf(hf_config, **overrides):
  """bert_jax's config of a transformers config, read as a `config.json` is (handoff/hf_configs.py), with
  `overrides`."""
  from bert_jax.handoff import hf_configs

  read = hf_configs.config_from_hf(hf_config.to_dict(), "the test's config.json")
  return dataclasses.replace(read, **overrides)


def hf_bert_directory(directory, words: list[str], seed: int = 0, **sizes) -> str:
  """A Hugging Face BERT directory (transformers' `BertModel` with random weights, its WordPiece vocabulary of the
  special tokens, "." and `words`, and the fast tokenizer's files) in `directory`, as sentence-transformers and
  `pretrained.load` read it; `sizes` override the tiny default sizes. Returns its path."""
  import torch
  import transformers

  directory = pathlib.Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *words]
  (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")
  values = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48)
  values.update(sizes)
  values.setdefault("max_position_embeddings", 64)
  config = transformers.BertConfig(vocab_size=len(vocab) + (-len(vocab)) % 8, **values)
  torch.manual_seed(seed)
  transformers.BertModel(config).save_pretrained(directory)
  transformers.BertTokenizerFast(str(directory / "vocab.txt")).save_pretrained(directory)
  return str(directory)
