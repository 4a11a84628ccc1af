"""Hugging Face `config.json` <-> BertConfig, per `model_type` (BERT, RoBERTa, ALBERT, ELECTRA, ModernBERT).

The BERT families' `config.json` names the BERT fields as `bert_config.json` does (model/bert_config.py); beyond
them:

  roberta  `pad_token_id`: positions start after it, so position_offset = pad_token_id + 1 (2 in every published
           RoBERTa, whose max_position_embeddings is then 514 for 512 tokens).
  albert   `embedding_size` (always written; 0 in bert_jax when it equals hidden_size: transformers' AlbertModel
           then still has its projection, `embedding_hidden_mapping_in`, which bert_jax writes and reads as the
           identity, hf_names.py); `num_hidden_groups` G and `inner_group_num`: G = 1 is layer_sharing "all", G =
           num_hidden_layers is "none", and inner_group_num must be 1. Partial sharing ("attention", "ffn") is
           written as G = num_layers groups holding copies of the shared tensors (it reads back as "none").
  electra  `embedding_size` (always written; 0 in bert_jax when it equals hidden_size, which has no projection).
           The discriminator and the generator each have their own config.json.

Their `classifier_dropout` (transformers' BERT task heads' dropout) is not read: bert_jax's BERT heads drop out by
`hidden_dropout_prob`, and its `classifier_*` fields are ModernBERT's.

ModernBERT's (transformers' ModernBertConfig) has fields of its own; one it leaves out takes transformers' default
(`MODERNBERT_DEFAULTS`). They set these BertConfig fields:

  hidden_activation                             hidden_act (the layers' activation)
  norm_eps, norm_bias                           layer_norm_eps, norm_bias (every norm is a LayerNorm)
  attention_bias, mlp_bias                      linear_bias
  classifier_activation, classifier_bias        classifier_activation, classifier_bias (the prediction head's dense
                                                layer, under the masked LM and the task models)
  classifier_pooling, classifier_dropout        classifier_pooling, classifier_dropout (the task models')
  decoder_bias, tie_word_embeddings             both true: the tied decoder with its output bias
  global_rope_theta, local_rope_theta           rope_theta, local_rope_theta (null there, 0 here: the global base)
  local_attention, global_attn_every_n_layers   local_attention, global_attention_every (local_attention 0 here:
                                                every layer global, written as global_attn_every_n_layers 1)
  embedding_dropout, mlp_dropout                hidden_dropout_prob
  attention_dropout                             attention_dropout_prob (on the probabilities and the output)
  pad, cls, sep, bos, eos _token_id             the tokenizer's (written from it, not read)

Two fields that bert_jax holds as one must agree, and a ModernBERT of another kind (rope_scaling, an untied decoder,
a class bert_jax does not read) is refused on import, naming the field. The masked LM, the bare encoder and the four
task models (model/heads.py's HF_ARCHITECTURES) are read. transformers' runtime switches (sparse_prediction,
reference_compile, ...) are neither read nor written. ModernBERT has no token types: `type_vocab_size` reads as
BertConfig's default, unused by the model.

What a family's `config.json` cannot say (factorised embeddings in a BERT, sharing in a RoBERTa, rotary positions in
any BERT family, RMSNorm in a ModernBERT) is refused on export, naming the field.
"""

from absl import logging

from bert_jax.data.tokenizer.base import Tokenizer
from bert_jax.handoff import hf_names
from bert_jax.model.bert_config import (
  ACTIVATIONS,
  EXTENSION_FIELDS,
  PREDICTION_HEAD_FIELDS,
  BertConfig,
  from_bert_json,
  to_bert_json,
)
from bert_jax.model.heads import HF_ARCHITECTURES


def _bert_fields(config: BertConfig) -> dict:
  """The fields every family's config.json shares: BERT's, without bert_jax's extensions."""
  return {name: value for name, value in to_bert_json(config).items() if name not in EXTENSION_FIELDS}


def _from_bert_family(fields: dict, where: str, **values) -> BertConfig:
  """A BERT family's config.json with `values` set, read as a `bert_config.json`, less the fields transformers names as
  bert_jax's ModernBERT head fields but means otherwise (BertConfig's `classifier_dropout`: its heads' dropout, null
  for hidden_dropout_prob); bert_jax's BERT heads drop out by hidden_dropout_prob."""
  kept = {name: value for name, value in fields.items() if name not in PREDICTION_HEAD_FIELDS}
  return from_bert_json(dict(kept, **values), where)


def _refuse(config: BertConfig, family: str, **allowed) -> None:
  """Raises ValueError if a field of `config` has a value other than `allowed`'s, which `family` cannot write."""
  for name, value in allowed.items():
    if getattr(config, name) != value:
      raise ValueError(
        f"model.{name}={getattr(config, name)!r}: transformers' {family} has no such setting (it needs {value!r}); "
        "export this model as a bundle."
      )


# What BERT's layers are, in the fields the modern encoders added: the BERT families' config.json cannot say otherwise.
_BERT_LAYERS = dict(norm="layer_norm", norm_bias=True, linear_bias=True, rope_theta=0.0)


def _read_bert(fields: dict, where: str) -> BertConfig:
  return _from_bert_family(fields, where, model_type="bert")


def _write_bert(config: BertConfig, tokenizer: Tokenizer | None) -> dict:
  _refuse(config, "BERT", embedding_size=0, layer_sharing="none", position_offset=0, **_BERT_LAYERS)
  return dict(_bert_fields(config), model_type="bert")


def _read_roberta(fields: dict, where: str) -> BertConfig:
  return _from_bert_family(fields, where, model_type="roberta", position_offset=fields.get("pad_token_id", 1) + 1)


def _write_roberta(config: BertConfig, tokenizer: Tokenizer | None) -> dict:
  _refuse(config, "RoBERTa", embedding_size=0, layer_sharing="none", **_BERT_LAYERS)
  if config.position_offset < 1:
    raise ValueError(
      f"model.position_offset={config.position_offset}: transformers' RoBERTa starts positions after its padding "
      "index (pad_token_id + 1, at least 1); export this model as a bundle."
    )
  return dict(
    _bert_fields(config), model_type="roberta", pad_token_id=config.position_offset - 1, bos_token_id=0, eos_token_id=2
  )


def _read_albert(fields: dict, where: str) -> BertConfig:
  layers, groups, inner = (
    fields.get("num_hidden_layers"),
    fields.get("num_hidden_groups", 1),
    fields.get("inner_group_num", 1),
  )
  if inner != 1 or groups not in (1, layers):
    raise ValueError(
      f"{where} has num_hidden_groups={groups} and inner_group_num={inner} for num_hidden_layers={layers}; bert_jax "
      "reads one layer per group and either one group (layer_sharing 'all') or one per layer ('none')."
    )
  sharing = "all" if groups == 1 else "none"
  hidden_act = fields.get("hidden_act", "gelu_new")
  embedding_size = fields.get("embedding_size", 128)  # transformers' AlbertConfig default.
  embedding_size = 0 if embedding_size == fields.get("hidden_size") else embedding_size  # Its projection: identity.
  return _from_bert_family(
    fields, where, model_type="albert", hidden_act=hidden_act, layer_sharing=sharing, embedding_size=embedding_size
  )


def _write_albert(config: BertConfig, tokenizer: Tokenizer | None) -> dict:
  _refuse(config, "ALBERT", position_offset=0, **_BERT_LAYERS)
  if config.layer_sharing in ("attention", "ffn"):
    logging.info(
      "ALBERT has no partial sharing: layer_sharing=%r is written as one group per layer, each holding copies of "
      "the shared tensors (it reads back as layer_sharing='none').",
      config.layer_sharing,
    )
  groups = 1 if config.layer_sharing == "all" else config.num_layers
  return dict(
    _bert_fields(config),
    model_type="albert",
    embedding_size=config.embedding_width,
    num_hidden_groups=groups,
    inner_group_num=1,
  )


def _read_electra(fields: dict, where: str) -> BertConfig:
  embedding_size = fields.get("embedding_size", 128)  # transformers' ElectraConfig default.
  if embedding_size == fields.get("hidden_size"):
    embedding_size = 0
  return _from_bert_family(fields, where, model_type="electra", embedding_size=embedding_size)


def _write_electra(config: BertConfig, tokenizer: Tokenizer | None) -> dict:
  _refuse(config, "ELECTRA", position_offset=0, layer_sharing="none", **_BERT_LAYERS)
  return dict(_bert_fields(config), model_type="electra", embedding_size=config.embedding_width)


# transformers' ModernBertConfig defaults (4.57) of the fields bert_jax reads: what a config.json that leaves one out
# means (tests/test_modernbert.py checks them against transformers').
MODERNBERT_DEFAULTS = dict(
  vocab_size=50368,
  hidden_size=768,
  intermediate_size=1152,
  num_hidden_layers=22,
  num_attention_heads=12,
  hidden_activation="gelu",
  max_position_embeddings=8192,
  initializer_range=0.02,
  norm_eps=1e-5,
  norm_bias=False,
  global_rope_theta=160000.0,
  attention_bias=False,
  attention_dropout=0.0,
  global_attn_every_n_layers=3,
  local_attention=128,
  local_rope_theta=10000.0,
  embedding_dropout=0.0,
  mlp_bias=False,
  mlp_dropout=0.0,
  decoder_bias=True,
  classifier_bias=False,
  classifier_activation="gelu",
  classifier_pooling="cls",
  classifier_dropout=0.0,
  tie_word_embeddings=True,
)
# The ModernBERT classes whose files bert_jax reads: the masked LM, the bare encoder and the task models.
_MODERNBERT_ARCHITECTURES = (
  "ModernBertForMaskedLM",
  "ModernBertModel",
  *sorted(set(HF_ARCHITECTURES["modernbert"].values())),
)


def _read_modernbert(fields: dict, where: str) -> BertConfig:
  values = dict(MODERNBERT_DEFAULTS, **{name: value for name, value in fields.items() if name in MODERNBERT_DEFAULTS})
  unread = [name for name in fields.get("architectures") or [] if name not in _MODERNBERT_ARCHITECTURES]
  if unread:
    raise ValueError(f"{where} has architectures={unread}; bert_jax reads {_MODERNBERT_ARCHITECTURES}.")
  if fields.get("rope_scaling") is not None:
    raise ValueError(
      f"{where} has rope_scaling={fields['rope_scaling']!r}; bert_jax's rotary positions are unscaled (rope_scaling "
      "null)."
    )
  for field, value in (("decoder_bias", True), ("tie_word_embeddings", True)):
    if values[field] != value:
      raise ValueError(
        f"{where} has {field}={values[field]!r}; bert_jax's masked LM decodes by the word embeddings plus an output "
        f"bias ({field} {value})."
      )
  for field in ("hidden_activation", "classifier_activation"):
    if values[field] not in ACTIVATIONS:
      raise ValueError(f"{where} has {field}={values[field]!r}; bert_jax has {ACTIVATIONS}.")
  for one, other, what in (
    ("attention_bias", "mlp_bias", "model.linear_bias (the encoder's dense layers' bias)"),
    ("embedding_dropout", "mlp_dropout", "model.hidden_dropout_prob"),
  ):
    if values[one] != values[other]:
      raise ValueError(
        f"{where} has {one}={values[one]!r} and {other}={values[other]!r}; bert_jax holds both as one, {what}."
      )
  if not values["local_attention"] and values["global_attn_every_n_layers"] > 1:
    raise ValueError(
      f"{where} has local_attention=0 with global_attn_every_n_layers={values['global_attn_every_n_layers']}: "
      "local layers that see no other token; bert_jax reads local_attention 0 as every layer global."
    )
  try:
    return BertConfig(
      model_type="modernbert",
      vocab_size=values["vocab_size"],
      hidden_size=values["hidden_size"],
      num_layers=values["num_hidden_layers"],
      num_heads=values["num_attention_heads"],
      intermediate_size=values["intermediate_size"],
      max_position_embeddings=values["max_position_embeddings"],
      hidden_dropout_prob=values["mlp_dropout"],
      attention_dropout_prob=values["attention_dropout"],
      initializer_range=values["initializer_range"],
      layer_norm_eps=values["norm_eps"],
      hidden_act=values["hidden_activation"],
      norm="layer_norm",
      norm_bias=values["norm_bias"],
      linear_bias=values["attention_bias"],
      rope_theta=values["global_rope_theta"],
      local_rope_theta=values["local_rope_theta"] or 0.0,
      local_attention=values["local_attention"],
      global_attention_every=values["global_attn_every_n_layers"],
      classifier_activation=values["classifier_activation"],
      classifier_bias=values["classifier_bias"],
      classifier_pooling=values["classifier_pooling"],
      classifier_dropout=values["classifier_dropout"],
    )
  except ValueError as error:
    raise ValueError(f"{where}: {error}") from None


def _write_modernbert(config: BertConfig, tokenizer: Tokenizer | None) -> dict:
  """ModernBertConfig's fields of `config` (the module docstring's table), and the special token ids of
  `tokenizer` (none without one: transformers' defaults name ids of its own vocabulary)."""
  _refuse(config, "ModernBERT", norm="layer_norm", embedding_size=0, layer_sharing="none", position_offset=0)
  ids = (None,) * 3 if tokenizer is None else (tokenizer.pad_id, tokenizer.cls_id, tokenizer.sep_id)
  pad, cls, sep = ids
  return dict(
    model_type="modernbert",
    vocab_size=config.vocab_size,
    hidden_size=config.hidden_size,
    intermediate_size=config.intermediate_size,
    num_hidden_layers=config.num_layers,
    num_attention_heads=config.num_heads,
    hidden_activation=config.hidden_act,
    classifier_activation=config.classifier_activation,
    max_position_embeddings=config.max_position_embeddings,
    initializer_range=config.initializer_range,
    norm_eps=config.layer_norm_eps,
    norm_bias=config.norm_bias,
    attention_bias=config.linear_bias,
    mlp_bias=config.linear_bias,
    classifier_bias=config.classifier_bias,
    classifier_pooling=config.classifier_pooling,
    classifier_dropout=config.classifier_dropout,
    decoder_bias=True,
    global_rope_theta=config.rope_theta,
    local_rope_theta=config.local_rope_theta or config.rope_theta,
    local_attention=config.local_attention,
    global_attn_every_n_layers=config.global_attention_every if config.local_attention else 1,
    embedding_dropout=config.hidden_dropout_prob,
    mlp_dropout=config.hidden_dropout_prob,
    attention_dropout=config.attention_dropout_prob,
    pad_token_id=pad,
    cls_token_id=cls,
    bos_token_id=cls,
    sep_token_id=sep,
    eos_token_id=sep,
  )


# Each family's (reader, writer); a writer takes the model's tokenizer too, whose special ids ModernBERT's config.json
# holds (the others' hold their family's fixed ids, or none).
_FAMILIES = {
  "bert": (_read_bert, _write_bert),
  "roberta": (_read_roberta, _write_roberta),
  "albert": (_read_albert, _write_albert),
  "electra": (_read_electra, _write_electra),
  "modernbert": (_read_modernbert, _write_modernbert),
}


def config_from_hf(fields: dict, where: str) -> BertConfig:
  """A Hugging Face `config.json` (as a dict) -> BertConfig, by its `model_type` (absent: BERT's); `where` names it
  in errors."""
  model_type = fields.get("model_type", "bert")
  if model_type not in _FAMILIES:
    raise ValueError(f"{where} has model_type={model_type!r}; bert_jax loads {tuple(_FAMILIES)}.")
  return _FAMILIES[model_type][0](fields, where)


def hf_config(config: BertConfig, architecture: str | None = None, tokenizer: Tokenizer | None = None) -> dict:
  """The Hugging Face `config.json` of `config` as the transformers class `architecture` (default: the family's
  pretraining model), with the special token ids of `tokenizer` where the family's config holds them (ModernBERT's)."""
  if config.model_type not in _FAMILIES:
    raise ValueError(
      f"model.model_type={config.model_type!r} has no Hugging Face config.json; bert_jax writes those of "
      f"{tuple(_FAMILIES)} (export this model as a bundle)."
    )
  architecture = architecture or hf_names.names(config, "").pretraining
  return dict(_FAMILIES[config.model_type][1](config, tokenizer), architectures=[architecture])
