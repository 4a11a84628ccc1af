"""The reference side of the train-step benchmarks: a `transformers` Flax BERT module trained with bert_jax's
optimizer, the same batches and the same dropout key (folded with the step, as bert_jax does)."""

import jax
import jax.numpy as jnp
import optax


def hf_outputs(module, params, batch: dict, dropout_key):
  """The module's training-mode outputs on a bert_jax batch (input_ids, input_mask, segment_ids)."""
  ids = batch["input_ids"]
  return module.apply(
    {"params": params},
    ids,
    batch["input_mask"],
    batch["segment_ids"],
    jnp.broadcast_to(jnp.arange(ids.shape[-1]), ids.shape),
    None,
    deterministic=False,
    rngs={"dropout": dropout_key},
  )


def hf_pretraining_loss(outputs, batch: dict):
  """MLM (at the masked positions of the reference's every-position logits) + NSP cross-entropy, as bert_jax's."""
  logits = jnp.take_along_axis(outputs.prediction_logits, batch["masked_lm_positions"][:, :, None], axis=1)
  weights = batch["masked_lm_weights"]
  mlm = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), batch["masked_lm_ids"])
  nsp = optax.softmax_cross_entropy_with_integer_labels(
    outputs.seq_relationship_logits.astype(jnp.float32), batch["next_sentence_labels"]
  )
  return jnp.sum(mlm * weights) / (jnp.sum(weights) + 1e-5) + jnp.mean(nsp)


def hf_train_step(state, batch: dict, dropout_key, *, module, loss, tx):
  """One step of `state` = (params, opt_state, step); `loss(outputs, batch)` is the scalar to minimise."""
  params, opt_state, step = state

  def objective(p):
    return loss(hf_outputs(module, p, batch, jax.random.fold_in(dropout_key, step)), batch)

  value, grads = jax.value_and_grad(objective)(params)
  updates, opt_state = tx.update(grads, opt_state, params)
  return (optax.apply_updates(params, updates), opt_state, step + 1), {"loss": value}
