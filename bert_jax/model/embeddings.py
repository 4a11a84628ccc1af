"""Embeddings parts: the module named `embeddings` under the encoder (model/parts.py's EMBEDDINGS).

An embeddings part is a Flax module class made as `cls(config, **arguments)` (an architecture's arguments for the
part are its attributes), called as `embeddings(input_ids, input_mask,
segment_ids, deterministic, position_ids=None)` -> [batch, seq, embedding_width], with `attend(hidden)`
[..., embedding_width] -> [..., vocab], the masked-LM decoder tied to its word table (compute dtype). The encoder's
stack projects `embedding_width` to the hidden width when they differ (model/stack.py).

"absolute" (BERT, RoBERTa, ALBERT, ELECTRA): word + absolute position + token-type tables, then LayerNorm and
dropout. The tables are `config.embedding_width` wide (ALBERT's and ELECTRA's factorised embeddings); RoBERTa's
positions start at `config.position_offset`.
"token" (ModernBERT): the word table alone, then a norm (argument `norm`; without one, NeoBERT's) and dropout;
positions enter each layer's attention as rotary positions (model/rotary.py), and there are no token types.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.model.bert_config import BertConfig
from bert_jax.model.layers import HIDDEN, constrain, kernel_init, layer_norm

Array = jax.Array


class AbsoluteEmbeddings(nn.Module):
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

  def attend(self, hidden: Array) -> Array:
    """[..., embedding_width] -> [..., vocab]: the decoder tied to the word table."""
    return self.word_embeddings.attend(hidden)


class TokenEmbeddings(AbsoluteEmbeddings):
  """The word table, then the norm (unless `norm` is False) and dropout: no position or token-type table (ModernBERT's
  embeddings)."""

  norm: bool = True

  def setup(self):
    config = self.config
    self.word_embeddings = nn.Embed(
      config.vocab_size,
      features=config.embedding_width,
      dtype=config.compute_dtype,
      param_dtype=jnp.float32,
      embedding_init=kernel_init(config, ("vocab", "embed")),
    )
    if self.norm:
      self.layer_norm = layer_norm(config, "layer_norm")
    self.dropout = nn.Dropout(config.hidden_dropout_prob)

  def __call__(
    self, input_ids: Array, input_mask: Array, segment_ids: Array, deterministic: bool, position_ids=None
  ) -> Array:
    del input_mask, segment_ids, position_ids  # No padding-dependent positions, no token types.
    x = self._lookup(self.word_embeddings, ("vocab", None), input_ids)
    if self.norm:
      x = self.layer_norm(x)
    return constrain(self.dropout(x, deterministic=deterministic), HIDDEN)
