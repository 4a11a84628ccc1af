"""Attention kernels behind `model.attention`: XLA's einsum and softmax (the reference), JAX's Pallas splash-attention
kernel on TPUs, and cuDNN's fused attention on GPUs.

  "xla"     scores [batch, heads, q, k] in HBM, masked softmax in float32, dropout on the probabilities (BERT).
  "splash"  TPU (Pallas; in interpret mode elsewhere, for tests). A row's `input_mask` values are its segment ids:
            a token attends only to tokens of its own instance (packed rows) and no real token to padding. No
            [batch, heads, q, k] mask or score tensor exists in HBM. Sequences are padded to a multiple of 128
            inside the call (the kernel's block).
  "cudnn"   GPU: `jax.nn.dot_product_attention(implementation="cudnn")` with the boolean mask; bfloat16 only.
  "auto"    splash on TPU, cudnn on GPU in bfloat16, xla otherwise, and xla wherever attention dropout is on.

The fused kernels have no dropout on attention probabilities. BertConfig refuses "splash" and "cudnn" with
`attention_dropout_prob` > 0 rather than drop what the config asks for; MosaicBERT and ModernBERT train with
attention dropout 0, which is the setting that takes the kernel ("auto" does so only then).

Which keys a query may see within its instance is the layer's span (model/attention_patterns.py): a boolean mask for
"xla" and "cudnn", a splash mask for "splash"; BERT's (global attention) by default.

A padding query attends differently (to padding under splash, to every real token under xla); its output is never
read, so outputs at real tokens, losses and gradients agree.
"""

import contextlib
import contextvars
import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from bert_jax.model import remat

SPLASH_BLOCK = 128  # The splash kernel's block along both sequence axes (the TPU's 128 lanes).

_PLATFORM: contextvars.ContextVar[str | None] = contextvars.ContextVar("attention_platform", default=None)


@contextlib.contextmanager
def target_platform(platform: str):
  """While tracing inside, kernels are chosen (and splash compiled, not interpreted) for `platform` ("tpu", "gpu",
  "cpu"): the platform of the mesh a step is compiled for, which may differ from this machine's (a TPU topology
  compiled on a CPU host)."""
  token = _PLATFORM.set(platform)
  try:
    yield
  finally:
    _PLATFORM.reset(token)


def current_platform() -> str:
  return _PLATFORM.get() or jax.default_backend()


def choose_kernel(kind: str, platform: str, *, attention_dropout_prob: float, dtype: str) -> str:
  """The kernel `kind` ("auto" included) runs on `platform` for a model with these settings."""
  if kind != "auto":
    return kind
  if attention_dropout_prob > 0:
    return "xla"
  if platform == "tpu":
    return "splash"
  if platform == "gpu" and dtype == "bfloat16":
    return "cudnn"
  return "xla"


def attention_mask(input_mask: jax.Array) -> jax.Array:
  """Which keys each query attends to: [batch, seq] -> [batch, 1, q, k] bool.

  `input_mask` is 0 for padding and otherwise the token's instance number: 1 everywhere in an unpacked row, 1..k in
  a row that packs k instances. A token attends to the real tokens of its own instance (block-diagonal); a padding
  query to every real token, as under BERT's key-only mask (its output is never read).
  """
  queries, keys = input_mask[:, :, None], input_mask[:, None, :]
  return (((queries == keys) | (queries == 0)) & (keys > 0))[:, None]


def full_splash_mask(seq: int):
  """Splash's mask of global attention over `seq` tokens: every query may see every key (the segment ids then keep
  each token to its own instance)."""
  from jax.experimental.pallas.ops.tpu import splash_attention as splash

  return splash.FullMask((seq, seq))


def local_splash_mask(seq: int, half_window: int):
  """Splash's mask of local attention over `seq` tokens: keys within `half_window` tokens on either side of the
  query (splash skips the blocks outside the band, so a local layer's cost grows linearly with `seq`)."""
  from jax.experimental.pallas.ops.tpu import splash_attention as splash

  return splash.LocalMask((seq, seq), window_size=(half_window, half_window), offset=0)


def _splash_per_shard(query, key, value, segment_ids, choice, *, splash_masks, interpret: bool):
  # query, key, value: [batch, heads, seq, head_dim]; segment_ids [batch, seq]; the shard's own batch and heads.
  # `choice` picks one of `splash_masks` (a traced index, or None when there is one).
  from jax.experimental.pallas.ops.tpu import splash_attention as splash

  heads, seq = query.shape[1], query.shape[2]

  def attend(splash_mask, q, k, v, ids):
    mask = splash.MultiHeadMask([splash_mask(seq)] * heads)
    # Its residuals named for the remat policies that keep them (model/remat.py), so the backward pass does not run
    # the forward kernel again.
    kernel = splash.make_splash_mha(
      mask, head_shards=1, q_seq_shards=1, interpret=interpret, residual_checkpoint_name=remat.CONTEXT
    )
    one_row = lambda q, k, v, ids: kernel(q, k, v, segment_ids=splash.SegmentIds(q=ids, kv=ids))
    return jax.vmap(one_row)(q, k, v, ids)

  branches = [functools.partial(attend, splash_mask) for splash_mask in splash_masks]
  if len(branches) == 1:
    return branches[0](query, key, value, segment_ids)
  return jax.lax.switch(choice, branches, query, key, value, segment_ids)


def splash_attention(
  query, key, value, input_mask, *, rules=(), splash_mask=full_splash_mask, choice=None, splash_masks=None
) -> jax.Array:
  """[batch, seq, heads, head_dim] (query already scaled) x3, input_mask [batch, seq] -> context [batch, seq, heads,
  head_dim]. `splash_mask(seq)` is the kernel's mask of which keys each query may see, within the instance the
  segment ids give (an attention pattern's, model/attention_patterns.py); or `splash_masks`, several, of which the
  traced index `choice` picks one (a kernel compiled for each, `lax.switch` between them: a scan over layers whose
  spans differ). Under a mesh, runs per shard (shard_map) with batch and heads split as `rules` map `act_batch` and
  `act_heads`."""
  seq = query.shape[1]
  padded = -(-seq // SPLASH_BLOCK) * SPLASH_BLOCK
  to_kernel = lambda x: jnp.pad(x, ((0, 0), (0, padded - seq), (0, 0), (0, 0))).transpose(0, 2, 1, 3)
  # Positions added to reach the block get their own segment (-1): they attend to themselves only.
  segment_ids = jnp.pad(input_mask, ((0, 0), (0, padded - seq)), constant_values=-1)
  platform = current_platform()
  masks = tuple(splash_masks) if splash_masks is not None else (splash_mask,)
  choice = jnp.zeros((), jnp.int32) if choice is None else jnp.asarray(choice, jnp.int32)
  run = functools.partial(_splash_per_shard, splash_masks=masks, interpret=platform != "tpu")
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty:
    from flax import linen as nn

    batch_axes, heads_axes = nn.logical_to_mesh_axes(("act_batch", "act_heads"), rules)
    qkv_spec, ids_spec = PartitionSpec(batch_axes, heads_axes, None, None), PartitionSpec(batch_axes, None)
    specs = (qkv_spec,) * 3 + (ids_spec, PartitionSpec())
    run = jax.shard_map(run, in_specs=specs, out_specs=qkv_spec, check_vma=False)
  context = run(to_kernel(query), to_kernel(key), to_kernel(value), segment_ids, choice)
  return context.transpose(0, 2, 1, 3)[:, :seq]


def dot_product_attention(query, key, value, input_mask, *, implementation: str, mask=None) -> jax.Array:
  """`jax.nn.dot_product_attention` ("cudnn": cuDNN's fused kernel, bfloat16) with `mask` [batch, 1, q, k] (default
  BERT's, `attention_mask(input_mask)`); same shapes as `splash_attention`. scale=1: the query arrives scaled by
  1/sqrt(head_dim), as in BERT."""
  mask = attention_mask(input_mask) if mask is None else mask
  return jax.nn.dot_product_attention(query, key, value, mask=mask, scale=1.0, implementation=implementation)
