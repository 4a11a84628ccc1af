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
from bert_jax.model import BertForPretraining, activation_rules
from bert_jax.pretraining_batch import pretraining_shapes


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


def overwrite_params(fresh: dict, loaded: dict, prefix: str = "") -> tuple[dict, list[str]]:
  """`fresh` with every subtree that `loaded` has replaced by `loaded`'s; also the paths left fresh."""
  merged, left = {}, []
  for key, value in fresh.items():
    path = f"{prefix}{key}"
    if key not in loaded:
      merged[key] = value
      left.append(path)
    elif isinstance(value, dict):
      merged[key], more = overwrite_params(value, loaded[key], path + "/")
      left += more
    else:
      merged[key] = loaded[key]
  return merged, left


def create_train_state(
  model: BertForPretraining,
  tx: optax.GradientTransformation,
  shardings,
  seed: int,
  max_seq_length: int,
  max_predictions_per_seq: int,
  params: dict | None = None,
) -> TrainState:
  """Initialises the state directly into `shardings`: the full model never exists on one device. With `params`
  (pretrained weights, possibly without some heads; see `overwrite_params`), those replace the fresh ones and
  the optimizer starts on them."""
  inputs = _model_inputs(_dummy_inputs(max_seq_length, max_predictions_per_seq))

  def init(loaded):
    params = nn.meta.unbox(model.init(jax.random.key(seed), *inputs)["params"])
    if loaded is not None:
      params = overwrite_params(params, loaded)[0]
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))

  return jax.jit(init, out_shardings=shardings)(params)


def loss_normalizers(batch: dict) -> tuple[jax.Array, jax.Array]:
  """What the MLM and NSP loss sums are divided by: real predictions (+1e-5, guarding a batch with none, as in
  the original BERT) and sequences. From the whole batch, so microbatches add up to the full-batch loss."""
  mlm = jnp.sum(batch["masked_lm_weights"]) + 1e-5
  return mlm, jnp.asarray(batch["next_sentence_labels"].shape[0], jnp.float32)


def pretraining_loss(
  params,
  batch: dict,
  model: BertForPretraining,
  dropout_key=None,
  next_sentence_prediction=True,
  normalizers: tuple | None = None,
):
  """Masked-LM cross-entropy (weighted by `masked_lm_weights`) + next-sentence cross-entropy (if enabled).

  The MLM term is the mean over real predictions, the NSP term the mean over sequences; `normalizers` (from
  `loss_normalizers` of the whole batch) replace this batch's own counts when it is one microbatch of many.
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
  )
  return loss, metrics


def microbatches(batch: dict, num_microbatches: int) -> dict:
  """[batch, ...] -> [num_microbatches, batch / num_microbatches, ...], microbatch i holding rows i, i + n, ...

  Strided, so every microbatch keeps the batch's split over the data-parallel devices.
  """

  def split(x):
    x = x.reshape(x.shape[0] // num_microbatches, num_microbatches, *x.shape[1:]).swapaxes(0, 1)
    if jax.sharding.get_abstract_mesh().empty:  # Not traced under a mesh (see with_activation_rules).
      return x
    return jax.lax.with_sharding_constraint(x, PartitionSpec(None, sharding.BATCH_AXES))

  return jax.tree.map(split, batch)


def gradients(params, batch: dict, dropout_key, *, model, next_sentence_prediction=True, num_microbatches=1):
  """((loss, metric sums), gradients) of the whole batch, computed over `num_microbatches` sequential slices.

  Each microbatch's loss is normalised by the whole batch's counts, so the accumulated gradient equals the
  full-batch gradient (up to float32 summation order); activation memory is that of one microbatch.
  """
  grad_fn = jax.value_and_grad(pretraining_loss, has_aux=True)
  if num_microbatches == 1:
    return grad_fn(params, batch, model, dropout_key, next_sentence_prediction)
  normalizers = loss_normalizers(batch)

  parts = microbatches(batch, num_microbatches)

  def microbatch_grads(index, microbatch):
    key = None if dropout_key is None else jax.random.fold_in(dropout_key, index)
    return grad_fn(params, microbatch, model, key, next_sentence_prediction, normalizers)

  def accumulate(totals, inputs):
    return jax.tree.map(jnp.add, totals, microbatch_grads(*inputs)), None

  first = jax.tree.map(lambda x: x[0], parts)
  zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), jax.eval_shape(microbatch_grads, 0, first))
  totals, _ = jax.lax.scan(accumulate, zeros, (jnp.arange(num_microbatches), parts))
  return totals


def train_step(
  state: TrainState,
  batch: dict,
  dropout_key: jax.Array,
  *,
  model: BertForPretraining,
  tx: optax.GradientTransformation,
  next_sentence_prediction: bool = True,
  num_microbatches: int = 1,
) -> tuple[TrainState, dict]:
  """One optimizer update. Dropout is a pure function of (dropout_key, step): resumes replay it exactly."""
  step_key = jax.random.fold_in(dropout_key, state.step)
  (loss, metrics), grads = gradients(
    state.params,
    batch,
    step_key,
    model=model,
    next_sentence_prediction=next_sentence_prediction,
    num_microbatches=num_microbatches,
  )
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = dict(metrics, loss=loss, grad_norm=optax.global_norm(grads))
  return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics


def eval_step(params, batch: dict, *, model: BertForPretraining) -> dict:
  _, metrics = pretraining_loss(params, batch, model)
  return metrics


def with_activation_rules(fn, mesh: Mesh, rules):
  """`fn` traced with the abstract `mesh` and the logical axis `rules` in context: the model's `act_*`
  constraints apply."""

  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), activation_rules(rules):
      return fn(*args, **kwargs)

  return wrapped


def make_train_step(
  model, tx, mesh: Mesh, shardings, rules, next_sentence_prediction: bool = True, num_microbatches: int = 1
):
  """`train_step` jitted over `mesh`: state sharded as `shardings` and donated, batch split on its batch axes,
  activations constrained by the logical axis `rules`."""
  step = functools.partial(
    train_step,
    model=model,
    tx=tx,
    next_sentence_prediction=next_sentence_prediction,
    num_microbatches=num_microbatches,
  )
  return jax.jit(
    with_activation_rules(step, mesh, rules),
    in_shardings=(shardings, sharding.batch_sharding(mesh), sharding.replicated(mesh)),
    out_shardings=(shardings, sharding.replicated(mesh)),
    donate_argnums=0,
  )


def make_eval_step(model, mesh: Mesh, param_shardings, rules):
  return jax.jit(
    with_activation_rules(functools.partial(eval_step, model=model), mesh, rules),
    in_shardings=(param_shardings, sharding.batch_sharding(mesh)),
    out_shardings=sharding.replicated(mesh),
  )
