"""Rotary position embeddings (RoPE, Su et al. 2021), as ModernBERT and the other modern encoders apply them to each
layer's queries and keys instead of adding a position table to the embeddings.

The convention is GPT-NeoX's, which transformers' ModernBERT, Llama and Hugging Face checkpoints use: a head's
dimensions are split in halves, and dimension i of the first half turns with dimension i of the second at frequency
`theta ** (-2i / head_dim)`. Angles are computed in float32 from integer positions, whatever the compute dtype.
"""

import jax
import jax.numpy as jnp


def rotate(x: jax.Array, positions: jax.Array, theta) -> jax.Array:
  """x [batch, seq, heads, head_dim] turned by `positions` [batch, seq] (or [1, seq]; in packed rows they restart
  at each instance) at base `theta` (a number or a traced scalar); returns x's dtype."""
  half = x.shape[-1] // 2
  exponents = jnp.arange(half, dtype=jnp.float32) * 2 / (2 * half)
  inverse_frequency = 1.0 / jnp.asarray(theta, jnp.float32) ** exponents
  angles = positions.astype(jnp.float32)[..., None] * inverse_frequency  # [batch, seq, half]
  cos = jnp.cos(angles)[:, :, None, :].astype(x.dtype)
  sin = jnp.sin(angles)[:, :, None, :].astype(x.dtype)
  first, second = x[..., :half], x[..., half:]
  return jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
