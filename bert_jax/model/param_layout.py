"""The two parameter layouts of the encoder's layers, and the conversion between them.

Unrolled (`BertConfig.scan_layers=False`): `bert/layer_0/...`, `bert/layer_1/...`, one subtree per layer.
Scanned (`scan_layers=True`): `bert/layers/...`, the same subtree once, every leaf stacked on a leading axis
of size `num_layers`; where the first layer has other parameters than the rest (ModernBERT's has no norm before its
attention, model/stack.py), it stays `bert/layer_0/...` and `layers` stacks the other `num_layers - 1`.

`convert` rewrites every such dict inside any pytree (parameters, optimizer moments, a whole TrainState), so a
checkpoint written in one layout loads into a model of the other; under `jax.jit` with `out_shardings` the
result lands directly in the target shardings.
"""

import re
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

SCANNED_KEY = "layers"
_UNROLLED_KEY = re.compile(r"layer_(\d+)$")


def _unrolled_keys(tree: Mapping) -> list[str]:
  return sorted((k for k in tree if _UNROLLED_KEY.match(k)), key=lambda k: int(_UNROLLED_KEY.match(k).group(1)))


def _stack(tree: Mapping) -> dict:
  keys = _unrolled_keys(tree)
  if [int(_UNROLLED_KEY.match(k).group(1)) for k in keys] != list(range(len(keys))):
    raise ValueError(f"Layers {keys} are not numbered 0..{len(keys) - 1}; cannot stack them.")
  # The first layer stays unrolled where its parameters differ from the others' (they all agree after it).
  first = 1 if len(keys) > 1 and jax.tree.structure(tree[keys[0]]) != jax.tree.structure(tree[keys[1]]) else 0
  out = {k: v for k, v in tree.items() if k not in keys[first:]}
  out[SCANNED_KEY] = jax.tree.map(lambda *layers: jnp.stack(layers), *(tree[k] for k in keys[first:]))
  return out


def _unstack(tree: Mapping) -> dict:
  stacked = tree[SCANNED_KEY]
  num_layers = {leaf.shape[0] for leaf in jax.tree.leaves(stacked)}
  if len(num_layers) != 1:
    raise ValueError(f"Stacked layer parameters disagree on the number of layers: {sorted(num_layers)}.")
  out = {k: v for k, v in tree.items() if k != SCANNED_KEY}
  first = len(_unrolled_keys(tree))  # The layers kept unrolled before the stacked ones.
  for i in range(num_layers.pop()):
    out[f"layer_{first + i}"] = jax.tree.map(lambda leaf, i=i: leaf[i], stacked)
  return out


def _convert_dict(tree: Mapping, scanned: bool) -> dict:
  tree = {k: _convert_dict(v, scanned) if isinstance(v, Mapping) else v for k, v in tree.items()}
  if scanned and _unrolled_keys(tree) and SCANNED_KEY not in tree:
    return _stack(tree)
  if not scanned and SCANNED_KEY in tree:
    return _unstack(tree)
  return tree


def convert(tree: Any, scanned: bool) -> Any:
  """`tree` with every layer dict in the scanned (True) or unrolled (False) layout; other leaves untouched."""
  return jax.tree.map(
    lambda node: _convert_dict(node, scanned) if isinstance(node, Mapping) else node,
    tree,
    is_leaf=lambda node: isinstance(node, Mapping),
  )
