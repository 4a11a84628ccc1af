"""ELECTRA's objective (Clark et al. 2020), as a step's `Loss`: replaced-token detection with a jointly trained
generator (`config.objective = "electra"`; the model is model/electra.py's).

One step, as the official `run_pretraining.py` (`PretrainingModel`) does it:
1. the generator reads the batch's masked input (ELECTRA masks 85% of the selected tokens with [MASK] and keeps
   15%: `data.mask_token_fraction=0.85`, `data.random_token_fraction=0`) and predicts the selected tokens: the
   masked-LM loss, the mean over real predictions;
2. a token is sampled at each selected position from the generator's distribution at temperature
   `electra.sampling_temperature`, from logits under `stop_gradient`: no gradient flows through the sampling;
3. the discriminator reads the ORIGINAL sequence (the batch's `masked_lm_ids` restored at the selected positions,
   so no [MASK] and none of the pipeline's random tokens) with the samples written over the selected positions,
   and labels every real token replaced (1) or original (0); a sample that equals the original token is original,
   as in the official `_get_fake_data`;
4. loss = MLM + `electra.rtd_weight` x RTD, RTD being the sigmoid cross-entropy's mean over real tokens.

The generator's dropout, the discriminator's and the sampling each take their own key derived from the step's
dropout key; evaluation (no dropout key) samples with a fixed key, so an evaluation is deterministic.
"""

import functools

import jax
import jax.numpy as jnp
import optax

from bert_jax import flops
from bert_jax.model.bert_config import BertConfig, electra_generator
from bert_jax.model.electra import ElectraForPretraining
from bert_jax.train.objectives import bert
from bert_jax.train.objectives.objective import Objective
from bert_jax.train.step import Loss

# What each random draw of a step folds into its dropout key.
_SAMPLING, _GENERATOR_DROPOUT, _DISCRIMINATOR_DROPOUT = 0, 1, 2
_ENCODER_INPUTS = ("input_mask", "segment_ids", "position_ids")


def loss_normalizers(batch: dict) -> tuple[jax.Array, jax.Array]:
  """What the MLM and RTD loss sums are divided by: real predictions (+1e-5, as BERT's) and real tokens. From the
  whole batch, so microbatches add up to the full-batch loss."""
  mlm = jnp.sum(batch["masked_lm_weights"]) + 1e-5
  return mlm, jnp.maximum(jnp.sum(batch["input_mask"] > 0).astype(jnp.float32), 1.0)


def write_predictions(ids: jax.Array, positions: jax.Array, values: jax.Array, weights: jax.Array) -> jax.Array:
  """`ids` [batch, seq] with `values` [batch, predictions] written at `positions` where `weights` > 0; a padded
  prediction slot (weight 0, position 0) writes nothing."""
  positions = jnp.where(weights > 0, positions, ids.shape[1])  # Out of range: dropped.
  return jax.vmap(lambda row, where, value: row.at[where].set(value, mode="drop"))(ids, positions, values)


def replaced_tokens(key: jax.Array, mlm_logits: jax.Array, batch: dict, temperature: float):
  """(original, corrupted, labels), each [batch, seq]: the batch's sequence with its selected tokens restored, the
  same with the generator's samples (drawn with `key` at `temperature` from `mlm_logits`, no gradient) at the
  selected positions, and 1 where the two differ on a real token."""
  positions, weights = batch["masked_lm_positions"], batch["masked_lm_weights"]
  original = write_predictions(batch["input_ids"], positions, batch["masked_lm_ids"], weights)
  samples = jax.random.categorical(key, jax.lax.stop_gradient(mlm_logits) / temperature)
  corrupted = write_predictions(original, positions, samples.astype(original.dtype), weights)
  labels = (corrupted != original) & (batch["input_mask"] > 0)
  return original, corrupted, labels


def electra_loss(
  params,
  batch: dict,
  model: ElectraForPretraining,
  dropout_key=None,
  normalizers: tuple | None = None,
  *,
  rtd_weight: float,
  temperature: float,
):
  """The generator's masked-LM loss + `rtd_weight` x the discriminator's replaced-token-detection loss (see the
  module docstring); `normalizers` (`loss_normalizers` of the whole batch) replace this batch's own counts when it
  is one microbatch of many. Returns (loss, metrics); metrics are sums with their counts: the generator's masked LM
  (`mlm_*`), and over real tokens the RTD loss, its accuracy and the fraction replaced (`rtd_*`)."""
  deterministic = dropout_key is None
  key = jax.random.key(0) if deterministic else dropout_key

  def apply(method, input_ids, salt, **more):
    rngs = {} if deterministic else {"dropout": jax.random.fold_in(key, salt)}
    inputs = dict({name: batch[name] for name in _ENCODER_INPUTS if name in batch}, input_ids=input_ids, **more)
    return model.apply({"params": params}, **inputs, deterministic=deterministic, rngs=rngs, method=method)

  positions = dict(masked_lm_positions=batch["masked_lm_positions"])
  mlm_logits = apply(ElectraForPretraining.generate, batch["input_ids"], _GENERATOR_DROPOUT, **positions)
  _, corrupted, labels = replaced_tokens(jax.random.fold_in(key, _SAMPLING), mlm_logits, batch, temperature)
  rtd_logits = apply(ElectraForPretraining.discriminate, corrupted, _DISCRIMINATOR_DROPOUT)["rtd_logits"]

  real = (batch["input_mask"] > 0).astype(jnp.float32)  # [batch, seq]
  targets = labels.astype(jnp.float32)
  rtd_xent = optax.sigmoid_binary_cross_entropy(rtd_logits, targets) * real
  mlm_normalizer, token_normalizer = loss_normalizers(batch) if normalizers is None else normalizers
  metrics = dict(
    bert.masked_lm_sums(mlm_logits, batch),
    rtd_loss=jnp.sum(rtd_xent),
    rtd_accuracy=jnp.sum(((rtd_logits > 0) == labels) * real),
    rtd_replaced=jnp.sum(targets * real),
    rtd_count=jnp.sum(real),
    **bert.row_sums(batch),
  )
  loss = metrics["mlm_loss"] / mlm_normalizer + rtd_weight * metrics["rtd_loss"] / token_normalizer
  return loss, metrics


def make_loss(rtd_weight: float, temperature: float) -> Loss:
  """ELECTRA's `Loss` with the RTD weight (the paper's lambda, 50) and the sampling temperature."""
  value = functools.partial(electra_loss, rtd_weight=rtd_weight, temperature=temperature)
  return Loss(value=value, normalizers=loss_normalizers)


def _model(config, model_cfg: BertConfig) -> ElectraForPretraining:
  return ElectraForPretraining(model_cfg, electra_generator(config, model_cfg))


def _flops(config, model_cfg: BertConfig, frozen, training: bool = True) -> float:
  """The generator's and the discriminator's model FLOPs per train step (forward and backward), or per eval step
  (forward) when not `training`."""
  generator = electra_generator(config, model_cfg)
  seq, preds = config.data.max_seq_length, config.data.max_predictions_per_seq
  step = flops.electra_flops_per_step(model_cfg, generator, config.batch_size, seq, preds)
  return step if training else flops.forward_flops(step)


OBJECTIVE = Objective(
  name="electra",
  model=_model,
  loss=lambda config, frozen: make_loss(config.electra.rtd_weight, config.electra.sampling_temperature),
  flops=_flops,
  # rtd_replaced: the fraction of real tokens the generator's samples changed.
  shown=lambda config, evaluation: (
    ("mlm_loss", "mlm_accuracy", "rtd_loss", "rtd_accuracy") + (("rtd_replaced",) if evaluation else ())
  ),
)
