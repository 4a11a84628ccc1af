"""Tracing a model for a mesh: its activations' logical axis rules and its attention kernel's platform in context."""

import functools

import jax
from jax.sharding import Mesh

from bert_jax.model.attention import target_platform
from bert_jax.model.layers import activation_rules


def with_activation_rules(fn, mesh: Mesh, rules):
  """`fn` traced with the abstract `mesh` and the logical axis `rules` in context: the model's `act_*`
  constraints apply, and attention kernels are chosen for the platform of the mesh's devices."""
  platform = mesh.devices.flat[0].platform

  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), activation_rules(rules), target_platform(platform):
      return fn(*args, **kwargs)

  return wrapped
