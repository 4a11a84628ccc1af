"""A run's compiled pieces, built in one place: mesh, model, loss, optimizer, abstract state, shardings, and the
jitted train and eval steps. Pretraining (`pretraining.make_run`), fine-tuning, the dry run and the benchmarks
all start from `make_run`, so what they compile cannot drift apart.

With `members` > 0 the run trains that many models at once in one jitted program (a fine-tuning sweep): every
leaf of the state gains a leading member axis (replicated over the mesh; each member sharded as a single model
would be), the step is `jax.vmap`ped over the state and the dropout key, and all members share each batch.
"""

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bert_jax import sharding
from bert_jax.model.encoder import init_params
from bert_jax.train import step as step_lib
from bert_jax.train.guard import POLICIES, Guard


@dataclasses.dataclass(frozen=True)
class Range:
  """The values a numeric config key may take: from `low` to `high`, each end included unless open. NaN is in no
  range, and `inf` only in one that includes it."""

  low: float
  high: float = math.inf
  low_open: bool = False
  high_open: bool = True

  def __contains__(self, value) -> bool:
    above = self.low < value if self.low_open else self.low <= value
    below = value < self.high if self.high_open else value <= self.high
    return above and below

  def __str__(self) -> str:
    if self.high == math.inf and self.high_open:
      if self.low == 0:
        return "positive" if self.low_open else "non-negative"
      return f"greater than {self.low}" if self.low_open else f"at least {self.low}"
    return f"in {'(' if self.low_open else '['}{self.low}, {self.high}{')' if self.high_open else ']'}"


POSITIVE = Range(0, low_open=True)
NON_NEGATIVE = Range(0)
AT_LEAST_ONE = Range(1)


def check_ranges(config, ranges: Sequence[tuple]) -> None:
  """Raises ValueError naming the key, its value and its range for the first (dotted key, Range[, hint]) of `ranges`
  whose value is out of range; the hint follows the message."""
  for key, allowed, *hint in ranges:
    value = functools.reduce(lambda node, name: node[name], key.split("."), config)
    if value not in allowed:
      raise ValueError(" ".join([f"{key}={value} must be {allowed}.", *hint]))


# Checked for every run, pretraining or fine-tuning; each objective checks its own keys too (e.g.
# pretraining.check_config). model.*_dropout_prob are checked by BertConfig.
RANGES = (
  ("seed", NON_NEGATIVE),
  ("batch_size", AT_LEAST_ONE),
  ("num_train_steps", AT_LEAST_ONE),
  ("warmup_steps", NON_NEGATIVE),
  ("schedule_end_step", NON_NEGATIVE, "0 ends the schedule at num_train_steps."),
  ("learning_rate", POSITIVE),
  ("adam_b1", Range(0, 1)),
  ("adam_b2", Range(0, 1)),
  ("adam_eps", POSITIVE),
  ("weight_decay", NON_NEGATIVE),
  ("max_grad_norm", Range(0, math.inf, low_open=True, high_open=False), "inf disables clipping."),
  ("model.initializer_range", POSITIVE),
  ("model.layer_norm_eps", POSITIVE),
  ("log_every_steps", AT_LEAST_ONE),
  ("checkpoint_every_steps", AT_LEAST_ONE),
  ("keep_checkpoints", AT_LEAST_ONE),
  ("lease_timeout_seconds", POSITIVE),
  ("guard.spike_window", AT_LEAST_ONE),
  ("guard.max_consecutive_skips", AT_LEAST_ONE),
)


def check_config(config) -> None:
  """Raises ValueError naming the bad value, for the keys every run has."""
  check_ranges(config, RANGES)
  if config.num_microbatches < 1 or config.batch_size % config.num_microbatches:
    raise ValueError(
      f"num_microbatches={config.num_microbatches} must be at least 1 and divide batch_size={config.batch_size}."
    )
  if config.guard.nonfinite not in POLICIES:
    raise ValueError(f"guard.nonfinite={config.guard.nonfinite!r}; expected one of {POLICIES}.")
  if not (config.guard.spike_factor == 0 or config.guard.spike_factor > 1):
    raise ValueError(f"guard.spike_factor={config.guard.spike_factor} must be 0 (off) or greater than 1.")


@dataclasses.dataclass(frozen=True)
class Run:
  """Everything a loop, a dry run or a benchmark needs to step a model; nothing allocated but the mesh.

  `train_step(state, batch, dropout_key) -> (state, metric sums)` (state donated; with members, `dropout_key` is
  one key per member) and `eval_step(params, batch) -> metric sums` (per member with members).
  """

  mesh: Mesh
  rules: tuple
  model: nn.Module
  loss: step_lib.Loss
  tx: optax.GradientTransformation
  abstract: step_lib.TrainState
  shardings: step_lib.TrainState
  train_step: Callable
  eval_step: Callable
  members: int = 0

  def init_state(self, seeds: int | Sequence[int], params: dict | None = None) -> step_lib.TrainState:
    """A fresh state in `shardings` from `seeds` (one per member with members); `params` (pretrained weights,
    possibly without some heads) replace the fresh ones they cover."""
    if not self.members:
      return step_lib.create_train_state(self.model, self.tx, self.shardings, seeds, params)
    if len(seeds) != self.members:
      raise ValueError(f"{len(seeds)} seeds for {self.members} members.")

    def init(key, loaded):
      fresh = nn.meta.unbox(init_params(self.model, key))
      if loaded is not None:
        fresh = step_lib.overwrite_params(fresh, loaded)[0]
      return step_lib.TrainState(
        step=jnp.zeros((), jnp.int32), params=fresh, opt_state=self.tx.init(fresh), guard=step_lib.initial_guard()
      )

    keys = jnp.stack([jax.random.key(seed) for seed in seeds])
    return jax.jit(jax.vmap(init, in_axes=(0, None)), out_shardings=self.shardings)(keys, params)

  @property
  def num_params(self) -> int:
    """Parameters of one model (one member)."""
    leaves = jax.tree.leaves(self.abstract.params)
    return sum(leaf.size for leaf in leaves) // max(self.members, 1)


def _with_member_axis(abstract, shardings, members: int):
  """`abstract` and `shardings` with a leading member axis of size `members`, replicated over the mesh."""
  abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct((members, *a.shape), a.dtype), abstract)
  shardings = jax.tree.map(lambda s: NamedSharding(s.mesh, PartitionSpec(None, *s.spec)), shardings)
  return abstract, shardings


def make_run(
  config,
  model: nn.Module,
  loss: step_lib.Loss,
  tx: optax.GradientTransformation,
  *,
  members: int = 0,
  devices: Sequence[jax.Device] | None = None,
) -> Run:
  """Mesh from `config.mesh`, the state's shapes and shardings, and the steps jitted over them; checks the
  batch against the mesh before anything is compiled."""
  check_config(config)
  mesh = sharding.make_mesh(config.mesh.to_dict(), devices)
  sharding.check_batch_size(config.batch_size, mesh, config.num_microbatches)
  rules = tuple(tuple(rule) for rule in config.logical_axis_rules)
  abstract, shardings = step_lib.state_shardings(model, tx, mesh, rules)
  step = functools.partial(
    step_lib.train_step,
    model=model,
    loss=loss,
    tx=tx,
    num_microbatches=config.num_microbatches,
    guard=Guard.from_config(config),
  )
  evaluate = functools.partial(step_lib.eval_step, model=model, loss=loss)
  key_sharding = sharding.replicated(mesh)
  if members:
    abstract, shardings = _with_member_axis(abstract, shardings, members)
    step = jax.vmap(step, in_axes=(0, None, 0))
    evaluate = jax.vmap(evaluate, in_axes=(0, None))
  jitted_step = jax.jit(
    step_lib.with_activation_rules(step, mesh, rules),
    in_shardings=(shardings, sharding.batch_sharding(mesh), key_sharding),
    out_shardings=(shardings, sharding.replicated(mesh)),
    donate_argnums=0,
  )
  jitted_eval = jax.jit(
    step_lib.with_activation_rules(evaluate, mesh, rules),
    in_shardings=(shardings.params, sharding.batch_sharding(mesh)),
    out_shardings=sharding.replicated(mesh),
  )
  return Run(mesh, rules, model, loss, tx, abstract, shardings, jitted_step, jitted_eval, members)
