"""The encoder and the masked-LM pretraining model, composed of the parts `config.architecture` names
(model/architectures.py; the parts' tables are model/parts.py): BERT as published (Devlin et al. 2018), and RoBERTa,
ALBERT, ELECTRA and ModernBERT as other compositions and settings of the parts.

`BertModel` is the composition's embeddings (`bert/embeddings/...`), the stack of its layers (model/stack.py:
`embeddings_project` when the tables are narrower than hidden_size, then `layer_{i}`, or `layers` scanned, or the
shared modules of `layer_sharing`, and a final norm where the layer part asks for one) and its pooler on [CLS]
(`pooler`; none for ModernBERT's). `BertForPretraining` puts the composition's masked-LM head (which owns its decoder,
tied to the word embeddings or not, and runs only at the gathered `masked_lm_positions`) and, where the composition
has one, its 2-way sentence head (`nsp`: next sentence, or ALBERT's sentence order) on it. Every parameter carries
logical axis names (`vocab`, `embed`, `mlp`, `heads`, `kv`, and `layers` for scanned layers) and the main
activations carry `act_*` names; the config's logical axis rules map both onto the device mesh (constraints are
no-ops outside `activation_rules`).

`BertConfig.scan_layers` runs the layers as one `nn.scan` over stacked parameters (`bert/layers/...`, leading
axis `num_layers`) instead of `bert/layer_{i}/...`; `model/param_layout.py` converts between the two.
`BertConfig.remat` rematerialises each layer in the backward pass.

Parameters are float32; activations run in `config.dtype`; the attention softmax and the logits are float32."""

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.model import parts, stack
from bert_jax.model.bert_config import BertConfig
from bert_jax.model.layers import HIDDEN, constrain, gather_positions

Array = jax.Array


class BertModel(nn.Module):
  """The encoder: returns the sequence output [batch, seq, hidden] and the pooled [CLS] output [batch, hidden] (None
  for a composition without a pooler, `Architecture.pooler`).

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
    found = parts.resolve(config)
    self.embeddings = found.embeddings(config)
    # The embeddings' projection (if any), the layers, a final norm.
    self.stack = stack.make_stack(config, self.is_initializing())
    self.pooler_part = found.pooler
    self.pooler = None if found.pooler is None else found.pooler.make(config, "pooler")

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
    x = self.stack(x, input_mask, deterministic, head_mask, position_ids)
    if self.pooler is None:  # The composition's task heads pool for themselves (ModernBERT's).
      return x, None
    # The gathered rows stay split by batch as the sequence was: without the constraint, SPMD partitioning may
    # split them by hidden (as the next kernel is) and pay an all-to-all back in the backward pass.
    if cls_positions is None:
      cls = constrain(x[:, 0], ("act_batch", "act_embed"))
    else:
      cls = constrain(gather_positions(x, cls_positions), HIDDEN)
    pooled = self.pooler_part.apply(self.pooler, cls)
    pooled = constrain(pooled, ("act_batch",) + (None,) * (cls.ndim - 2) + ("act_embed",))
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
  if config.scan_layers:  # Stacked on a leading layer axis (after the unrolled first layer, where it differs).
    scope = intermediates["layers" if sharing == "none" else "shared_layer"]
    first = [intermediates[name] for name in ("layer_0",) if name in intermediates]
    hidden = jnp.concatenate([*(layer["hidden_states"][0][None] for layer in first), scope["hidden_states"][0]])
    probs = None
    if "attention" in scope:
      first_probs = [layer["attention"]["attention_probs"][0][None] for layer in first]
      probs = jnp.concatenate([*first_probs, scope["attention"]["attention_probs"][0]])
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


class BertForPretraining(nn.Module):
  """The encoder with its composition's masked-LM head and, where it has one, its sentence head (BERT's: MLM and next
  sentence; ModernBERT's: MLM alone).

  Returns a dict: `mlm_logits` [batch, max_predictions, vocab] (float32) at `masked_lm_positions` only,
  `nsp_logits` [batch, 2] (float32; [batch, instances, 2] for packed rows, see `BertModel`) where the family has a
  sentence head, and the encoder's `sequence_output` and `pooled_output` (None without a pooler).
  """

  config: BertConfig

  def setup(self):
    config = self.config
    self.bert = BertModel(config)
    heads = parts.resolve(config).pretraining_head
    self.masked_lm = heads.masked_lm(self, config)
    self.sentence = heads.sentence(self, config) if heads.sentence else None

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
    hidden = self.masked_lm.hidden(sequence_output, masked_lm_positions)
    mlm_logits = self.masked_lm.logits(self.bert.embeddings, hidden)
    outputs = dict(mlm_logits=mlm_logits, sequence_output=sequence_output, pooled_output=pooled_output)
    if self.sentence is not None:
      outputs["nsp_logits"] = self.sentence(pooled_output)
    return outputs

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
