"""A run's compiled pieces, built in one place: mesh, model, loss, optimizer, abstract state, shardings, and the
jitted train and eval steps. Pretraining (`pretraining.make_run`), fine-tuning, the dry run and the benchmarks
all start from `make_run`, so what they compile cannot drift apart.

With `members` > 0 the run trains that many models at once in one jitted program (a fine-tuning sweep): every
leaf of the state gains a leading member axis (replicated over the mesh; each member sharded as a single model
would be), the train step is `jax.vmap`ped over the state, the batch and the dropout key (each member trains on its own
rows: batches [members, rows, ...]) and the eval step over the state (every member scores the same rows).
"""

import dataclasses
import functools
from collections.abc import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bert_jax import sharding
from bert_jax.model.encoder import init_params
from bert_jax.train import step as step_lib
from bert_jax.train.guard import Guard


@dataclasses.dataclass(frozen=True)
class Run:
  """Everything a loop, a dry run or a benchmark needs to step a model; nothing allocated but the mesh.

  `train_step(state, batch, dropout_key) -> (state, metric sums)` (state donated; with members, the batch has a
  leading member axis and `dropout_key` is one key per member) and `eval_step(params, batch) -> metric sums` (per
  member with members, on one shared batch).
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
    step = jax.vmap(step, in_axes=(0, 0, 0))
    evaluate = jax.vmap(evaluate, in_axes=(0, None))
  jitted_step = jax.jit(
    step_lib.with_activation_rules(step, mesh, rules),
    in_shardings=(shardings, sharding.batch_sharding(mesh, members=bool(members)), key_sharding),
    out_shardings=(shardings, sharding.replicated(mesh)),
    donate_argnums=0,
  )
  jitted_eval = jax.jit(
    step_lib.with_activation_rules(evaluate, mesh, rules),
    in_shardings=(shardings.params, sharding.batch_sharding(mesh)),
    out_shardings=sharding.replicated(mesh),
  )
  return Run(mesh, rules, model, loss, tx, abstract, shardings, jitted_step, jitted_eval, members)
