"""A model's fresh parameters from one small program: the random-bit hashes of all parameters drawn together.

`model.init` under `jax.jit` draws each parameter on its own: a fold_in of the seed by the parameter's path, then a
threefry hash of its shape, so XLA compiles two hashes and a dozen fusions per random parameter (951 fusions for
BERT-Base; on an H100 the program was still compiling after 168 s). `fresh_params` traces the same computation once,
inlines its calls, drops what the parameters do not need (the forward pass on the dummy inputs) and runs, level by
level, every group of exact operations (integers, keys) that are the same but for their inputs as one `jax.vmap`ped
operation: one fold_in for all paths, one hash per shape (BERT-Base's 50 matrices of 768 x 768 in one). The
floating-point arithmetic that turns bits into values stays one operation per parameter, as `model.init` has it.
The values are bitwise `model.init`'s jitted: a vmapped hash is the hash of each key, and XLA fuses each
parameter's arithmetic as before (tests/test_fresh_params.py).
"""

import collections
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jax_core

from bert_jax.model.encoder import init_params

# Call primitives whose body is evaluated inline, by the name of the parameter that holds it.
_CALLS = {
  "jit": "jaxpr",
  "pjit": "jaxpr",
  "remat2": "jaxpr",
  "closed_call": "call_jaxpr",
  "custom_jvp_call": "call_jaxpr",
}


def fresh_params(model: nn.Module, key) -> dict:
  """`model`'s parameters from `key`, unboxed: bitwise `nn.meta.unbox(init_params(model, key))`, compiled small."""
  return batched(lambda k: nn.meta.unbox(init_params(model, k)))(key)


def batched(fn: Callable) -> Callable:
  """`fn` with the operations of its trace that are the same but for their inputs run as one vmapped operation, level
  by level (a level: the operations whose inputs are all computed by lower levels). A trace with effects runs as is."""

  def run(*args):
    closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
    ops = []
    outputs = _inline(closed.jaxpr, [_const(c) for c in closed.consts], [("arg", i) for i in range(len(args))], ops)
    if any(op.eqn.effects for op in ops):
      return fn(*args)
    values = {}
    for level in _levels(ops, outputs):
      groups = collections.defaultdict(list)
      for index in level:
        groups[_signature(ops[index].eqn)].append(index)
      for members in groups.values():
        _run_group(ops, members, values, args)
    return jax.tree.unflatten(jax.tree.structure(out_shape), [_read(r, values, args) for r in outputs])

  return run


class _Op:
  """One equation of the inlined trace and where its inputs come from: ("arg", i), ("const", value, key) or
  ("op", index, output)."""

  def __init__(self, eqn, inputs):
    self.eqn, self.inputs = eqn, inputs


class _Slice:
  """Member `index` of the leading axis of `array` (the output of a vmapped group), read once when needed."""

  def __init__(self, array, index):
    self.array, self.index, self.value = array, index, None

  def read(self):
    if self.value is None:
      self.value = self.array[self.index]
    return self.value


def _const(value):
  """A constant input, keyed by its value where it is small (equal constants are one input, never stacked)."""
  if isinstance(value, bool | int | float):
    return ("const", value, ("value", type(value).__name__, repr(value)))
  if isinstance(value, np.ndarray | np.generic) and value.size <= 64:
    return ("const", value, ("value", value.dtype.str, value.shape, value.tobytes()))
  return ("const", value, ("id", id(value)))


def _inline(jaxpr, consts, args, ops) -> list:
  """Appends `jaxpr`'s equations to `ops`, calls evaluated inline, inputs as references; returns its outputs'."""
  env = dict(zip(jaxpr.constvars, consts, strict=True)) | dict(zip(jaxpr.invars, args, strict=True))

  def read(var):
    return _const(var.val) if isinstance(var, jax_core.Literal) else env[var]

  for eqn in jaxpr.eqns:
    inputs = [read(v) for v in eqn.invars]
    body = eqn.params.get(_CALLS.get(eqn.primitive.name, ""))
    if isinstance(body, jax_core.Jaxpr) and not body.constvars:
      body = jax_core.ClosedJaxpr(body, [])
    if isinstance(body, jax_core.ClosedJaxpr) and len(body.jaxpr.invars) == len(inputs):
      outputs = _inline(body.jaxpr, [_const(c) for c in body.consts], inputs, ops)
    else:
      ops.append(_Op(eqn, inputs))
      outputs = [("op", len(ops) - 1, i) for i in range(len(eqn.outvars))]
    env.update(zip(eqn.outvars, outputs, strict=True))
  return [read(v) for v in jaxpr.outvars]


def _levels(ops, outputs) -> list[list[int]]:
  """The operations `outputs` need, by level (in trace order within one)."""
  needed = [False] * len(ops)
  for ref in outputs:
    if ref[0] == "op":
      needed[ref[1]] = True
  for index in reversed(range(len(ops))):
    if needed[index]:
      for ref in ops[index].inputs:
        if ref[0] == "op":
          needed[ref[1]] = True
  level = [0] * len(ops)
  levels = collections.defaultdict(list)
  for index, op in enumerate(ops):
    if needed[index]:
      level[index] = 1 + max((level[r[1]] for r in op.inputs if r[0] == "op"), default=0)
      levels[level[index]].append(index)
  return [levels[n] for n in sorted(levels)]


def _signature(eqn):
  """Equations with equal signatures compute the same function of inputs of the same types."""
  try:
    params = tuple(sorted(eqn.params.items()))
    hash(params)
  except TypeError:
    params = object()  # Parameters that cannot be compared: a group of its own.
  return eqn.primitive, params, tuple(v.aval for v in eqn.invars)


def _ref_key(ref, values):
  """Equal keys: the same value (a constant of that value, or an output computed once for several equations)."""
  if ref[0] == "const":
    return ref[2]
  if ref[0] == "op":
    value = values[ref[1]][ref[2]]
    return ("slice", id(value.array), value.index) if isinstance(value, _Slice) else ("array", id(value))
  return ref


def _read(ref, values, args):
  if ref[0] == "arg":
    return args[ref[1]]
  if ref[0] == "const":
    return ref[1]
  value = values[ref[1]][ref[2]]
  return value.read() if isinstance(value, _Slice) else value


def _stacked(refs, values, args, aval):
  """The values of `refs` along a new leading axis: where they are members of one vmapped group's output, that output
  (or its rows, gathered)."""
  slices = [values[r[1]][r[2]] if r[0] == "op" else None for r in refs]
  if all(isinstance(s, _Slice) and s.array is slices[0].array for s in slices):
    array, rows = slices[0].array, [s.index for s in slices]
    return array if rows == list(range(array.shape[0])) else array[np.array(rows)]
  stacked = jnp.stack([_read(r, values, args) for r in refs])
  return stacked if jax.dtypes.issubdtype(aval.dtype, jax.dtypes.extended) else stacked.astype(aval.dtype)


def _run_group(ops, members, values, args):
  """Runs the equations `members` (one signature) as one operation, vmapped over the inputs that differ, where their
  results are exact (integers, keys); equations with the same inputs share one result. Floating-point operations run
  one per equation: XLA's float results can depend on what it fuses them with (a multiply-add within a fusion may be
  rounded once), so each stays in a fusion of its own parameter's operations, as in `model.init`."""
  eqn = ops[members[0]].eqn
  params = eqn.primitive.get_bind_params(eqn.params)

  def bind(*inputs):
    out = eqn.primitive.bind(*inputs, **params)
    return out if eqn.primitive.multiple_results else [out]

  keys = [tuple(_ref_key(r, values) for r in ops[m].inputs) for m in members]
  first_with = {}  # The inputs' keys -> the first member with them.
  for key, m in zip(keys, members, strict=True):
    first_with.setdefault(key, m)
  distinct = list(first_with.values())
  if len(distinct) == 1 or any(jnp.issubdtype(v.aval.dtype, jnp.inexact) for v in eqn.outvars):
    for m in distinct:
      values[m] = bind(*[_read(r, values, args) for r in ops[m].inputs])
  else:
    axes, inputs = [], []
    for position, var in enumerate(eqn.invars):
      refs = [ops[m].inputs[position] for m in distinct]
      same = all(_ref_key(r, values) == _ref_key(refs[0], values) for r in refs)
      axes.append(None if same else 0)
      inputs.append(_read(refs[0], values, args) if same else _stacked(refs, values, args, var.aval))
    outputs = jax.vmap(bind, in_axes=axes)(*inputs)
    for i, m in enumerate(distinct):
      values[m] = [_Slice(out, i) for out in outputs]
  for key, m in zip(keys, members, strict=True):
    values[m] = values[first_with[key]]
