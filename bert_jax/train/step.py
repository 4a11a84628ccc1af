"""The train state and the pure train and eval steps, for any model and loss.

`train_step(state, batch, dropout_key[, frozen], *, model, loss, tx)` and `eval_step(params, batch[, frozen], *,
model, loss)` are pure functions of global arrays (`frozen`: parameters the loss reads and never trains, a
distillation teacher's; see `run.Frozen`); `run.make_run` binds the model, the loss and the optimizer and jits them with
explicit shardings over a mesh. With `ema_decay` > 0 the state also keeps an exponential moving average of the
parameters (`TrainState.ema`), updated after every applied step. A `Loss` is the task's: pretraining's
(`train/pretraining.py`) or a fine-tuning head's (`finetune/losses.py`). Metrics leave a step as sums with their
denominators (`*_count`), so hosts and steps add up exactly and padding never skews them. Parameters are initialised
from the model's shape-only `dummy_inputs()`: their shapes never depend on a batch.
"""

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax.sharding import Mesh, PartitionSpec

from bert_jax import sharding
from bert_jax.model.attention import current_platform
from bert_jax.model.encoder import init_params
from bert_jax.train.guard import DEFAULT_GUARD, Guard


@struct.dataclass
class TrainState:
  step: jax.Array  # int32 scalar: steps taken so far (skipped ones included; see `train_step`).
  params: Any
  opt_state: optax.OptState
  # The step guard's memory: {"loss_average": float32, "finite_steps": int32} (see `guard.Guard`).
  guard: Any = None
  # The exponential moving average of `params` (`ema_decay` > 0; None without): after every applied step,
  # ema = ema_decay * ema + (1 - ema_decay) * params; it starts as the parameters it is first kept for. Checkpointed
  # as an item of its own (`workdir/checkpoints.py`), so a resume continues it exactly; `--mode=merge` writes it out.
  ema: Any = None

  def host_step(self) -> int:
    """The step as a Python int, read to the host (a sweep's members share it)."""
    return int(jax.device_get(self.step).reshape(-1)[0])


def initial_guard() -> dict:
  return {"loss_average": jnp.zeros((), jnp.float32), "finite_steps": jnp.zeros((), jnp.int32)}


@dataclasses.dataclass(frozen=True)
class Loss:
  """What a step minimises.

  `value(params, batch, model, dropout_key=None, normalizers=None) -> (loss, metric sums)`: deterministic when
  `dropout_key` is None; its sums are divided by `normalizers` when given (else by the batch's own). A run with
  frozen inputs (a teacher, `run.Frozen`) passes them as the keyword `frozen=`; no other loss receives it.
  `normalizers(batch)`: those denominators computed from a whole batch, so that the losses of its microbatches
  add up to the whole batch's loss.
  """

  value: Callable
  normalizers: Callable


def state_shardings(model: nn.Module, tx: optax.GradientTransformation, mesh: Mesh, rules, ema: bool = False):
  """The abstract train state (shapes only, nothing allocated) and its NamedShardings; with `ema`, the moving
  average of the parameters beside them, sharded as they are."""
  boxed = jax.eval_shape(lambda: init_params(model, jax.random.key(0)))
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
  guard = jax.eval_shape(initial_guard)
  specs = TrainState(
    step=PartitionSpec(),
    params=param_specs,
    opt_state=opt_specs,
    guard=jax.tree.map(lambda _: PartitionSpec(), guard),
    ema=param_specs if ema else None,
  )
  abstract = TrainState(
    step=jax.ShapeDtypeStruct((), jnp.int32),
    params=abstract_params,
    opt_state=abstract_opt_state,
    guard=guard,
    ema=abstract_params if ema else None,
  )
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


def initial_state(params, tx: optax.GradientTransformation, ema: bool = False) -> TrainState:
  """Step 0 on `params`: a fresh optimizer and guard, and with `ema` the moving average starting at `params`."""
  return TrainState(
    step=jnp.zeros((), jnp.int32),
    params=params,
    opt_state=tx.init(params),
    guard=initial_guard(),
    ema=params if ema else None,
  )


def create_train_state(
  model: nn.Module, tx: optax.GradientTransformation, shardings, seed: int, params: dict | None = None
) -> TrainState:
  """Initialises the state directly into `shardings`: the full model never exists on one device. With `params`
  (pretrained weights, possibly without some heads; see `overwrite_params`), those replace the fresh ones and
  the optimizer starts on them."""

  def init(loaded):
    params = nn.meta.unbox(init_params(model, jax.random.key(seed)))
    if loaded is not None:
      params = overwrite_params(params, loaded)[0]
    return initial_state(params, tx, ema=shardings.ema is not None)

  return jax.jit(init, out_shardings=shardings)(params)


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


def _frozen_keyword(frozen) -> dict:
  """The keyword a loss receives its frozen inputs as: none without them, so other losses never see it."""
  return {} if frozen is None else {"frozen": frozen}


def gradients(
  params, batch: dict, dropout_key, frozen=None, *, model: nn.Module, loss: Loss, num_microbatches: int = 1
):
  """((loss, metric sums), gradients) of the whole batch, computed over `num_microbatches` sequential slices.

  Each microbatch's loss is normalised by the whole batch's `loss.normalizers`, so the accumulated gradient equals
  the full-batch gradient (up to float32 summation order); activation memory is that of one microbatch. Gradients
  are of `params` alone: `frozen` (a teacher's parameters) only enters the loss.
  """
  grad_fn = functools.partial(jax.value_and_grad(loss.value, has_aux=True), **_frozen_keyword(frozen))
  if num_microbatches == 1:
    return grad_fn(params, batch, model, dropout_key)
  normalizers = loss.normalizers(batch)

  parts = microbatches(batch, num_microbatches)

  def microbatch_grads(index, microbatch):
    key = None if dropout_key is None else jax.random.fold_in(dropout_key, index)
    return grad_fn(params, microbatch, model, key, normalizers)

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
  frozen=None,
  *,
  model: nn.Module,
  loss: Loss,
  tx: optax.GradientTransformation,
  num_microbatches: int = 1,
  guard: Guard = DEFAULT_GUARD,
  ema_decay: float = 0.0,
) -> tuple[TrainState, dict]:
  """One optimizer update, unless `guard` skips the step: then the parameters, the optimizer state (its step count,
  and so the learning rate schedule, included), the parameters' moving average (`state.ema`, where kept: moved
  towards the updated parameters by 1 - `ema_decay` otherwise) and the running loss average stay as they were, the
  batch counts as
  consumed and `step` advances, so the data position and dropout stay those of an uninterrupted run. The metrics
  of a skipped step are zero but for `skipped_count` (1), `nonfinite_count` (1 if something was not finite) and the
  step's raw `skipped_loss` and `skipped_grad_norm`. Dropout is a pure function of (dropout_key, step): resumes
  replay it exactly."""
  step_key = jax.random.fold_in(dropout_key, state.step)
  (value, metrics), grads = gradients(
    state.params, batch, step_key, frozen, model=model, loss=loss, num_microbatches=num_microbatches
  )
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  grad_norm = optax.global_norm(grads)
  params_not_finite = _updated_params_not_finite(tx, grads, state)
  finite = jnp.isfinite(value) & jnp.isfinite(grad_norm) & ~params_not_finite
  average, seen = state.guard["loss_average"], state.guard["finite_steps"]
  spike = (guard.spike_factor > 0) & (seen >= guard.spike_window) & (value > guard.spike_factor * average)
  skip = ~finite | spike
  rate = 1.0 / jnp.minimum(seen + 1, guard.spike_window).astype(jnp.float32)
  metrics = dict(metrics, loss=value, grad_norm=grad_norm)
  zero = jnp.zeros((), jnp.float32)
  kept = dict(
    params=state.params,
    opt_state=state.opt_state,
    guard=state.guard,
    ema=state.ema,
    metrics=dict(
      jax.tree.map(jnp.zeros_like, metrics), skipped_count=zero + 1, skipped_loss=value, skipped_grad_norm=grad_norm
    ),
  )
  applied = dict(
    params=params,
    opt_state=opt_state,
    guard={"loss_average": average + rate * (value - average), "finite_steps": seen + 1},
    ema=moving_average(state.ema, params, ema_decay),
    metrics=dict(metrics, skipped_count=zero, skipped_loss=zero, skipped_grad_norm=zero),
  )
  outcome = _select(skip, kept, applied)
  metrics = dict(outcome["metrics"], nonfinite_count=(~finite).astype(jnp.float32))
  new_state = TrainState(
    step=state.step + 1,
    params=outcome["params"],
    opt_state=outcome["opt_state"],
    guard=outcome["guard"],
    ema=outcome["ema"],
  )
  return new_state, metrics


def moving_average(ema, params, decay: float):
  """`decay * ema + (1 - decay) * params`, leaf by leaf (float32, as the parameters); None where no average is kept."""
  if ema is None:
    return None
  return jax.tree.map(lambda average, param: decay * average + (1.0 - decay) * param, ema, params)


def _updated_params_not_finite(tx: optax.GradientTransformation, grads, state: TrainState) -> jax.Array:
  """Whether the update of `state` by `grads` leaves a parameter that is not finite, from the same update computed
  again. The select that keeps or applies the step needs this before it writes any leaf: computed from the updated
  parameters themselves, it made XLA hold the whole updated model at once beside the old one (BERT-Large at 128
  tokens, 16 rows a v5e chip, full remat: 6.32 GiB, 5.00 GiB since; docs/tpu.md). Read through an optimization
  barrier, the state is not the one the applied update reads, so XLA cannot share the two computations: each fuses
  its elementwise update into its consumer (this reduction; the select), and nothing model-sized is materialised.
  The same operations on the same values: the same answer."""
  opt_state, params = jax.lax.optimization_barrier((state.opt_state, state.params))
  updates, _ = tx.update(grads, opt_state, params)
  return optax.skip_not_finite(optax.apply_updates(params, updates), state.step, None)[0]


def _select(skip: jax.Array, kept, applied):
  """`kept` if `skip`, else `applied` (trees of one structure): what the step guard keeps or applies.

  On CPU, one conditional: XLA's CPU fusion copies the whole scalar chain behind `skip` (the loss, and sums over
  every leaf of the gradients and parameters) into each select, one per leaf of the state and per metric; a 4-layer
  BERT's step is 64k lines of HLO and 14 s to compile instead of 23k and 7 s, at the same time per step
  (docs/benchmarks.md). Elsewhere a select per leaf: XLA's TPU fusion has no such copies, and there a conditional
  would copy the state (1,261 copies in BERT-Base's step)."""
  if current_platform() == "cpu":
    return jax.lax.cond(skip, lambda: kept, lambda: applied)
  return jax.tree.map(lambda old, new: jnp.where(skip, old, new), kept, applied)


def eval_step(params, batch: dict, frozen=None, *, model: nn.Module, loss: Loss, num_microbatches: int = 1) -> dict:
  """The loss's metric sums on `batch`, without dropout, over `num_microbatches` sequential slices (sums add up, so
  the totals are the whole batch's; activation memory is that of one slice, as the train step's)."""

  def metric_sums(microbatch):
    return loss.value(params, microbatch, model, **_frozen_keyword(frozen))[1]

  if num_microbatches == 1:
    return metric_sums(batch)
  parts = microbatches(batch, num_microbatches)

  def accumulate(totals, microbatch):
    return jax.tree.map(jnp.add, totals, metric_sums(microbatch)), None

  first = jax.tree.map(lambda x: x[0], parts)
  zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), jax.eval_shape(metric_sums, first))
  return jax.lax.scan(accumulate, zeros, parts)[0]
