"""Rematerialisation policies by name (`model.remat`): what each layer's forward pass keeps for the backward pass,
and what the backward pass computes again. As MaxText offers them, for one layer (model/stack.py applies the policy
to every layer, scanned or unrolled, so that both layouts keep the same values; a scan still peaks higher: its
backward loop works on copies of a layer's residuals above every layer's stacks, and accumulates whole gradient
stacks, the kernels' in the compute dtype (model/stack.py): docs/tpu.md, "Where the memory goes"):

  none           every matmul output, the attention's context (splash: its output and log-sum-exp), every dropout
                 mask (packed eight to a byte, model/layers.py): only element-wise work (softmax, norms, GELU, unpacking
                 and applying a mask) is computed again, as XLA itself does in an unrolled program. No matmul, no
                 kernel, no random draw.
  save_dots      every matmul output and the context; dropout masks are drawn again (the same bits) from their keys.
  save_dense     the dense layers' outputs (q, k, v, the attention output, the feed-forward's); the attention's
                 [batch, heads, seq, seq] matmuls and softmax are computed again (MaxText's "minimal").
  save_qkv       the query, key and value projections only (MaxText's "save_qkv_proj").
  offload_dense  what `save_dense` keeps, in the host's memory instead of HBM (TPU; MaxText's "minimal_offloaded").
                 XLA's compile-only analysis counts it apart (`host_temp_size_in_bytes`): BERT-Base at 512 tokens, 16
                 rows a v5e chip, peak 2.50 GiB of HBM against save_dense's 3.65, and 1.27 GiB in host memory, sent
                 there and back each step. What those transfers cost in time, only a TPU shows (docs/tpu.md).
  full           nothing but the layer's input: its whole forward pass is computed again.

Every policy computes the same values as no rematerialisation at all (the same operations on the same inputs); the
tests check the gradients agree. From keeping most to keeping least HBM: none, save_dots, save_dense, save_qkv, full
(`offload_dense` keeps activations in host memory instead, at the cost of host transfers).

The names the policies save by are tagged where the model computes them (`checkpoint_name`): NAMES.
"""

import jax
from jax.ad_checkpoint import checkpoint_name

_policies = jax.checkpoint_policies

# Values tagged by name in the model, for the policies that save by name.
QUERY, KEY, VALUE = "query_proj", "key_proj", "value_proj"
# The splash kernel's residuals (its output and log-sum-exp), named by the kernel itself (`residual_checkpoint_name`,
# model/attention.py): a kernel's output is not a matmul, so a dots policy alone would run the kernel again in the
# backward pass. On the XLA path the context is a matmul output, kept by the dots policies. cuDNN's residuals have
# no name: under any policy but full-layer recompute its forward kernel runs again.
CONTEXT = "context"
DROPOUT_MASK = "dropout_mask"
NAMES = (QUERY, KEY, VALUE, CONTEXT, DROPOUT_MASK)

# In order of the recomputation they cost, the least first (the planner's order, `dry_run.plan_remat`).
POLICY_NAMES = ("none", "save_dots", "save_dense", "offload_dense", "save_qkv", "full")


def policy(name: str):
  """The `jax.checkpoint` policy of `model.remat=name` (None: save nothing, "full")."""
  if name == "none":
    return _policies.save_from_both_policies(
      _policies.checkpoint_dots, _policies.save_only_these_names(CONTEXT, DROPOUT_MASK)
    )
  if name == "save_dots":
    return _policies.save_from_both_policies(_policies.checkpoint_dots, _policies.save_only_these_names(CONTEXT))
  if name == "save_dense":
    return _policies.checkpoint_dots_with_no_batch_dims
  if name == "save_qkv":
    return _policies.save_only_these_names(QUERY, KEY, VALUE)
  if name == "offload_dense":
    return _policies.offload_dot_with_no_batch_dims(offload_src="device", offload_dst="pinned_host")
  if name == "full":
    return None
  raise ValueError(f"model.remat={name!r} is not supported; expected one of {POLICY_NAMES}.")


def tag(value: jax.Array, name: str) -> jax.Array:
  """`value`, named `name` for the policies that save by name."""
  return checkpoint_name(value, name)


def tag_heads(value: jax.Array, name: str) -> jax.Array:
  """`value` [..., heads, head_dim], named `name` in its [..., heads * head_dim] form. XLA:TPU tiles the two minor
  dimensions of an array in HBM by (8, 128): a saved query laid out as splash's kernel reads it (head_dim minor, 64)
  takes twice its bytes, where the merged form is lane-dense (docs/tpu.md, "Where the memory goes")."""
  *lead, heads, head_dim = value.shape
  return checkpoint_name(value.reshape(*lead, heads * head_dim), name).reshape(value.shape)
