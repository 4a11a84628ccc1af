"""The encoder's stack of layers: the composition's layer part, its feed-forward and each layer's attention span
(model/parts.py), rematerialisation, the two parameter layouts and the sharing of parameters across layers.

`make_stack(config, initializing)` builds, inside a module's `setup`, the optional projection of the embeddings to
the hidden width (`embeddings_project`, when `config.embedding_width` differs from `hidden_size`: ALBERT, ELECTRA)
and the layers; the parameters land directly in the calling module's scope:

  layer_sharing  unrolled                                      scanned (`scan_layers`)
  "none"         `layer_{i}/...`                                `layers/...`, stacked on a leading layer axis
  "all"          `shared_layer/...`, called num_layers times    `shared_layer/...`, broadcast to every step
  "attention"    `shared_{name}` for each sub-module of the layer part's "attention" group (post_norm:
                 `shared_attention`, `shared_attention_layer_norm`), the rest in `layer_{i}/`    refused (BertConfig)
  "ffn"          the same for its "ffn" group (post_norm: `shared_intermediate`, `shared_output`,
                 `shared_output_layer_norm`)                    refused (BertConfig)

Where the layer part's `stacking` (given the architecture's arguments) makes the first layer differ (ModernBERT's has
no norm before its attention), a scanned stack keeps that layer unrolled as `layer_0/...` and `layers/...` stacks the
others (`num_layers - 1` on the leading axis); where it asks for one, `final_norm` follows the last layer.

A scanned stack whose layers' spans differ (ModernBERT's local and global layers) holds them in a `SpanTable` and
hands each layer its index as a scanned input. `layer_sharing="all"` runs one layer module for every layer: the
attention pattern must give them the same span. Shared parameters are never named `layers`: LAMB (train/optim.py)
takes a trust ratio per slice of that key's leading axis.
"""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.model import parts, remat
from bert_jax.model.attention_patterns import SpanTable
from bert_jax.model.bert_config import BertConfig
from bert_jax.model.layers import HIDDEN, constrain, dense, layer_norm

Array = jax.Array


@functools.cache
def _carry_form(layer_cls: type[nn.Module]) -> type[nn.Module]:
  """`layer_cls` in `nn.scan`'s (carry, inputs) -> (carry, outputs) form."""

  def __call__(
    self, x: Array, input_mask: Array, deterministic: bool, head_mask=None, positions=None, choice=None
  ) -> tuple[Array, None]:
    return layer_cls.__call__(self, x, input_mask, deterministic, head_mask, positions, choice), None

  return type(f"Scanned{layer_cls.__name__}", (layer_cls,), {"__call__": __call__})


def _layer_class(config: BertConfig, layer_cls: type[nn.Module]) -> type[nn.Module]:
  """`layer_cls` under `config.remat`'s policy (model/remat.py), "none" included: what the backward pass keeps is
  the policy's choice, not what tracing happens to leave (a scan would otherwise stack every intermediate of every
  layer, float32 copies and all, for the backward pass)."""
  # `deterministic` (argument 3, counting self) switches dropout: static, not traced.
  return nn.remat(layer_cls, policy=remat.policy(config.remat), prevent_cse=not config.scan_layers, static_argnums=(3,))


def _one_span(config: BertConfig, spans: tuple, why: str):
  """The span every layer has, for one layer module run `num_layers` times; raises ValueError if they differ."""
  if len(set(spans)) != 1:
    raise ValueError(
      f"model.model_type={config.model_type!r} attends with pattern {config.architecture.attention_pattern!r}, whose "
      f"layers differ, and {why} runs one layer module for all of them: set model.scan_layers=False and "
      "model.layer_sharing='none'."
    )
  return spans[0]


def _span_for(spans: tuple):
  """What one module running the layers of `spans` holds: their span when they agree, else a `SpanTable` (each
  layer then takes its index into it as a traced number)."""
  return spans[0] if len(set(spans)) == 1 else SpanTable.of(spans)


# A scanned layer's inputs: input_mask and deterministic broadcast, each layer's head mask, positions broadcast,
# each layer's span choice.
_SCAN_IN_AXES = (nn.broadcast, nn.broadcast, 0, nn.broadcast, 0)


def _kernels_in_compute_dtype(config: BertConfig, stack_cls: type[nn.Module]) -> type[nn.Module]:
  """`stack_cls`, a scan over stacked layers, reading its stacked matmul kernels already cast to the compute dtype.

  Each dense layer casts its kernel to `config.compute_dtype` itself (flax's `promote_dtype`): the same values
  either way. Cast outside the scan, the backward loop accumulates the kernels' gradients as a compute-dtype stack,
  converted to float32 after the loop, once the activations are gone (an unrolled program keeps them so too); cast
  inside, XLA hoists the cast out of the forward loop anyway, but the backward loop accumulates float32 stacks,
  live through the whole backward pass: 2 more bytes a kernel element at the peak (docs/tpu.md, "Where the memory
  goes"). An unrolled stack is left as it is (cast outside, its peak rose). Norm scales and biases stay float32."""
  dtype = config.compute_dtype
  if dtype == jnp.float32:
    return stack_cls

  def cast(params):
    return jax.tree_util.tree_map_with_path(
      lambda path, x: x.astype(dtype) if path[-1] == jax.tree_util.DictKey("kernel") else x, params
    )

  return nn.map_variables(stack_cls, "params", trans_in_fn=cast)


def _scanned_layers(
  config: BertConfig, layer_cls: type[nn.Module], length: int, initializing: bool, **attributes
) -> nn.Module:
  """`length` layers as one scanned module: parameters stacked on a leading `layers` axis, one dropout key each;
  applied (not initialised), its kernels are read in the compute dtype (`_kernels_in_compute_dtype`)."""
  scanned = nn.scan(
    _layer_class(config, _carry_form(layer_cls)),
    variable_axes={"params": 0, "intermediates": 0},
    split_rngs={"params": True, "dropout": True},
    in_axes=_SCAN_IN_AXES,
    length=length,
    metadata_params={nn.PARTITION_NAME: "layers"},
  )
  if not initializing:  # Initialisation makes float32 parameters; a mapped collection is read-only.
    scanned = _kernels_in_compute_dtype(config, scanned)
  return scanned(config, name="layers", **attributes)


def _scanned_shared_layer(config: BertConfig, layer_cls: type[nn.Module], length: int, **attributes) -> nn.Module:
  """One layer's parameters, broadcast to every step of the scan; one dropout key per step (else every layer
  would drop the same units)."""
  return nn.scan(
    _layer_class(config, _carry_form(layer_cls)),
    variable_broadcast="params",
    variable_axes={"intermediates": 0},
    split_rngs={"params": False, "dropout": True},
    in_axes=_SCAN_IN_AXES,
    length=length,
  )(config, name="shared_layer", **attributes)


def _shared_names(config: BertConfig, found: parts.Parts) -> tuple[str, ...]:
  """The sub-modules that partial `layer_sharing` shares across layers (none for "none" and "all")."""
  if config.layer_sharing in ("none", "all"):
    return ()
  groups = found.layer.sharing_groups(found.feed_forward)
  if config.layer_sharing not in groups:
    raise ValueError(
      f"model.layer_sharing={config.layer_sharing!r}: the layer part {config.architecture.layer!r} of "
      f"model.model_type={config.model_type!r} shares only {tuple(groups)}."
    )
  return groups[config.layer_sharing]


def sublayer_path(config: BertConfig, layer: int, name: str) -> tuple[str, ...]:
  """Where the sub-module `name` (of the layer part's `sublayers`) of layer `layer` lives below the encoder,
  unrolled."""
  if config.layer_sharing == "all":
    return ("shared_layer", name)
  if name in _shared_names(config, parts.resolve(config)):
    return (f"shared_{name}",)
  return (f"layer_{layer}", name)


@dataclasses.dataclass(frozen=True)
class Stack:
  """The embeddings' projection (None when the tables are hidden_size wide), the layers and the final norm (None
  unless the layer part ends the stack with one), as `make_stack` built them in a module's `setup`:
  `stack(stack.project(embedded), input_mask, deterministic, head_mask, positions)` -> [batch, seq, hidden]."""

  projection: nn.Module | None
  layers: tuple[nn.Module, ...]  # Called in order; a shared layer appears num_layers times.
  scanned: bool  # The last of `layers` is one scanned module, in nn.scan's (carry, outputs) form.
  final_norm: nn.Module | None = None
  # Scanned: the layers before the scan (the first layer, where the layer part makes it differently), and each
  # scanned layer's index into its SpanTable (None: they share one span).
  prefix: int = 0
  choices: tuple[int, ...] | None = None

  def project(self, embedded: Array) -> Array:
    """[batch, seq, embedding_width] -> [batch, seq, hidden]."""
    return embedded if self.projection is None else constrain(self.projection(embedded), HIDDEN)

  def __call__(
    self, x: Array, input_mask: Array, deterministic: bool, head_mask: Array | None = None, positions=None
  ) -> Array:
    """head_mask: [layers, heads], each head's output scaled by its value (0: the head is pruned), or None;
    positions: [batch or 1, seq], each token's position in its instance (rotary positions), or None."""
    unrolled = self.layers[:-1] if self.scanned else self.layers
    for i, layer in enumerate(unrolled):
      x = layer(x, input_mask, deterministic, None if head_mask is None else head_mask[i], positions)
    if self.scanned:
      heads = None if head_mask is None else head_mask[self.prefix :]
      choices = None if self.choices is None else jnp.asarray(self.choices, jnp.int32)
      x = self.layers[-1](x, input_mask, deterministic, heads, positions, choices)[0]
    return x if self.final_norm is None else constrain(self.final_norm(x), HIDDEN)


def make_stack(config: BertConfig, initializing: bool) -> Stack:
  """The projection, the layers and the final norm of `config`, created in the calling module's `setup` (their
  parameters are its children; see the module docstring for the names); `initializing`: the calling module's
  `is_initializing()`."""
  found = parts.resolve(config)
  spans = found.attention_pattern(config)
  project = None
  if config.embedding_width != config.hidden_size:
    project = dense(config, config.hidden_size, ("embed_out", "embed"), name="embeddings_project")
  final_norm = layer_norm(config, "final_norm") if found.stacking.final_norm else None
  first = dict(found.stacking.first_layer)  # Layer 0's own attributes, if it differs from the others.
  sharing, count = config.layer_sharing, config.num_layers
  if first and sharing != "none":
    raise ValueError(
      f"model.layer_sharing={sharing!r}: the layer part {config.architecture.layer!r} of "
      f"model.model_type={config.model_type!r} makes its first layer differently from the others, so they cannot "
      "share parameters; set model.layer_sharing='none'."
    )
  layer_cls = _layer_class(config, found.layer)
  if config.scan_layers:  # "none" or "all" (BertConfig refuses partial sharing with scan_layers).
    prefix = 1 if first else 0
    head = tuple(
      layer_cls(config, feed_forward=found.feed_forward, span=spans[i], name=f"layer_{i}", **first)
      for i in range(prefix)
    )
    if sharing == "none":
      span = _span_for(spans[prefix:])
      choices = span.choices if isinstance(span, SpanTable) else None
      scanned = _scanned_layers(
        config, found.layer, count - prefix, initializing, feed_forward=found.feed_forward, span=span
      )
    else:
      span, choices = _one_span(config, spans, "model.layer_sharing='all'"), None
      scanned = _scanned_shared_layer(config, found.layer, count, feed_forward=found.feed_forward, span=span)
    return Stack(project, (*head, scanned), True, final_norm, prefix, choices)
  if sharing == "all":
    span = _one_span(config, spans, "model.layer_sharing='all'")
    shared_layer = layer_cls(config, feed_forward=found.feed_forward, span=span, name="shared_layer")
    return Stack(project, (shared_layer,) * count, False, final_norm)
  sublayers = found.layer.sublayers(found.feed_forward)
  shared = {name: sublayers[name](config, f"shared_{name}") for name in _shared_names(config, found)}
  layers = tuple(
    layer_cls(
      config,
      feed_forward=found.feed_forward,
      span=spans[i],
      shared=shared or None,
      name=f"layer_{i}",
      **(first if i == 0 else {}),
    )
    for i in range(count)
  )
  return Stack(project, layers, False, final_norm)
