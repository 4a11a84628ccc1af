"""ELECTRA (Clark et al. 2020): a small masked-LM generator and the discriminator it trains, one Flax module whose
parameters are one tree, as in the official code and transformers' `ElectraForMaskedLM` / `ElectraForPreTraining`:

  bert/...                     the discriminator's encoder (`BertModel`): its `embeddings` are SHARED with the
                               generator (word, position and token-type tables and their LayerNorm), then its own
                               `embeddings_project` (when the tables are narrower than hidden_size) and layers;
                               the pooler is there for fine-tuning, never trained by ELECTRA.
  rtd_dense, rtd_prediction    the replaced-token-detection head: hidden -> hidden (`hidden_act`) -> one logit per
                               token (`ElectraDiscriminatorPredictions`).
  generator/...                the generator's `embeddings_project` (tables -> its hidden size), its layers
                               (`stack.make_stack`), and its MLM head (`mlm_transform` to the tables' width, exact
                               GELU, `mlm_layer_norm`, `mlm_output_bias`) whose decoder is tied to bert's word
                               embeddings (`ElectraGeneratorPredictions` + `generator_lm_head`).

The heads are the composition's (`config.architecture.pretraining_head`, model/pretraining_heads.py): its
`discriminator` head on the discriminator, its `generator` head on the generator (of the generator's config); a
composition without them is refused.

The generator's config comes from the discriminator's (`bert_config.generator_config`). Without one the module is
the discriminator alone (transformers' `ElectraForPreTraining`, as a Hugging Face directory without its generator
loads). What ELECTRA does with the two (sampling, the corrupted input, the labels, the loss) is
train/objectives/electra.py's.

`generator_as_masked_lm` and `with_generator` move the generator between this tree and the tree of a masked LM of
its own config (`bert` with the shared embeddings, `mlm_*`), which is what transformers' `ElectraForMaskedLM` holds.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.model import parts, stack
from bert_jax.model.bert_config import BertConfig
from bert_jax.model.encoder import BertModel

Array = jax.Array


def _head(config: BertConfig, slot: str):
  """The maker of the composition's `slot` head; raises ValueError if its pretraining head has none."""
  maker = getattr(parts.resolve(config).pretraining_head, slot)
  if maker is None:
    raise ValueError(
      f"model.model_type={config.model_type!r} composes pretraining_head={config.architecture.pretraining_head!r}, "
      f"which has no {slot} head: ELECTRA's model needs one (model/pretraining_heads.py)."
    )
  return maker


class Generator(nn.Module):
  """The generator's own parameters: from the shared embeddings [batch, seq, embedding_width] to the MLM hidden
  states at `masked_lm_positions` [batch, predictions, embedding_width]; its `masked_lm` head decodes them."""

  config: BertConfig

  def setup(self):
    config = self.config
    self.stack = stack.make_stack(config, self.is_initializing())
    self.masked_lm = _head(config, "generator")(self, config)

  def __call__(self, embedded: Array, input_mask: Array, masked_lm_positions: Array, deterministic: bool) -> Array:
    x = self.stack(self.stack.project(embedded), input_mask, deterministic)
    return self.masked_lm.hidden(x, masked_lm_positions)


class ElectraForPretraining(nn.Module):
  """The discriminator (`config`) and the generator (`generator_config`), sharing the discriminator's embeddings.

  `generate(...)` -> the generator's `mlm_logits` [batch, predictions, vocab] (float32) at `masked_lm_positions`;
  `discriminate(...)` -> `rtd_logits` [batch, seq] (float32, > 0: replaced) and the discriminator's
  `sequence_output`. Packed rows: `position_ids` as in `BertModel`.
  """

  config: BertConfig
  generator_config: BertConfig | None = None

  def setup(self):
    config = self.config
    self.bert = BertModel(config)
    self.replaced_token = _head(config, "discriminator")(self, config)
    if self.generator_config is not None:
      self.generator = Generator(self.generator_config)

  def generate(
    self,
    input_ids: Array,
    input_mask: Array,
    segment_ids: Array,
    masked_lm_positions: Array,
    deterministic: bool = True,
    position_ids: Array | None = None,
  ) -> Array:
    embedded = self.bert.embeddings(input_ids, input_mask, segment_ids, deterministic, position_ids)
    hidden = self.generator(embedded, input_mask, masked_lm_positions, deterministic)
    return self.generator.masked_lm.logits(self.bert.embeddings, hidden)

  def discriminate(
    self,
    input_ids: Array,
    input_mask: Array,
    segment_ids: Array,
    deterministic: bool = True,
    position_ids: Array | None = None,
  ) -> dict[str, Array]:
    sequence_output, _ = self.bert(input_ids, input_mask, segment_ids, deterministic, position_ids)
    rtd_logits = self.replaced_token(sequence_output)
    return dict(rtd_logits=rtd_logits, sequence_output=sequence_output)

  def __call__(self, input_ids: Array, input_mask: Array, segment_ids: Array, masked_lm_positions: Array) -> dict:
    """Both parts on one input, without dropout (what `init` runs): `discriminate`'s outputs and `mlm_logits`."""
    outputs = self.discriminate(input_ids, input_mask, segment_ids)
    if self.generator_config is not None:
      outputs["mlm_logits"] = self.generate(input_ids, input_mask, segment_ids, masked_lm_positions)
    return outputs

  def dummy_inputs(self) -> tuple[Array, ...]:
    """One token and one masked position: the shapes `init` needs, nothing more."""
    ids = jnp.zeros((1, 1), jnp.int32)
    return ids, ids, ids, ids


_MLM_HEAD = ("mlm_transform", "mlm_layer_norm", "mlm_output_bias")


def generator_as_masked_lm(params: dict) -> dict:
  """The generator of an ELECTRA tree as a masked LM's tree of its own config (`BertForPretraining`'s names, no
  pooler): `bert` = the shared embeddings and the generator's projection and layers, and its MLM head."""
  generator = params["generator"]
  encoder = {name: value for name, value in generator.items() if name not in _MLM_HEAD}
  return {
    "bert": dict(encoder, embeddings=params["bert"]["embeddings"]),
    **{name: generator[name] for name in _MLM_HEAD},
  }


def with_generator(params: dict, masked_lm: dict, where: str) -> dict:
  """`params` (a discriminator's tree) with the generator of `masked_lm` (`generator_as_masked_lm`'s form, numpy),
  whose embeddings must be the discriminator's: ELECTRA shares them. Raises ValueError naming `where` and the first
  table that differs."""
  for name, value in jax.tree_util.tree_leaves_with_path(masked_lm["bert"]["embeddings"]):
    path = [getattr(key, "key", key) for key in name]
    mine = params["bert"]["embeddings"]
    for key in path:
      mine = mine[key]
    if not np.array_equal(np.asarray(mine), np.asarray(value)):
      raise ValueError(
        f"{where}: the generator's embeddings/{'/'.join(path)} differ from the discriminator's; ELECTRA's generator "
        "shares the discriminator's embeddings."
      )
  encoder = {name: value for name, value in masked_lm["bert"].items() if name not in ("embeddings", "pooler")}
  return dict(params, generator=dict(encoder, **{name: masked_lm[name] for name in _MLM_HEAD}))
