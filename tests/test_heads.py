"""The fine-tuning heads equal `transformers`' PyTorch BERT task models: logits (eval mode), and the loss and every
gradient of one training step, from the same weights and batch (float32, dropout off on both sides)."""

import dataclasses

import flax.linen as nn
import jax
import numpy as np
import pytest
import torch
import transformers

from bert_jax.finetune import losses
from bert_jax.handoff.hf_configs import hf_config
from bert_jax.handoff.hf_format import hf_from_params, params_from_hf
from bert_jax.model.encoder import init_params
from bert_jax.model.heads import task_model
from bert_jax.train.step import overwrite_params
from tests.helpers import hf_loss_and_logits

NUM_LABELS = {"classification": 3, "regression": 1, "span": 2, "token": 5, "choice": 1}
HF_CLASSES = {
  "classification": transformers.BertForSequenceClassification,
  "regression": transformers.BertForSequenceClassification,
  "span": transformers.BertForQuestionAnswering,
  "token": transformers.BertForTokenClassification,
  "choice": transformers.BertForMultipleChoice,
}
CHOICES, BATCH, SEQ = 3, 4, 16


def _hf_model(config, head):
  reference_config = transformers.BertConfig(
    **hf_config(config), num_labels=NUM_LABELS[head], problem_type="regression" if head == "regression" else None
  )
  torch.manual_seed(0)
  model = HF_CLASSES[head](reference_config).eval()
  with torch.no_grad():  # HF initialises LayerNorms to 1/0 and biases to 0; make every tensor matter.
    for name, param in model.named_parameters():
      if "LayerNorm" in name or name.endswith("bias"):
        param.add_(0.1 * torch.randn_like(param))
  return model


def _batch(config, head) -> dict:
  rng = np.random.default_rng(0)
  shape = (BATCH, CHOICES, SEQ) if head == "choice" else (BATCH, SEQ)
  input_mask = np.ones(shape, np.int32)
  input_mask[1, ..., 10:] = 0
  input_mask[2, ..., 5:] = 0
  segment_ids = np.zeros(shape, np.int32)
  segment_ids[..., 3:] = 1
  batch = dict(
    input_ids=rng.integers(0, config.vocab_size, shape).astype(np.int32) * input_mask,
    input_mask=input_mask,
    segment_ids=segment_ids * input_mask,
    weight=np.ones(BATCH, np.float32),
  )
  if head == "classification":
    batch["label"] = rng.integers(0, 3, BATCH).astype(np.int32)
  elif head == "regression":
    batch["label"] = rng.uniform(0, 5, BATCH).astype(np.float32)
  elif head == "choice":
    batch["label"] = rng.integers(0, CHOICES, BATCH).astype(np.int32)
  elif head == "span":
    batch["start_positions"] = np.array([1, 4, 0, 7], np.int32)
    batch["end_positions"] = np.array([3, 6, 0, 7], np.int32)
  else:
    batch["labels"] = rng.integers(0, 5, shape).astype(np.int32)
    batch["label_weights"] = (rng.uniform(size=shape) < 0.6).astype(np.float32) * input_mask
  return batch


@pytest.mark.parametrize("head", sorted(NUM_LABELS))
@pytest.mark.slow
def test_head_logits_loss_and_gradients_equal_transformers(small_model_config, head):
  config = dataclasses.replace(small_model_config, hidden_dropout_prob=0.0, attention_dropout_prob=0.0)
  hf = _hf_model(config, head)
  tensors = {name: value.detach().numpy() for name, value in hf.state_dict().items()}
  model = task_model(config, head, NUM_LABELS[head])
  fresh = nn.meta.unbox(init_params(model, jax.random.key(0)))
  params, left = overwrite_params(fresh, params_from_hf(tensors, config))
  assert left == ([] if head in ("classification", "regression", "choice") else ["bert/pooler"])  # HF has none.
  batch = _batch(config, head)

  hf_loss, hf_logits = hf_loss_and_logits(hf, head, batch)
  hf_loss.backward()
  hf_grads = params_from_hf({name: p.grad.numpy() for name, p in hf.named_parameters()}, config)

  ours = jax.jit(lambda p, b: losses.logits(p, b, model))(params, batch)
  expected_logits = hf_logits.detach().numpy()
  np.testing.assert_allclose(np.asarray(ours), expected_logits.reshape(ours.shape), atol=1e-5, rtol=1e-5)

  loss_fn = losses.make_loss(head).value
  (loss, metrics), grads = jax.jit(lambda p, b: jax.value_and_grad(loss_fn, has_aux=True)(p, b, model))(params, batch)
  np.testing.assert_allclose(float(loss), hf_loss.item(), rtol=1e-5)
  flat_grads = jax.tree_util.tree_flatten_with_path(hf_grads)[0]
  assert len(flat_grads) > 30
  for path, expected in flat_grads:
    got = grads
    for key in path:
      got = got[key.key]
    if path[-2].key == "word_embeddings":
      # torch's Embedding(padding_idx=0) never updates [PAD]'s row; Google BERT (TF) and bert_jax do.
      got, expected = np.asarray(got)[1:], expected[1:]
    np.testing.assert_allclose(np.asarray(got), expected, atol=1e-6, rtol=1e-4, err_msg=jax.tree_util.keystr(path))

  # The head travels back to transformers' names: the same tensors `from_pretrained` would load.
  exported = hf_from_params(params, config)
  head_name = "qa_outputs" if head == "span" else "classifier"
  np.testing.assert_array_equal(exported[f"{head_name}.weight"], tensors[f"{head_name}.weight"])
