"""The train state and the pure pretraining steps.

`train_step(state, batch, dropout_key)` and `eval_step(params, batch)` are pure functions of global arrays;
`make_*` bind the model and optimizer and jit them with explicit shardings over a mesh. Metrics leave a step
as sums with their denominators (`*_count`), so hosts and steps add up exactly and padding never skews them.
"""

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax.sharding import Mesh, PartitionSpec

from bert_jax import sharding
from bert_jax.features import pretraining_shapes
from bert_jax.model import BertForPretraining


@struct.dataclass
class TrainState:
  step: jax.Array  # int32 scalar: optimizer updates applied so far.
  params: Any
  opt_state: optax.OptState


def _dummy_inputs(max_seq_length: int, max_predictions_per_seq: int) -> dict:
  shapes = pretraining_shapes(1, max_seq_length, max_predictions_per_seq)
  return {name: jnp.zeros(shape, dtype) for name, (shape, dtype) in shapes.items()}


def _model_inputs(batch: dict) -> tuple:
  return (batch["input_ids"], batch["input_mask"], batch["segment_ids"], batch["masked_lm_positions"])


def state_shardings(
  model: BertForPretraining,
  tx: optax.GradientTransformation,
  mesh: Mesh,
  rules,
  max_seq_length: int,
  max_predictions_per_seq: int,
):
  """The abstract train state (shapes only, nothing allocated) and its NamedShardings."""
  inputs = _model_inputs(_dummy_inputs(max_seq_length, max_predictions_per_seq))
  boxed = jax.eval_shape(lambda: model.init(jax.random.key(0), *inputs)["params"])
  param_specs = nn.get_partition_spec(boxed)
  abstract_params = nn.meta.unbox(boxed)
  abstract_opt_state = jax.eval_shape(tx.init, abstract_params)
  # Optimizer moments follow their parameter; counts and other scalars are replicated.
  opt_specs = optax.tree_map_params(
    tx,
    lambda _, spec: spec,
    abstract_opt_state,
    param_specs,
    transform_non_params=lambda _: PartitionSpec(),
    is_leaf=lambda x: isinstance(x, PartitionSpec),
  )
  specs = TrainState(step=PartitionSpec(), params=param_specs, opt_state=opt_specs)
  abstract = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=abstract_params, opt_state=abstract_opt_state)
  return abstract, sharding.logical_to_sharding(specs, mesh, rules)


def create_train_state(
  model: BertForPretraining,
  tx: optax.GradientTransformation,
  shardings,
  seed: int,
  max_seq_length: int,
  max_predictions_per_seq: int,
) -> TrainState:
  """Initialises the state directly into `shardings`: the full model never exists on one device."""
  inputs = _model_inputs(_dummy_inputs(max_seq_length, max_predictions_per_seq))

  def init():
    params = nn.meta.unbox(model.init(jax.random.key(seed), *inputs)["params"])
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))

  return jax.jit(init, out_shardings=shardings)()


def pretraining_loss(params, batch: dict, model: BertForPretraining, dropout_key=None, next_sentence_prediction=True):
  """Masked-LM cross-entropy (weighted by `masked_lm_weights`) + next-sentence cross-entropy (if enabled).

  Returns (loss, metrics); metrics are sums with their counts.
  """
  deterministic = dropout_key is None
  rngs = {} if deterministic else {"dropout": dropout_key}
  outputs = model.apply({"params": params}, *_model_inputs(batch), deterministic=deterministic, rngs=rngs)
  mlm_logits, nsp_logits = outputs["mlm_logits"], outputs["nsp_logits"]  # float32

  weights = batch["masked_lm_weights"]  # [batch, max_predictions]
  mlm_xent = optax.softmax_cross_entropy_with_integer_labels(mlm_logits, batch["masked_lm_ids"])
  mlm_loss_sum = jnp.sum(mlm_xent * weights)
  mlm_count = jnp.sum(weights)
  mlm_correct = jnp.sum((jnp.argmax(mlm_logits, -1) == batch["masked_lm_ids"]) * weights)

  labels = batch["next_sentence_labels"]  # [batch]
  nsp_xent = optax.softmax_cross_entropy_with_integer_labels(nsp_logits, labels)
  nsp_count = jnp.asarray(labels.shape[0], jnp.float32)
  nsp_correct = jnp.sum(jnp.argmax(nsp_logits, -1) == labels).astype(jnp.float32)

  # As in the original BERT: the MLM mean over real predictions (1e-5 guards a batch with none).
  loss = mlm_loss_sum / (mlm_count + 1e-5)
  if next_sentence_prediction:
    loss += jnp.mean(nsp_xent)
  metrics = dict(
    mlm_loss=mlm_loss_sum,
    mlm_accuracy=mlm_correct,
    mlm_count=mlm_count,
    nsp_loss=jnp.sum(nsp_xent),
    nsp_accuracy=nsp_correct,
    nsp_count=nsp_count,
  )
  return loss, metrics


def train_step(
  state: TrainState,
  batch: dict,
  dropout_key: jax.Array,
  *,
  model: BertForPretraining,
  tx: optax.GradientTransformation,
  next_sentence_prediction: bool = True,
) -> tuple[TrainState, dict]:
  """One optimizer update. Dropout is a pure function of (dropout_key, step): resumes replay it exactly."""
  step_key = jax.random.fold_in(dropout_key, state.step)
  grad_fn = jax.value_and_grad(pretraining_loss, has_aux=True)
  (loss, metrics), grads = grad_fn(state.params, batch, model, step_key, next_sentence_prediction)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = dict(metrics, loss=loss, grad_norm=optax.global_norm(grads))
  return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics


def eval_step(params, batch: dict, *, model: BertForPretraining) -> dict:
  _, metrics = pretraining_loss(params, batch, model)
  return metrics


def make_train_step(model, tx, mesh: Mesh, shardings, next_sentence_prediction: bool = True):
  """`train_step` jitted over `mesh`: state sharded as `shardings` and donated, batch split on its batch axes."""
  return jax.jit(
    functools.partial(train_step, model=model, tx=tx, next_sentence_prediction=next_sentence_prediction),
    in_shardings=(shardings, sharding.batch_sharding(mesh), sharding.replicated(mesh)),
    out_shardings=(shardings, sharding.replicated(mesh)),
    donate_argnums=0,
  )


def make_eval_step(model, mesh: Mesh, param_shardings):
  return jax.jit(
    functools.partial(eval_step, model=model),
    in_shardings=(param_shardings, sharding.batch_sharding(mesh)),
    out_shardings=sharding.replicated(mesh),
  )
