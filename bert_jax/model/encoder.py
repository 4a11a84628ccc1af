"""The BERT encoder and its pretraining heads, as published (Devlin et al. 2018), in Flax linen; with the
architecture fields of `BertConfig`, also RoBERTa's and ALBERT's.

Post-LayerNorm transformer layers (model/layers.py), erf-GELU, truncated-normal(0.02) initialisation, a tanh
pooler on [CLS], a masked-LM head whose decoder is tied to the word embeddings and that runs only at the gathered
`masked_lm_positions`, and a 2-way sentence head (`nsp`: next sentence, or ALBERT's sentence order). Every
parameter carries logical axis names (`vocab`, `embed`, `mlp`, `heads`, `kv`, and `layers` for scanned layers)
and the main activations carry `act_*` names; the config's logical axis rules map both onto the device mesh
(constraints are no-ops outside `activation_rules`).

`BertConfig.scan_layers` runs the layers as one `nn.scan` over stacked parameters (`bert/layers/...`, leading
axis `num_layers`) instead of `bert/layer_{i}/...`; `model/param_layout.py` converts between the two.
`BertConfig.remat` rematerialises each layer in the backward pass. The families differ in `embedding_size`
(ALBERT's factorised embeddings: `embedding_size`-wide tables, `bert/embeddings_project` to the hidden width, and
an MLM transform back to `embedding_size`), `position_offset` (RoBERTa's positions start at 2), `hidden_act` and
`layer_sharing` (see model/layers.py).

Parameters are float32; activations run in `config.dtype`; the attention softmax and the logits are float32."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.model import layers
from bert_jax.model.bert_config import BertConfig
from bert_jax.model.layers import HIDDEN, constrain, dense, kernel_init, layer_norm, zeros

Array = jax.Array


class Embeddings(nn.Module):
  """Word + position + token-type embeddings, then LayerNorm and dropout."""

  config: BertConfig

  def setup(self):
    config = self.config
    embed = functools.partial(
      nn.Embed, features=config.embedding_width, dtype=config.compute_dtype, param_dtype=jnp.float32
    )
    self.word_embeddings = embed(config.vocab_size, embedding_init=kernel_init(config, ("vocab", "embed")))
    self.position_embeddings = embed(
      config.max_position_embeddings, embedding_init=kernel_init(config, (None, "embed"))
    )
    self.token_type_embeddings = embed(config.type_vocab_size, embedding_init=kernel_init(config, (None, "embed")))
    self.layer_norm = layer_norm(config, "layer_norm")
    self.dropout = nn.Dropout(config.hidden_dropout_prob)

  def _lookup(self, embed: nn.Embed, table_axes: tuple, ids: Array) -> Array:
    """[batch, seq] ids -> [batch, seq, hidden] rows of `embed`, looked up in the table gathered along hidden (as FSDP
    gathers every parameter it uses; the vocabulary stays split as `table_axes` say), so that they come out split
    by batch like the ids: a lookup in the table's hidden-split shards costs an all-to-all each way."""
    table = constrain(embed.embedding, table_axes)
    if embed.num_embeddings == 1:  # As nn.Embed: a one-row table answers every id.
      rows = jnp.broadcast_to(table[0], (*ids.shape, table.shape[-1]))
    else:
      rows = jnp.take(table, ids, axis=0)
    rows = rows.astype(self.config.compute_dtype)
    return rows if ids.shape[0] == 1 else constrain(rows, HIDDEN)  # [1, seq]: positions shared by every row.

  def __call__(
    self, input_ids: Array, input_mask: Array, segment_ids: Array, deterministic: bool, position_ids=None
  ) -> Array:
    # input_ids, input_mask, segment_ids, position_ids: [batch, seq] -> [batch, seq, embedding_width]; positions
    # 0, 1, ... by default.
    positions = jnp.arange(input_ids.shape[-1])[None] if position_ids is None else position_ids
    offset = self.config.position_offset
    if offset:  # RoBERTa's positions: real tokens from `offset` on, padding at `offset - 1` (its padding index).
      positions = jnp.where(input_mask > 0, positions + offset, offset - 1)
    x = (
      self._lookup(self.word_embeddings, ("vocab", None), input_ids)
      + self._lookup(self.position_embeddings, (None, None), positions)
      + self._lookup(self.token_type_embeddings, (None, None), segment_ids)
    )
    return constrain(self.dropout(self.layer_norm(x), deterministic=deterministic), HIDDEN)


def make_pooler(config: BertConfig, name: str | None = None) -> nn.Module:
  """The dense layer of the pooler (then tanh), H -> H."""
  return dense(config, config.hidden_size, ("embed", "embed_out"), name=name)


class BertModel(nn.Module):
  """The encoder: returns the sequence output [batch, seq, hidden] and the pooled [CLS] output [batch, hidden].

  Packed rows (several instances in one row): `input_mask` holds each token's instance number (see
  `attention.attention_mask`), `position_ids` [batch, seq] restart at each instance, and `cls_positions` [batch,
  instances] name each instance's [CLS], whose pooled outputs are [batch, instances, hidden]. Without them a row is
  one instance: positions 0, 1, ... and its [CLS] at 0.

  With `mutable=["intermediates"]` it also collects every layer's hidden states and attention probabilities
  (see `encoder_intermediates`); otherwise they cost nothing. `head_mask` [layers, heads] scales each head's output
  as `transformers`' `head_mask` does (0 prunes the head; its gradient is the head's importance, Michel et al.
  2019); without one the model holds no trace of it. The collected probabilities are before the mask.
  """

  config: BertConfig

  def setup(self):
    config = self.config
    self.embeddings = Embeddings(config)
    self.stack = layers.make_stack(config)  # The embeddings' projection (if any) and the layers.
    self.pooler = make_pooler(config, name="pooler")

  def __call__(
    self,
    input_ids: Array,
    input_mask: Array,
    segment_ids: Array,
    deterministic: bool = True,
    position_ids: Array | None = None,
    cls_positions: Array | None = None,
    head_mask: Array | None = None,
  ) -> tuple[Array, Array]:
    x = self.stack.project(self.embeddings(input_ids, input_mask, segment_ids, deterministic, position_ids))
    self.sow("intermediates", "embedding_output", x)
    x = self.stack(x, input_mask, deterministic, head_mask)
    # The gathered rows stay split by batch as the sequence was: without the constraint, SPMD partitioning may
    # split them by hidden (as the next kernel is) and pay an all-to-all back in the backward pass.
    if cls_positions is None:
      cls = constrain(x[:, 0], ("act_batch", "act_embed"))
    else:
      cls = constrain(gather_positions(x, cls_positions), HIDDEN)
    pooled = constrain(jnp.tanh(self.pooler(cls)), ("act_batch",) + (None,) * (cls.ndim - 2) + ("act_embed",))
    return x, pooled

  def dummy_inputs(self) -> tuple[Array, ...]:
    ids = jnp.zeros((1, 1), jnp.int32)
    return ids, ids, ids


def encoder_intermediates(intermediates: dict, config: BertConfig) -> dict[str, Array]:
  """What `BertModel.apply(..., mutable=["intermediates"])` collected, in either layer layout, as
  `hidden_states` [num_layers + 1, batch, seq, hidden] (the embeddings' output, then each layer's) and
  `attention_probs` [num_layers, batch, heads, q, k] (float32; only the "xla" attention path computes them, so a
  fused kernel's model returns none). Nothing is collected unless asked for."""
  sharing = config.layer_sharing
  if config.scan_layers:  # Stacked on a leading layer axis.
    scope = intermediates["layers" if sharing == "none" else "shared_layer"]
    hidden = scope["hidden_states"][0]
    probs = scope["attention"]["attention_probs"][0] if "attention" in scope else None
  elif sharing == "all":  # One module called num_layers times: a value per call.
    scope = intermediates["shared_layer"]
    hidden = jnp.stack(scope["hidden_states"])
    probs = jnp.stack(scope["attention"]["attention_probs"]) if "attention" in scope else None
  else:
    per_layer = [intermediates[f"layer_{i}"] for i in range(config.num_layers)]
    hidden = jnp.stack([layer["hidden_states"][0] for layer in per_layer])
    if "shared_attention" in intermediates:
      probs = jnp.stack(intermediates["shared_attention"]["attention_probs"])
    elif all("attention" in layer for layer in per_layer):
      probs = jnp.stack([layer["attention"]["attention_probs"][0] for layer in per_layer])
    else:
      probs = None
  hidden = jnp.concatenate([intermediates["embedding_output"][0][None], hidden])
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
    # To the embeddings' width: the decoder is tied to the word embeddings.
    self.mlm_transform = dense(config, config.embedding_width, ("embed", "embed_out"), name="mlm_transform")
    self.mlm_layer_norm = layer_norm(config, "mlm_layer_norm")
    self.mlm_output_bias = self.param("mlm_output_bias", zeros(("vocab",)), (config.vocab_size,), jnp.float32)
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
    head_mask: Array | None = None,
  ) -> dict[str, Array]:
    sequence_output, pooled_output = self.bert(
      input_ids, input_mask, segment_ids, deterministic, position_ids, cls_positions, head_mask
    )
    # Only the masked positions reach the vocabulary-sized decoder: ~6x fewer FLOPs there at seq 128.
    hidden = constrain(gather_positions(sequence_output, masked_lm_positions), HIDDEN)
    hidden = self.mlm_layer_norm(layers.ACTIVATIONS[self.config.hidden_act](self.mlm_transform(hidden)))
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
