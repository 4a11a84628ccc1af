"""The BERT encoder and its pretraining heads, as published (Devlin et al. 2018), in Flax linen.

Post-LayerNorm transformer layers, erf-GELU, truncated-normal(0.02) initialisation, a tanh pooler on [CLS],
a masked-LM head whose decoder is tied to the word embeddings and that runs only at the gathered
`masked_lm_positions`, and a 2-way next-sentence head. Every parameter carries logical axis names
(`vocab`, `embed`, `mlp`, `heads`, `kv`, and `layers` for scanned layers) and the main activations carry
`act_*` names; the config's logical axis rules map both onto the device mesh (constraints are no-ops outside
`activation_rules`).

`BertConfig.scan_layers` runs the layers as one `nn.scan` over stacked parameters (`bert/layers/...`, leading
axis `num_layers`) instead of `bert/layer_{i}/...`; `model/param_layout.py` converts between the two.
`BertConfig.remat` rematerialises each layer in the backward pass.

Parameters are float32; activations run in `config.dtype`; the attention softmax and the logits are float32.
"""

import contextlib
import contextvars
import functools
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.model import attention
from bert_jax.model.bert_config import BertConfig

Array = jax.Array


def _kernel_init(config: BertConfig, axes: tuple):
  return nn.with_logical_partitioning(nn.initializers.truncated_normal(config.initializer_range), axes)


def _zeros(axes: tuple):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


def dense(config: BertConfig, features, kernel_axes: tuple, axis=-1, name=None) -> nn.DenseGeneral:
  """A dense layer with BERT's init; the bias is named by the output axes of the kernel."""
  num_out = 1 if isinstance(features, int) else len(features)
  return nn.DenseGeneral(
    features=features,
    axis=axis,
    dtype=config.compute_dtype,
    param_dtype=jnp.float32,
    kernel_init=_kernel_init(config, kernel_axes),
    bias_init=_zeros(kernel_axes[-num_out:]),
    name=name,
  )


def _layer_norm(config: BertConfig, name: str) -> nn.LayerNorm:
  return nn.LayerNorm(
    epsilon=config.layer_norm_eps,
    dtype=config.compute_dtype,
    param_dtype=jnp.float32,
    scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)),
    bias_init=_zeros(("embed",)),
    name=name,
  )


gelu = functools.partial(jax.nn.gelu, approximate=False)  # BERT's GELU is the exact (erf) form.

_HIDDEN = ("act_batch", "act_length", "act_embed")
_HEADS = ("act_batch", "act_length", "act_heads", "act_kv")


_ACTIVATION_RULES: contextvars.ContextVar[tuple] = contextvars.ContextVar("activation_rules", default=())


@contextlib.contextmanager
def activation_rules(rules: Sequence[tuple]):
  """While tracing inside this context (and a mesh context), activations are constrained by `rules`.

  Not flax's `nn.logical_axis_rules`: under it, DenseGeneral's parameter shape check applies the kernel's
  logical names to its flattened 2-D init and fails.
  """
  token = _ACTIVATION_RULES.set(tuple(tuple(rule) for rule in rules))
  try:
    yield
  finally:
    _ACTIVATION_RULES.reset(token)


def _constrain(x: Array, logical_axes: tuple) -> Array:
  rules = _ACTIVATION_RULES.get()
  return nn.with_logical_constraint(x, logical_axes, rules=rules) if rules else x


class Embeddings(nn.Module):
  """Word + position + token-type embeddings, then LayerNorm and dropout."""

  config: BertConfig

  def setup(self):
    config = self.config
    embed = functools.partial(
      nn.Embed, features=config.hidden_size, dtype=config.compute_dtype, param_dtype=jnp.float32
    )
    self.word_embeddings = embed(config.vocab_size, embedding_init=_kernel_init(config, ("vocab", "embed")))
    self.position_embeddings = embed(
      config.max_position_embeddings, embedding_init=_kernel_init(config, (None, "embed"))
    )
    self.token_type_embeddings = embed(config.type_vocab_size, embedding_init=_kernel_init(config, (None, "embed")))
    self.layer_norm = _layer_norm(config, "layer_norm")
    self.dropout = nn.Dropout(config.hidden_dropout_prob)

  def _lookup(self, embed: nn.Embed, table_axes: tuple, ids: Array) -> Array:
    """[batch, seq] ids -> [batch, seq, hidden] rows of `embed`, looked up in the table gathered along hidden (as FSDP
    gathers every parameter it uses; the vocabulary stays split as `table_axes` say), so that they come out split
    by batch like the ids: a lookup in the table's hidden-split shards costs an all-to-all each way."""
    table = _constrain(embed.embedding, table_axes)
    if embed.num_embeddings == 1:  # As nn.Embed: a one-row table answers every id.
      rows = jnp.broadcast_to(table[0], (*ids.shape, table.shape[-1]))
    else:
      rows = jnp.take(table, ids, axis=0)
    rows = rows.astype(self.config.compute_dtype)
    return rows if ids.shape[0] == 1 else _constrain(rows, _HIDDEN)  # [1, seq]: positions shared by every row.

  def __call__(self, input_ids: Array, segment_ids: Array, deterministic: bool, position_ids=None) -> Array:
    # input_ids, segment_ids, position_ids: [batch, seq] -> [batch, seq, hidden]; positions 0, 1, ... by default.
    positions = jnp.arange(input_ids.shape[-1])[None] if position_ids is None else position_ids
    x = (
      self._lookup(self.word_embeddings, ("vocab", None), input_ids)
      + self._lookup(self.position_embeddings, (None, None), positions)
      + self._lookup(self.token_type_embeddings, (None, None), segment_ids)
    )
    return _constrain(self.dropout(self.layer_norm(x), deterministic=deterministic), _HIDDEN)


class SelfAttention(nn.Module):
  """Multi-head self-attention within each token's instance (see `attention.attention_mask`), by the kernel
  `config.attention` picks for the platform (see model/attention.py)."""

  config: BertConfig

  @nn.compact
  def __call__(self, x: Array, input_mask: Array, deterministic: bool) -> Array:
    # x: [batch, seq, hidden]; input_mask: [batch, seq] instance numbers (0: padding).
    config = self.config
    heads = (config.num_heads, config.head_dim)
    query, key, value = (
      _constrain(dense(config, heads, ("embed", "heads", "kv"), name=name)(x), _HEADS)
      for name in ("query", "key", "value")
    )
    query = query / jnp.sqrt(config.head_dim).astype(query.dtype)
    kind = attention.resolve(
      config.attention,
      attention.current_platform(),
      attention_dropout_prob=config.attention_dropout_prob,
      dtype=config.dtype,
    )
    if kind == "splash":
      context = attention.splash_attention(query, key, value, input_mask, rules=_ACTIVATION_RULES.get())
    elif kind == "cudnn":
      context = attention.dot_product_attention(query, key, value, input_mask, implementation="cudnn")
    else:
      scores = jnp.einsum("bqhd,bkhd->bhqk", query, key).astype(jnp.float32)  # [batch, heads, q, k]
      # `where`, not an additive -1e4: a padded key gets exactly zero weight, in any dtype.
      scores = jnp.where(attention.attention_mask(input_mask), scores, jnp.finfo(jnp.float32).min)
      probs = jax.nn.softmax(scores, axis=-1)
      self.sow("intermediates", "attention_probs", probs)  # Kept only when `intermediates` is mutable.
      probs = probs.astype(config.compute_dtype)
      probs = nn.Dropout(config.attention_dropout_prob)(probs, deterministic=deterministic)
      context = jnp.einsum("bhqk,bkhd->bqhd", probs, value)
    context = _constrain(context, _HEADS)  # [batch, seq, heads, head_dim]
    return dense(config, config.hidden_size, ("heads", "kv", "embed"), axis=(-2, -1), name="output")(context)


class TransformerLayer(nn.Module):
  """One post-LN encoder layer: attention, add & norm, feed-forward, add & norm."""

  config: BertConfig

  @nn.compact
  def __call__(self, x: Array, input_mask: Array, deterministic: bool) -> Array:
    config = self.config
    dropout = nn.Dropout(config.hidden_dropout_prob)
    attended = SelfAttention(config, name="attention")(x, input_mask, deterministic)
    x = _layer_norm(config, "attention_layer_norm")(x + dropout(attended, deterministic=deterministic))
    hidden = gelu(dense(config, config.intermediate_size, ("embed", "mlp"), name="intermediate")(x))
    hidden = _constrain(hidden, ("act_batch", "act_length", "act_mlp"))
    out = dense(config, config.hidden_size, ("mlp", "embed"), name="output")(hidden)
    x = _constrain(_layer_norm(config, "output_layer_norm")(x + dropout(out, deterministic=deterministic)), _HIDDEN)
    self.sow("intermediates", "hidden_states", x)
    return x


class _ScannedLayer(TransformerLayer):
  """A TransformerLayer in `nn.scan`'s (carry, inputs) -> (carry, outputs) form."""

  def __call__(self, x: Array, input_mask: Array, deterministic: bool) -> tuple[Array, None]:
    return super().__call__(x, input_mask, deterministic), None


_REMAT_POLICIES = {"full": None, "save_dots": jax.checkpoint_policies.checkpoint_dots}


def _layer_class(config: BertConfig, layer_cls: type[nn.Module]) -> type[nn.Module]:
  if config.remat == "none":
    return layer_cls
  # `deterministic` (argument 3, counting self) switches dropout: static, not traced.
  return nn.remat(
    layer_cls, policy=_REMAT_POLICIES[config.remat], prevent_cse=not config.scan_layers, static_argnums=(3,)
  )


def _scanned_layers(config: BertConfig) -> nn.Module:
  """All layers as one scanned module: parameters stacked on a leading `layers` axis, one dropout key each."""
  return nn.scan(
    _layer_class(config, _ScannedLayer),
    variable_axes={"params": 0, "intermediates": 0},
    split_rngs={"params": True, "dropout": True},
    in_axes=(nn.broadcast, nn.broadcast),
    length=config.num_layers,
    metadata_params={nn.PARTITION_NAME: "layers"},
  )(config, name="layers")


class BertModel(nn.Module):
  """The encoder: returns the sequence output [batch, seq, hidden] and the pooled [CLS] output [batch, hidden].

  Packed rows (several instances in one row): `input_mask` holds each token's instance number (see
  `attention.attention_mask`), `position_ids` [batch, seq] restart at each instance, and `cls_positions` [batch,
  instances] name each instance's [CLS], whose pooled outputs are [batch, instances, hidden]. Without them a row is
  one instance: positions 0, 1, ... and its [CLS] at 0.

  With `mutable=["intermediates"]` it also collects every layer's hidden states and attention probabilities
  (see `encoder_intermediates`); otherwise they cost nothing.
  """

  config: BertConfig

  def setup(self):
    config = self.config
    self.embeddings = Embeddings(config)
    if config.scan_layers:
      self.layers = _scanned_layers(config)
    else:
      layer_cls = _layer_class(config, TransformerLayer)
      self.layers = [layer_cls(config, name=f"layer_{i}") for i in range(config.num_layers)]
    self.pooler = dense(config, config.hidden_size, ("embed", "embed_out"), name="pooler")

  def __call__(
    self,
    input_ids: Array,
    input_mask: Array,
    segment_ids: Array,
    deterministic: bool = True,
    position_ids: Array | None = None,
    cls_positions: Array | None = None,
  ) -> tuple[Array, Array]:
    x = self.embeddings(input_ids, segment_ids, deterministic, position_ids)
    self.sow("intermediates", "embedding_output", x)
    if self.config.scan_layers:
      x, _ = self.layers(x, input_mask, deterministic)
    else:
      for layer in self.layers:
        x = layer(x, input_mask, deterministic)
    # The gathered rows stay split by batch as the sequence was: without the constraint, SPMD partitioning may
    # split them by hidden (as the next kernel is) and pay an all-to-all back in the backward pass.
    if cls_positions is None:
      cls = _constrain(x[:, 0], ("act_batch", "act_embed"))
    else:
      cls = _constrain(gather_positions(x, cls_positions), _HIDDEN)
    pooled = _constrain(jnp.tanh(self.pooler(cls)), ("act_batch",) + (None,) * (cls.ndim - 2) + ("act_embed",))
    return x, pooled

  def dummy_inputs(self) -> tuple[Array, ...]:
    ids = jnp.zeros((1, 1), jnp.int32)
    return ids, ids, ids


def encoder_intermediates(intermediates: dict, config: BertConfig) -> dict[str, Array]:
  """What `BertModel.apply(..., mutable=["intermediates"])` collected, in either layer layout, as
  `hidden_states` [num_layers + 1, batch, seq, hidden] (the embeddings' output, then each layer's) and
  `attention_probs` [num_layers, batch, heads, q, k] (float32; only the "xla" attention path computes them, so a
  fused kernel's model returns none). Nothing is collected unless asked for."""
  if config.scan_layers:
    layers = intermediates["layers"]
    hidden = jnp.concatenate([intermediates["embedding_output"][0][None], layers["hidden_states"][0]])
    probs = layers["attention"]["attention_probs"][0] if "attention" in layers else None
  else:
    layers = [intermediates[f"layer_{i}"] for i in range(config.num_layers)]
    hidden = jnp.stack([intermediates["embedding_output"][0]] + [layer["hidden_states"][0] for layer in layers])
    sown = all("attention" in layer for layer in layers)
    probs = jnp.stack([layer["attention"]["attention_probs"][0] for layer in layers]) if sown else None
  return dict(hidden_states=hidden) if probs is None else dict(hidden_states=hidden, attention_probs=probs)


def gather_positions(sequence: Array, positions: Array) -> Array:
  """[batch, seq, hidden], [batch, num_positions] -> [batch, num_positions, hidden]."""
  return jnp.take_along_axis(sequence, positions[:, :, None], axis=1)


class BertForPretraining(nn.Module):
  """BERT with the masked-LM and next-sentence heads.

  Returns a dict: `mlm_logits` [batch, max_predictions, vocab] (float32) at `masked_lm_positions` only,
  `nsp_logits` [batch, 2] (float32; [batch, instances, 2] for packed rows, see `BertModel`), and the encoder's
  `sequence_output` and `pooled_output`.
  """

  config: BertConfig

  def setup(self):
    config = self.config
    self.bert = BertModel(config)
    self.mlm_transform = dense(config, config.hidden_size, ("embed", "embed_out"), name="mlm_transform")
    self.mlm_layer_norm = _layer_norm(config, "mlm_layer_norm")
    self.mlm_output_bias = self.param("mlm_output_bias", _zeros(("vocab",)), (config.vocab_size,), jnp.float32)
    self.nsp = dense(config, 2, ("embed", None), name="nsp")

  def __call__(
    self,
    input_ids: Array,
    input_mask: Array,
    segment_ids: Array,
    masked_lm_positions: Array,
    deterministic: bool = True,
    position_ids: Array | None = None,
    cls_positions: Array | None = None,
  ) -> dict[str, Array]:
    sequence_output, pooled_output = self.bert(
      input_ids, input_mask, segment_ids, deterministic, position_ids, cls_positions
    )
    # Only the masked positions reach the vocabulary-sized decoder: ~6x fewer FLOPs there at seq 128.
    hidden = _constrain(gather_positions(sequence_output, masked_lm_positions), _HIDDEN)
    hidden = self.mlm_layer_norm(gelu(self.mlm_transform(hidden)))
    mlm_logits = self.bert.embeddings.word_embeddings.attend(hidden).astype(jnp.float32) + self.mlm_output_bias
    nsp_logits = self.nsp(pooled_output).astype(jnp.float32)
    return dict(
      mlm_logits=mlm_logits, nsp_logits=nsp_logits, sequence_output=sequence_output, pooled_output=pooled_output
    )

  def dummy_inputs(self) -> tuple[Array, ...]:
    """One token and one masked position: the shapes `init` needs, nothing more."""
    ids = jnp.zeros((1, 1), jnp.int32)
    return ids, ids, ids, ids


def init_params(model: nn.Module, key: Array) -> dict:
  """`model`'s parameters, boxed with their logical axis names. Parameter shapes never depend on a batch: every
  model initialises on its shape-only `dummy_inputs()`."""
  return model.init(key, *model.dummy_inputs())["params"]


def abstract_params(config: BertConfig, model: nn.Module | None = None) -> dict:
  """The parameter shapes, dtypes and logical axis names of `model` (default `BertForPretraining(config)`), with
  nothing allocated."""
  model = BertForPretraining(config) if model is None else model
  return jax.eval_shape(lambda: init_params(model, jax.random.key(0)))
