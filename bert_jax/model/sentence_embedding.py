"""Sentence embeddings from the encoder's sequence output: sentence-transformers' `Pooling` (its `cls` and `mean`
modes) and `Normalize` modules, for rows of one instance and for packed rows.

Every consumer of an embedding (the contrastive task, retrieval evaluation, the retrieval probe of pretraining,
`--mode=embed`, the sentence-transformers export) computes it here, so that what bert_jax trains, evaluates and
exports is the one function sentence-transformers computes on the exported model:

* `cls`: the first token's vector (the [CLS] of each instance in a packed row);
* `mean`: the mean of the instance's token vectors (special tokens included, padding excluded), as
  sentence-transformers' `pooling_mode_mean_tokens` (sum over the attention mask / max(count, 1e-9));
* normalised: divided by its L2 norm, at least 1e-12 (torch's `F.normalize`).

Pooling runs in float32 whatever the encoder's dtype.
"""

import dataclasses

import jax
import jax.numpy as jnp

Array = jax.Array

POOLINGS = ("cls", "mean")


@dataclasses.dataclass(frozen=True)
class Settings:
  """How a model's sentence embedding is computed and asked for: its pooling (`POOLINGS`), whether it is normalised,
  the prompts put before queries and documents, and the longest input in tokens (0: none recorded, the job's)."""

  pooling: str = "mean"
  normalized: bool = True
  query_prompt: str = ""
  document_prompt: str = ""
  max_seq_length: int = 0

  def __post_init__(self):
    if self.pooling not in POOLINGS:
      raise ValueError(f"pooling={self.pooling!r}; expected one of {POOLINGS}.")
    if self.max_seq_length < 0:
      raise ValueError(f"max_seq_length={self.max_seq_length} must be >= 0.")


def settings(embedding, source: Settings | None = None) -> Settings:
  """The settings of a job: `config.embedding`'s keys where set, else the source's (`source`: what a
  sentence-transformers directory or a contrastive run recorded), else `Settings`' defaults."""
  base = source or Settings()
  chosen = dict(
    pooling=embedding.pooling,
    normalized=embedding.normalize,
    query_prompt=embedding.query_prompt,
    document_prompt=embedding.document_prompt,
  )
  return dataclasses.replace(base, **{key: value for key, value in chosen.items() if value is not None})


def pool(
  sequence_output: Array,
  input_mask: Array,
  pooling: str,
  instances: int = 0,
  cls_positions: Array | None = None,
) -> Array:
  """`sequence_output` [batch, seq, hidden] pooled by `pooling` ("cls" or "mean"): [batch, hidden] float32.

  Packed rows (`instances` > 0): `input_mask` holds each token's instance number (1, 2, ...; 0 padding) and
  `cls_positions` [batch, instances] each instance's first token; the result is [batch, instances, hidden], zeros
  for an instance a row does not hold."""
  if pooling not in POOLINGS:
    raise ValueError(f"pooling={pooling!r}; expected one of {POOLINGS}.")
  hidden = sequence_output.astype(jnp.float32)
  if not instances:
    if pooling == "cls":
      return hidden[:, 0]
    mask = (input_mask > 0).astype(jnp.float32)[..., None]
    return jnp.sum(hidden * mask, axis=1) / jnp.maximum(jnp.sum(mask, axis=1), 1e-9)
  if pooling == "cls":
    if cls_positions is None:
      raise ValueError("cls pooling of packed rows needs cls_positions.")
    gathered = jnp.take_along_axis(hidden, cls_positions[..., None], axis=1)
    held = jnp.any(input_mask[:, None, :] == jnp.arange(1, instances + 1)[None, :, None], axis=-1)
    return gathered * held[..., None]
  # [batch, instances, seq]: which tokens are each instance's.
  member = (input_mask[:, None, :] == jnp.arange(1, instances + 1)[None, :, None]).astype(jnp.float32)
  sums = jnp.einsum("bis,bsh->bih", member, hidden, precision=jax.lax.Precision.HIGHEST)
  return sums / jnp.maximum(jnp.sum(member, axis=-1, keepdims=True), 1e-9)


def normalize(embeddings: Array) -> Array:
  """Each embedding (the last axis) divided by its L2 norm, at least 1e-12, as torch's `F.normalize`."""
  norm = jnp.sqrt(jnp.sum(jnp.square(embeddings), axis=-1, keepdims=True))
  return embeddings / jnp.maximum(norm, 1e-12)


def sentence_embeddings(
  encoder,
  params: dict,
  batch: dict,
  pooling: str,
  normalized: bool,
  deterministic: bool = True,
  rngs: dict | None = None,
) -> Array:
  """The embeddings of `batch`'s rows (`input_ids`, `input_mask`, `segment_ids`; packed rows add `position_ids`,
  `cls_positions` [batch, instances]) by `encoder` (a `BertModel`) with its `params` (a tree's `bert`): [batch,
  hidden], or [batch, instances, hidden] for packed rows, float32."""
  cls_positions = batch.get("cls_positions")
  sequence_output, _ = encoder.apply(
    {"params": params},
    batch["input_ids"],
    batch["input_mask"],
    batch["segment_ids"],
    deterministic,
    batch.get("position_ids"),
    cls_positions,
    rngs=rngs or {},
  )
  instances = 0 if cls_positions is None else cls_positions.shape[-1]
  embeddings = pool(sequence_output, batch["input_mask"], pooling, instances, cls_positions)
  return normalize(embeddings) if normalized else embeddings
