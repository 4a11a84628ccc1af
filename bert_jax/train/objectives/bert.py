"""BERT's objective (`config.objective = "bert"`, Devlin et al. 2018): masked-LM cross-entropy plus the sentence
task's cross-entropy (next sentence or ALBERT's sentence order, by `data.instances`), as a step's `Loss`.

It reads the pretraining batch (`data/pretraining_batch.py`); the step machinery (`train/step.py`) takes it like any
task's loss. Its metric sums (`masked_lm_sums`, `row_sums`) and the batch's model inputs are shared by the other
objectives (ELECTRA, distillation), which count the same things.
"""

import functools

import jax
import jax.numpy as jnp
import optax

from bert_jax import flops
from bert_jax.data import instances
from bert_jax.model.bert_config import BertConfig
from bert_jax.model.encoder import BertForPretraining
from bert_jax.train.objectives.objective import Objective
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


def masked_lm_sums(mlm_logits: jax.Array, batch: dict) -> dict:
  """The masked LM's cross-entropy (`mlm_loss`) and correct predictions (`mlm_accuracy`) summed over the real
  predictions (`masked_lm_weights`), and their count (`mlm_count`); `mlm_logits` [batch, max_predictions, vocab]."""
  weights = batch["masked_lm_weights"]  # [batch, max_predictions]
  xent = optax.softmax_cross_entropy_with_integer_labels(mlm_logits, batch["masked_lm_ids"])
  return dict(
    mlm_loss=jnp.sum(xent * weights),
    mlm_accuracy=jnp.sum((jnp.argmax(mlm_logits, -1) == batch["masked_lm_ids"]) * weights),
    mlm_count=jnp.sum(weights),
  )


def row_sums(batch: dict) -> dict:
  """Per row: the fraction of real (non-padding) tokens and the instances it holds (more than one when packed)."""
  return dict(
    row_fill=jnp.sum(batch["input_mask"] > 0) / batch["input_mask"].shape[1],
    row_instances=jnp.sum(next_sentence_weights(batch)),
    row_count=jnp.asarray(batch["input_mask"].shape[0], jnp.float32),
  )


def pretraining_loss(
  params,
  batch: dict,
  model: BertForPretraining,
  dropout_key=None,
  normalizers: tuple | None = None,
  *,
  sentence_task: str | None = "nsp",
):
  """Masked-LM cross-entropy (weighted by `masked_lm_weights`) + the sentence task's cross-entropy on the `nsp` head
  (`sentence_task`: "nsp", "sop", or None for none).

  The MLM term is the mean over real predictions, the sentence term the mean over instances; `normalizers` (from
  `loss_normalizers` of the whole batch) replace this batch's own counts when it is one microbatch of many.
  Returns (loss, metrics); metrics are sums with their counts, the sentence task's named for it (`sop_accuracy`)
  and only with one.
  """
  deterministic = dropout_key is None
  rngs = {} if deterministic else {"dropout": dropout_key}
  outputs = model.apply({"params": params}, **model_inputs(batch), deterministic=deterministic, rngs=rngs)
  mlm_logits = outputs["mlm_logits"]  # float32

  mlm_normalizer, sentence_normalizer = loss_normalizers(batch) if normalizers is None else normalizers
  metrics = dict(masked_lm_sums(mlm_logits, batch), **row_sums(batch))
  loss = metrics["mlm_loss"] / mlm_normalizer
  instances = next_sentence_weights(batch)
  if sentence_task:
    # A family without a sentence head returns no nsp_logits; config_checks gives it no sentence task.
    nsp_logits = outputs["nsp_logits"]  # float32
    labels = batch["next_sentence_labels"]  # [batch], or [batch, instances] for packed rows
    xent = optax.softmax_cross_entropy_with_integer_labels(nsp_logits, labels) * instances
    loss += jnp.sum(xent) / sentence_normalizer
    metrics[f"{sentence_task}_loss"] = jnp.sum(xent)
    metrics[f"{sentence_task}_accuracy"] = jnp.sum((jnp.argmax(nsp_logits, -1) == labels) * instances)
    metrics[f"{sentence_task}_count"] = jnp.sum(instances)
  return loss, metrics


def make_loss(sentence_task: str | None = "nsp") -> Loss:
  """The pretraining `Loss`: masked LM, plus `sentence_task` ("nsp", "sop"; None: masked LM alone)."""
  value = functools.partial(pretraining_loss, sentence_task=sentence_task)
  return Loss(value=value, normalizers=loss_normalizers)


def shown_metrics(sentence_task: str | None, evaluation: bool = False) -> tuple[str, ...]:
  """The metrics a progress or eval line shows: masked LM's, and the sentence task's when there is one."""
  shown = ("mlm_loss", "mlm_accuracy")
  if sentence_task:
    shown += (f"{sentence_task}_accuracy", f"{sentence_task}_loss") if evaluation else (f"{sentence_task}_accuracy",)
  return shown


def _flops(config, model_cfg: BertConfig, frozen, training: bool = True) -> float:
  """BERT's model FLOPs per train step (forward and backward), or per eval step (forward) when not `training`."""
  seq, preds = config.data.max_seq_length, config.data.max_predictions_per_seq
  step = flops.train_flops_per_step(model_cfg, config.batch_size, seq, preds)
  return step if training else flops.forward_flops(step)


OBJECTIVE = Objective(
  name="bert",
  model=lambda config, model_cfg: BertForPretraining(model_cfg),
  loss=lambda config, frozen: make_loss(instances.sentence_task(config.data)),
  flops=_flops,
  shown=lambda config, evaluation: shown_metrics(instances.sentence_task(config.data), evaluation),
)
