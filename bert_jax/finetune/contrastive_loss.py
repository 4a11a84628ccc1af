"""The contrastive loss of the embeddings task: sentence-transformers' MultipleNegativesRankingLoss (InfoNCE with
in-batch negatives), its symmetric variant and MatryoshkaLoss, as pure functions of embeddings.

For queries q [batch, dim], their positives p [batch, dim] and optional hard negatives h [batch, n, dim], the
candidates of every query are, in sentence-transformers' column order, [p; h[:, 0]; ...; h[:, n-1]] ([batch (1 + n)]
documents): every row's positive and hard negatives, not only its own. The loss is the mean over queries of the
cross-entropy of `scale * cos_sim(q, candidates)` with the query's own positive as the label (scale 20 by default).
Symmetric (sentence-transformers' MultipleNegativesSymmetricRankingLoss, i.e. `directions=("query_to_doc",
"doc_to_query")`, `partition_mode="per_direction"`): each row's log-partition is the mean of its query's over the
candidates and its positive's over every query. Matryoshka: the sum, over `matryoshka_dims`, of the loss on the
embeddings truncated to the first `dim` components and renormalised (MatryoshkaLoss with equal weights 1).

Negatives from the whole data-parallel mesh: the functions take global arrays, so under `jax.jit` with the batch
sharded over the mesh's data axes every device's documents are candidates for every query and the gradients are
exact; XLA inserts the all-gather of the documents (tests/test_contrastive_loss.py checks 8 devices against 1).

`weight` [batch] (1 for a real row, 0 for padding) drops a row as a query and its documents as candidates.
"""

import jax
import jax.numpy as jnp

from bert_jax.finetune.contrastive import check_matryoshka_dims

Array = jax.Array


def cosine_similarities(queries: Array, documents: Array) -> Array:
  """[q, dim] x [n, dim] -> [q, n] float32 cosine similarities (each side normalised as torch's `F.normalize`)."""
  queries, documents = (_unit(x.astype(jnp.float32)) for x in (queries, documents))
  return jnp.einsum("qd,nd->qn", queries, documents, precision=jax.lax.Precision.HIGHEST)


def _unit(x: Array) -> Array:
  return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def ranking_losses(
  queries: Array,
  positives: Array,
  negatives: Array | None = None,
  *,
  scale: float,
  symmetric: bool,
  weight: Array | None = None,
) -> Array:
  """Each row's loss [batch] float32 (see the module docstring); a padding row's (`weight` 0) is 0."""
  batch = queries.shape[0]
  weight = jnp.ones((batch,), jnp.float32) if weight is None else weight.astype(jnp.float32)
  real = weight > 0
  documents, document_real = positives, real
  if negatives is not None and negatives.shape[1]:
    # [p; h[:, 0]; h[:, 1]; ...], as sentence-transformers concatenates its columns.
    documents = jnp.concatenate([positives, negatives.swapaxes(0, 1).reshape(-1, negatives.shape[-1])], axis=0)
    document_real = jnp.tile(real, negatives.shape[1] + 1)
  scores = scale * cosine_similarities(queries, documents)  # [batch, batch (1 + n)]
  positive = jnp.diagonal(scores[:, :batch])
  log_z = jax.nn.logsumexp(jnp.where(document_real[None, :], scores, -jnp.inf), axis=1)
  if symmetric:  # Each positive against every query: [batch, batch], row i = positive i.
    backward = scores[:, :batch].T
    log_z = (log_z + jax.nn.logsumexp(jnp.where(real[None, :], backward, -jnp.inf), axis=1)) / 2
  return jnp.where(real, log_z - positive, 0.0)


def contrastive_losses(
  queries: Array,
  positives: Array,
  negatives: Array | None = None,
  *,
  scale: float = 20.0,
  symmetric: bool = False,
  matryoshka_dims: tuple[int, ...] = (),
  weight: Array | None = None,
) -> Array:
  """Each row's loss [batch]: `ranking_losses` at the full dimension, or summed over `matryoshka_dims`."""
  if not matryoshka_dims:
    return ranking_losses(queries, positives, negatives, scale=scale, symmetric=symmetric, weight=weight)
  check_matryoshka_dims(matryoshka_dims, queries.shape[-1])
  total = 0.0
  for dim in matryoshka_dims:  # Truncated then renormalised, as MatryoshkaLoss's `shrink`.
    shrunk = [None if x is None else _unit(x[..., :dim].astype(jnp.float32)) for x in (queries, positives, negatives)]
    total = total + ranking_losses(*shrunk, scale=scale, symmetric=symmetric, weight=weight)
  return total


def contrastive_loss(
  queries: Array,
  positives: Array,
  negatives: Array | None = None,
  *,
  scale: float = 20.0,
  symmetric: bool = False,
  matryoshka_dims: tuple[int, ...] = (),
  weight: Array | None = None,
) -> Array:
  """The mean over real rows of `contrastive_losses`: sentence-transformers' loss value on the same embeddings."""
  losses = contrastive_losses(
    queries, positives, negatives, scale=scale, symmetric=symmetric, matryoshka_dims=matryoshka_dims, weight=weight
  )
  count = queries.shape[0] if weight is None else jnp.sum(weight)
  return jnp.sum(losses) / jnp.maximum(count, 1e-5)
