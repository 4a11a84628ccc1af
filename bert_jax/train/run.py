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
from bert_jax.model.mesh_context import with_activation_rules
from bert_jax.train import step as step_lib
from bert_jax.train.fresh_params import fresh_params
from bert_jax.train.guard import Guard


@dataclasses.dataclass(frozen=True)
class Frozen:
  """Parameters that a run's steps read and never train (a distillation teacher), described from metadata when the
  run is made and read onto its mesh once it exists (`Run.read_frozen`), before anything is written."""

  name: str  # What they are ("teacher"): the key of `identity` in every checkpoint's history.
  model: nn.Module  # The model they are the parameters of: their shapes and logical axes.
  identity: dict  # Where they come from (JSON): recorded in checkpoints; a resume with another one is refused.
  read: Callable[[Mesh, tuple], dict]  # (mesh, rules) -> the parameters, placed in their shardings on `mesh`.


@dataclasses.dataclass(frozen=True)
class Run:
  """Everything a loop, a dry run or a benchmark needs to step a model; nothing allocated but the mesh.

  `train_step(state, batch, dropout_key, *frozen_args) -> (state, metric sums)` (state donated; with members, the
  batch has a leading member axis and `dropout_key` is one key per member) and `eval_step(params, batch,
  *frozen_args) -> metric sums` (per member with members, on one shared batch). `frozen_args` is empty unless the
  run has `frozen` inputs, and then holds them once `read_frozen` has read them.
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
  frozen: Frozen | None = None
  frozen_shardings: dict | None = None  # NamedShardings of the frozen parameters on `mesh`.
  frozen_args: tuple = ()

  def read_frozen(self) -> "Run":
    """This run with its frozen parameters read onto its mesh (`frozen.read`), checked to be the shapes the steps
    were compiled for and placed in their shardings (where they already are, nothing moves); itself when it has
    none."""
    if self.frozen is None:
      return self
    params = self.frozen.read(self.mesh, self.rules)
    (expected,) = self.frozen_abstract_args
    shapes = jax.tree.map(lambda x: (tuple(x.shape), str(x.dtype)), params)
    wanted = jax.tree.map(lambda x: (tuple(x.shape), str(x.dtype)), expected)
    if shapes != wanted:
      raise ValueError(
        f"The {self.frozen.name} {self.frozen.identity} does not have its model's parameters: {shapes} vs {wanted}."
      )
    return dataclasses.replace(self, frozen_args=(jax.device_put(params, self.frozen_shardings),))

  @property
  def frozen_abstract_args(self) -> tuple:
    """The frozen parameters as ShapeDtypeStructs in their shardings (what the dry run compiles the steps for);
    empty without frozen inputs."""
    if self.frozen is None:
      return ()
    return (sharding.with_shardings(nn.meta.unbox(_abstract_boxed(self.frozen.model)), self.frozen_shardings),)

  def init_state(self, seeds: int | Sequence[int], params: dict | None = None) -> step_lib.TrainState:
    """A fresh state in `shardings` from `seeds` (one per member with members); `params` (pretrained weights,
    possibly without some heads) replace the fresh ones they cover, and the parameters' moving average (where the run
    keeps one) starts at them. The fresh parameters are `init_params`' bitwise, drawn as one small program
    (`fresh_params`)."""

    def init(key, loaded):
      fresh = fresh_params(self.model, key)
      if loaded is not None:
        fresh = step_lib.overwrite_params(fresh, loaded)[0]
      return step_lib.initial_state(fresh, self.tx, ema=self.abstract.ema is not None)

    if not self.members:
      return jax.jit(lambda loaded: init(jax.random.key(seeds), loaded), out_shardings=self.shardings)(params)
    if len(seeds) != self.members:
      raise ValueError(f"{len(seeds)} seeds for {self.members} members.")
    keys = jnp.stack([jax.random.key(seed) for seed in seeds])
    return jax.jit(jax.vmap(init, in_axes=(0, None)), out_shardings=self.shardings)(keys, params)

  @property
  def num_params(self) -> int:
    """Parameters of one model (one member)."""
    leaves = jax.tree.leaves(self.abstract.params)
    return sum(leaf.size for leaf in leaves) // max(self.members, 1)


def _abstract_boxed(model: nn.Module) -> dict:
  """`model`'s parameter shapes, boxed with their logical axis names; nothing allocated."""
  return jax.eval_shape(lambda: init_params(model, jax.random.key(0)))


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
  frozen: Frozen | None = None,
  mesh: Mesh | None = None,
  eval_microbatches: int = 1,
) -> Run:
  """Mesh from `config.mesh` over `devices` (or `mesh`, made so already), the state's shapes and shardings (with the
  parameters' moving average where `config.ema_decay` > 0), and the steps jitted over them; checks the
  batch against the mesh before anything is compiled. With `frozen`, the steps take its parameters as one more
  argument (see the module docstring); they are read later, by `Run.read_frozen`. The eval step runs its batch in
  `eval_microbatches` sequential slices."""
  mesh = mesh or sharding.make_mesh(config.mesh.to_dict(), devices)
  sharding.check_batch_size(config.batch_size, mesh, config.num_microbatches)
  rules = tuple(tuple(rule) for rule in config.logical_axis_rules)
  abstract, shardings = step_lib.state_shardings(model, tx, mesh, rules, ema=config.ema_decay > 0)
  step = functools.partial(
    step_lib.train_step,
    model=model,
    loss=loss,
    tx=tx,
    num_microbatches=config.num_microbatches,
    guard=Guard.from_config(config),
    ema_decay=config.ema_decay,
  )
  evaluate = functools.partial(step_lib.eval_step, model=model, loss=loss, num_microbatches=eval_microbatches)
  key_sharding = sharding.replicated(mesh)
  frozen_shardings = None
  if frozen is not None:
    frozen_shardings = sharding.logical_to_sharding(nn.get_partition_spec(_abstract_boxed(frozen.model)), mesh, rules)
  extra = () if frozen is None else (frozen_shardings,)  # Never donated: every step reads them again.
  if members:
    abstract, shardings = _with_member_axis(abstract, shardings, members)
    step = jax.vmap(step, in_axes=(0, 0, 0) + (None,) * len(extra))  # Every member reads the same frozen inputs.
    evaluate = jax.vmap(evaluate, in_axes=(0, None) + (None,) * len(extra))
  jitted_step = jax.jit(
    with_activation_rules(step, mesh, rules),
    in_shardings=(shardings, sharding.batch_sharding(mesh, members=bool(members)), key_sharding, *extra),
    out_shardings=(shardings, sharding.replicated(mesh)),
    donate_argnums=0,
  )
  jitted_eval = jax.jit(
    with_activation_rules(evaluate, mesh, rules),
    in_shardings=(shardings.params, sharding.batch_sharding(mesh), *extra),
    out_shardings=sharding.replicated(mesh),
  )
  return Run(
    mesh, rules, model, loss, tx, abstract, shardings, jitted_step, jitted_eval, members, frozen, frozen_shardings
  )
