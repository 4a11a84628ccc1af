"""Checksums that prove a checkpoint reads back as it was written: one 32-bit hash per array, and SHA-256 of
every small (JSON or file) item.

An array's hash is a sum, modulo 2^32, of a mixed hash of each element's bits and its position in the array: a jitted
reduction per array, so each device hashes the shard it holds and only scalars cross hosts (it scales to pods as the
checkpoint writes do), and integer addition makes the value independent of the mesh and sharding the array is
read into. A flipped bit, a swapped or a shifted element changes it. The same pass says whether every floating
point element is finite. A small array that this process holds whole is hashed by numpy on the host instead, to
the same value: a program compiled for each new shape cost more than the hash.
"""

import hashlib
import json

import jax
import jax.numpy as jnp
import numpy as np


def _mix(h):
  """A 32-bit finaliser (murmur3's fmix32): every input bit flips about half the output bits (of jax or numpy
  uint32 arrays)."""
  h = h ^ (h >> 16)
  h = h * np.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * np.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def _words(x: jax.Array) -> jax.Array:
  """The bits of `x` as uint32 words (8-byte elements give two; 1- and 2-byte elements one each)."""
  if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.random.key_data(x)
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint32)
  size = np.dtype(x.dtype).itemsize
  if size == 4:
    return jax.lax.bitcast_convert_type(x, jnp.uint32)
  if size < 4:
    return jax.lax.bitcast_convert_type(x, jnp.dtype(f"uint{8 * size}")).astype(jnp.uint32)
  return jax.lax.bitcast_convert_type(x, jnp.uint32)  # [..., size // 4]


def _hash(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  words = _words(x)
  position = jax.lax.iota(jnp.uint32, words.size).reshape(words.shape)
  value = jnp.sum(_mix(words ^ _mix(position + jnp.uint32(0x9E3779B9))), dtype=jnp.uint32)
  finite = jnp.all(jnp.isfinite(x)) if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.bool_(True)
  return value, finite


# One program per array shape, dtype and sharding, shared by a model's many arrays (its layers, Adam's moments) and
# by every tree that holds them; one program per tree was compiled again for each tree. Each result is fetched
# before the next array is dispatched: many small programs in flight at once, each with its all-reduce, deadlocked
# XLA's CPU collectives on 8 fake devices (docs/benchmarks.md).
_hash_one = jax.jit(_hash)


# Arrays of up to this many elements held whole by this process are hashed on the host (`_hash_on_host`): a small
# model's few dozen shapes cost a compile each per process (seconds in all) for microseconds of hashing. Larger
# arrays, and any spanning processes (every process then takes the jitted path with the others), are hashed where
# they lie.
HOST_ELEMENTS = 1 << 16


def _hash_on_host(x: jax.Array) -> tuple[np.uint32, np.bool_]:
  """`_hash` in numpy on the host: the same value (uint32 arithmetic wraps alike)."""
  if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.random.key_data(x)
  values = np.asarray(x)
  size = values.dtype.itemsize
  if values.dtype == np.bool_:  # The words of `_words`, case by case.
    words = values.astype(np.uint32)
  elif size == 4:
    words = values.view(np.uint32)
  elif size < 4:
    words = values.view(f"uint{8 * size}").astype(np.uint32)
  else:
    words = values.view(np.uint32).reshape(*values.shape, size // 4)
  position = np.arange(words.size, dtype=np.uint32).reshape(words.shape)
  with np.errstate(over="ignore"):
    value = np.sum(_mix(words ^ _mix(position + np.uint32(0x9E3779B9))), dtype=np.uint32)
  finite = np.all(np.isfinite(values)) if np.issubdtype(values.dtype, np.inexact) else np.bool_(True)
  return value, finite


def _hash_array(leaf) -> tuple:
  if isinstance(leaf, jax.Array) and leaf.is_fully_addressable and leaf.size <= HOST_ELEMENTS:
    return _hash_on_host(leaf)
  return jax.device_get(_hash_one(leaf))


def arrays(tree, prefix: str) -> tuple[dict[str, int], list[str]]:
  """({"<prefix>/<path>": hash} of every array in `tree`, the names of those with a non-finite element)."""
  named = jax.tree_util.tree_flatten_with_path(tree)[0]
  names = [f"{prefix}/" + "/".join(_key(k) for k in path) for path, _ in named]
  results = [_hash_array(leaf) for _, leaf in named]
  hashes = {name: int(value) for name, (value, _) in zip(names, results, strict=True)}
  return hashes, [name for name, (_, finite) in zip(names, results, strict=True) if not finite]


def _key(key) -> str:
  for attribute in ("key", "name", "idx"):
    if hasattr(key, attribute):
      return str(getattr(key, attribute))
  return str(key)


def digest(value) -> str:
  """SHA-256 of bytes, or of a JSON value in canonical form (sorted keys)."""
  if not isinstance(value, bytes):
    value = json.dumps(value, sort_keys=True).encode()
  return hashlib.sha256(value).hexdigest()
