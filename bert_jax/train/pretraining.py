"""The pretraining objective: masked-LM cross-entropy plus next-sentence cross-entropy, as a step's `Loss`.

Reads the pretraining batch (`data/pretraining_batch.py`); the step machinery (`train/step.py`) takes it like any
task's loss. `make_run` is the pretraining run (BertForPretraining, this loss, the configured optimizer) that the
loop, the dry run and the benchmarks compile.
"""

import functools

import jax
import jax.numpy as jnp
import optax

from bert_jax import flops
from bert_jax.model.bert_config import BertConfig
from bert_jax.model.encoder import BertForPretraining
from bert_jax.train import run
from bert_jax.train.optim import make_optimizer
from bert_jax.train.step import Loss


def next_sentence_weights(batch: dict) -> jax.Array:
  """1 for every instance's next-sentence label: one per row ([batch]), or per packed instance ([batch, instances],
  0 where a row has fewer instances)."""
  if "next_sentence_weights" in batch:
    return batch["next_sentence_weights"]
  return jnp.ones(batch["next_sentence_labels"].shape, jnp.float32)


def loss_normalizers(batch: dict) -> tuple[jax.Array, jax.Array]:
  """What the MLM and NSP loss sums are divided by: real predictions (+1e-5, guarding a batch with none, as in
  the original BERT) and instances (sequences). From the whole batch, so microbatches add up to the full-batch
  loss."""
  mlm = jnp.sum(batch["masked_lm_weights"]) + 1e-5
  return mlm, jnp.maximum(jnp.sum(next_sentence_weights(batch)), 1.0)


def model_inputs(batch: dict) -> dict:
  """The model's keyword inputs from a pretraining batch, packed (`position_ids`, `cls_positions`) or not."""
  names = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "position_ids", "cls_positions")
  return {name: batch[name] for name in names if name in batch}


def pretraining_loss(
  params,
  batch: dict,
  model: BertForPretraining,
  dropout_key=None,
  normalizers: tuple | None = None,
  *,
  next_sentence_prediction: bool = True,
):
  """Masked-LM cross-entropy (weighted by `masked_lm_weights`) + next-sentence cross-entropy (if enabled).

  The MLM term is the mean over real predictions, the NSP term the mean over instances; `normalizers` (from
  `loss_normalizers` of the whole batch) replace this batch's own counts when it is one microbatch of many.
  Returns (loss, metrics); metrics are sums with their counts.
  """
  deterministic = dropout_key is None
  rngs = {} if deterministic else {"dropout": dropout_key}
  outputs = model.apply({"params": params}, **model_inputs(batch), deterministic=deterministic, rngs=rngs)
  mlm_logits, nsp_logits = outputs["mlm_logits"], outputs["nsp_logits"]  # float32

  weights = batch["masked_lm_weights"]  # [batch, max_predictions]
  mlm_xent = optax.softmax_cross_entropy_with_integer_labels(mlm_logits, batch["masked_lm_ids"])
  mlm_loss_sum = jnp.sum(mlm_xent * weights)
  mlm_count = jnp.sum(weights)
  mlm_correct = jnp.sum((jnp.argmax(mlm_logits, -1) == batch["masked_lm_ids"]) * weights)

  labels = batch["next_sentence_labels"]  # [batch], or [batch, instances] for packed rows
  nsp_weights = next_sentence_weights(batch)
  nsp_xent = optax.softmax_cross_entropy_with_integer_labels(nsp_logits, labels) * nsp_weights
  nsp_count = jnp.sum(nsp_weights)
  nsp_correct = jnp.sum((jnp.argmax(nsp_logits, -1) == labels) * nsp_weights)

  mlm_normalizer, nsp_normalizer = loss_normalizers(batch) if normalizers is None else normalizers
  loss = mlm_loss_sum / mlm_normalizer
  if next_sentence_prediction:
    loss += jnp.sum(nsp_xent) / nsp_normalizer
  metrics = dict(
    mlm_loss=mlm_loss_sum,
    mlm_accuracy=mlm_correct,
    mlm_count=mlm_count,
    nsp_loss=jnp.sum(nsp_xent),
    nsp_accuracy=nsp_correct,
    nsp_count=nsp_count,
    # Per row: the fraction of real (non-padding) tokens and the instances it holds (more than one when packed).
    row_fill=jnp.sum(batch["input_mask"] > 0) / batch["input_mask"].shape[1],
    row_instances=nsp_count,
    row_count=jnp.asarray(batch["input_mask"].shape[0], jnp.float32),
  )
  return loss, metrics


def make_loss(next_sentence_prediction: bool = True) -> Loss:
  """The pretraining `Loss`; without the NSP term when `next_sentence_prediction` is False (NSP metrics stay)."""
  value = functools.partial(pretraining_loss, next_sentence_prediction=next_sentence_prediction)
  return Loss(value=value, normalizers=loss_normalizers)


def model_config(config) -> BertConfig:
  return BertConfig(**config.model.to_dict())


# Pretraining's own keys, beside run.RANGES.
RANGES = (
  ("data.masked_lm_prob", run.Range(0, 1, low_open=True, high_open=False)),
  ("data.short_seq_prob", run.Range(0, 1, high_open=False)),
  ("data.shuffle_buffer", run.AT_LEAST_ONE),
  ("data.num_readers", run.NON_NEGATIVE, "0: one per host of the first launch."),
  ("data.max_instances_per_row", run.AT_LEAST_ONE),
  ("data.packing_group", run.AT_LEAST_ONE),
  ("data.num_shards", run.AT_LEAST_ONE),
  ("data.prepare_unit_bytes", run.Range(1024)),
  ("data.max_document_bytes", run.Range(1024)),
  ("data.eval_fraction", run.Range(0, 0.5, high_open=False)),
  ("data.eval_min_documents", run.NON_NEGATIVE),
  ("tokenizer.train_max_sentences", run.AT_LEAST_ONE),
  ("eval_every_steps", run.AT_LEAST_ONE),
  ("profile.start_step", run.NON_NEGATIVE, "0: no profile."),
  ("profile.num_steps", run.AT_LEAST_ONE),
  ("eval_steps", run.NON_NEGATIVE, "0 disables evaluation."),
)


def check_config(config) -> BertConfig:
  """Raises ValueError naming the bad value; returns the model config. Before anything is compiled or written."""
  run.check_config(config)
  run.check_ranges(config, RANGES)
  model = model_config(config)
  seq, preds = config.data.max_seq_length, config.data.max_predictions_per_seq
  if seq > model.max_position_embeddings:
    raise ValueError(
      f"data.max_seq_length={seq} exceeds model.max_position_embeddings="
      f"{model.max_position_embeddings}: positions beyond it have no embedding."
    )
  if seq < 5:
    raise ValueError(f"data.max_seq_length={seq} cannot fit a pair: [CLS] A [SEP] B [SEP] needs at least 5.")
  if not 0 < preds <= seq:
    raise ValueError(f"data.max_predictions_per_seq={preds} must be in [1, data.max_seq_length={seq}].")
  if config.schedule_end_step and config.schedule_end_step < config.num_train_steps:
    raise ValueError(
      f"schedule_end_step={config.schedule_end_step} is before num_train_steps={config.num_train_steps}: the "
      "learning rate would reach zero before training ends (0: end the schedule at num_train_steps)."
    )
  flops.peak_flops_per_device("", config.peak_tflops_per_device)  # Raises on a negative peak.
  if config.data.source not in ("pretraining", "synthetic"):
    raise ValueError(f"data.source={config.data.source!r}; expected 'pretraining' or 'synthetic'.")
  readers = config.data.num_readers
  if config.data.source == "pretraining" and readers and config.batch_size % readers:
    raise ValueError(
      f"batch_size={config.batch_size} does not split over data.num_readers={readers}: each reader makes an equal "
      "part of every batch."
    )
  return model


def make_run(config, devices=None, model_cfg: BertConfig | None = None) -> run.Run:
  """The pretraining run of `config` (checked first); `model_cfg` replaces the config's model (e.g. another layer
  layout)."""
  checked = check_config(config)
  model = BertForPretraining(model_cfg or checked)
  loss = make_loss(config.data.next_sentence_prediction)
  return run.make_run(config, model, loss, make_optimizer(config), devices=devices)
