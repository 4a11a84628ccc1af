"""The fresh parameters (bert_jax/train/fresh_params.py): bitwise those of `model.init` jitted (what a run's state
started from before them), from a program without a random-bit hash per parameter."""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.model.encoder import init_params
from bert_jax.train import pretraining
from bert_jax.train.fresh_params import fresh_params


def _bits(tree) -> list[bytes]:
  return [np.asarray(leaf).tobytes() for leaf in jax.tree.leaves(tree)]


def _model(config):
  config.mesh.update(data=-1, fsdp=1, tensor=1)
  return pretraining.make_run(config, jax.devices()[:1]).model


def test_the_fresh_parameters_are_model_inits_bitwise_from_a_small_program(small_config):
  small_config.model.num_layers = 4  # Unrolled: `model.init` draws each layer's parameters on their own.
  model, key = _model(small_config), jax.random.key(3)
  compiled = jax.jit(lambda k: fresh_params(model, k)).lower(key).compile()
  program, fresh = compiled.as_text(), compiled(key)
  plain = jax.jit(lambda k: nn.meta.unbox(init_params(model, k)))(key)
  assert jax.tree.structure(fresh) == jax.tree.structure(plain)
  assert _bits(fresh) == _bits(plain)
  # `model.init` jitted compiles to 273 fusions and 60 threefry loops for these 78 arrays (the tests' XLA flags,
  # 2026-12-02): a fold_in and a hash per random parameter. Here: a loop per shape, a fusion per array's arithmetic.
  arrays, fusions = len(jax.tree.leaves(plain)), len(re.findall(r" fusion\(", program))
  assert fusions < 2 * arrays, f"{fusions} fusions for {arrays} parameter arrays"
  assert len(re.findall(r" while\(", program)) <= 10


def test_a_sweeps_members_get_their_own_seeds_parameters(small_config):
  model = _model(small_config)
  keys = jnp.stack([jax.random.key(seed) for seed in (0, 5)])
  fresh = jax.jit(jax.vmap(lambda k: fresh_params(model, k)))(keys)
  plain = jax.jit(jax.vmap(lambda k: nn.meta.unbox(init_params(model, k))))(keys)
  assert _bits(fresh) == _bits(plain)
  assert _bits(jax.tree.map(lambda x: x[0], fresh)) != _bits(jax.tree.map(lambda x: x[1], fresh))
