"""The contrastive loss (finetune/contrastive_loss.py): sentence-transformers' MultipleNegativesRankingLoss, its
symmetric variant and MatryoshkaLoss on the same embeddings, and the global negatives over a mesh of 8 devices
against one device on the concatenated batch, in loss and gradients."""

import functools

import jax
import numpy as np
import pytest
import torch
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from sentence_transformers.sentence_transformer.losses import (
  MultipleNegativesRankingLoss,
  MultipleNegativesSymmetricRankingLoss,
)
from sentence_transformers.sentence_transformer.losses.matryoshka import shrink

from bert_jax.finetune.contrastive_loss import contrastive_loss

BATCH, DIM, NEGATIVES = 16, 12, 2


def _embeddings(seed=0, negatives=NEGATIVES):
  rng = np.random.default_rng(seed)
  queries, positives = (rng.normal(size=(BATCH, DIM)).astype(np.float32) for _ in range(2))
  hard = rng.normal(size=(BATCH, negatives, DIM)).astype(np.float32) if negatives else None
  return queries, positives, hard


def _torch_loss(loss, queries, positives, hard, dims=None):
  """sentence-transformers' loss on these embeddings (MatryoshkaLoss: its shrink and weights 1 over `dims`)."""
  columns = [queries, positives] + ([] if hard is None else [hard[:, i] for i in range(hard.shape[1])])
  columns = [torch.tensor(c, dtype=torch.float64) for c in columns]
  if dims is None:
    return float(loss.compute_loss_from_embeddings(columns, None))
  return sum(float(loss.compute_loss_from_embeddings([shrink(c, d) for c in columns], None)) for d in dims)


@pytest.mark.parametrize("negatives", [0, NEGATIVES])
@pytest.mark.parametrize("symmetric", [False, True])
def test_equals_sentence_transformers(negatives, symmetric):
  queries, positives, hard = _embeddings(negatives=negatives)
  reference = (MultipleNegativesSymmetricRankingLoss if symmetric else MultipleNegativesRankingLoss)(None)
  ours = contrastive_loss(queries, positives, hard, scale=20.0, symmetric=symmetric)
  np.testing.assert_allclose(float(ours), _torch_loss(reference, queries, positives, hard), rtol=1e-6, atol=1e-6)


def test_matryoshka_equals_sentence_transformers():
  queries, positives, hard = _embeddings()
  dims = (12, 8, 4)
  ours = contrastive_loss(queries, positives, hard, matryoshka_dims=dims)
  expected = _torch_loss(MultipleNegativesRankingLoss(None), queries, positives, hard, dims)
  np.testing.assert_allclose(float(ours), expected, rtol=1e-6, atol=1e-6)
  with pytest.raises(ValueError, match=r"matryoshka_dims=\(16, 4\): \[16\] outside 1..12"):
    contrastive_loss(queries, positives, hard, matryoshka_dims=(16, 4))


def test_scale_and_padding_rows():
  """Another scale is sentence-transformers' at that scale; a weight-0 row is neither a query nor a candidate: the
  loss is the one of the real rows alone."""
  queries, positives, hard = _embeddings()
  reference = MultipleNegativesRankingLoss(None, scale=7.0)
  ours = contrastive_loss(queries, positives, hard, scale=7.0)
  np.testing.assert_allclose(float(ours), _torch_loss(reference, queries, positives, hard), rtol=1e-6, atol=1e-6)
  weight = np.ones(BATCH, np.float32)
  weight[-5:] = 0
  padded = contrastive_loss(queries, positives, hard, symmetric=True, weight=weight)
  alone = contrastive_loss(queries[:-5], positives[:-5], hard[:-5], symmetric=True)
  np.testing.assert_allclose(float(padded), float(alone), rtol=1e-6)


@pytest.mark.parametrize("symmetric,dims", [(False, ()), (True, (12, 6))])
def test_eight_devices_equal_one_on_the_concatenated_batch(symmetric, dims):
  """Per-device batch 2 on 8 devices (every device's documents candidates for every query) against one device with
  the batch of 16: the same loss and gradients to 1e-6, and the documents all-gathered in the compiled program."""
  queries, positives, hard = _embeddings(seed=3)
  loss = functools.partial(contrastive_loss, symmetric=symmetric, matryoshka_dims=dims)
  value_and_grad = jax.value_and_grad(loss, argnums=(0, 1, 2))

  def run(devices):
    mesh = Mesh(np.array(devices), ("data",))
    rows = NamedSharding(mesh, PartitionSpec("data"))
    arrays = [jax.device_put(x, rows) for x in (queries, positives, hard)]
    step = jax.jit(value_and_grad, in_shardings=(rows,) * 3, out_shardings=(None, (rows,) * 3))
    value, grads = step(*arrays)
    return float(value), [np.asarray(g) for g in grads], step.lower(*arrays).compile().as_text()

  one, one_grads, _ = run(jax.devices()[:1])
  eight, eight_grads, hlo = run(jax.devices()[:8])
  assert len(jax.devices()) == 8
  assert "all-gather" in hlo or "all-reduce" in hlo  # The documents cross the devices.
  np.testing.assert_allclose(eight, one, rtol=1e-6, atol=1e-6)
  for ours, reference in zip(eight_grads, one_grads, strict=True):
    np.testing.assert_allclose(ours, reference, rtol=1e-6, atol=1e-6)
  # Not the per-device loss: each device alone, with only its own 2 rows as candidates, would differ.
  local = np.mean([float(loss(queries[i : i + 2], positives[i : i + 2], hard[i : i + 2])) for i in range(0, 16, 2)])
  assert abs(local - one) > 1e-3
