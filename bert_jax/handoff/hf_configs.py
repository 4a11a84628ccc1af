"""Hugging Face `config.json` <-> BertConfig, per `model_type` (BERT, RoBERTa, ALBERT, ELECTRA).

Every family's `config.json` names the BERT fields as `bert_config.json` does (model/bert_config.py); beyond them:

  roberta  `pad_token_id`: positions start after it, so position_offset = pad_token_id + 1 (2 in every published
           RoBERTa, whose max_position_embeddings is then 514 for 512 tokens).
  albert   `embedding_size`; `num_hidden_groups` G and `inner_group_num`: G = 1 is layer_sharing "all", G =
           num_hidden_layers is "none", and inner_group_num must be 1. Partial sharing ("attention", "ffn") is
           written as G = num_layers groups holding copies of the shared tensors (it reads back as "none").
  electra  `embedding_size` (always written; 0 in bert_jax when it equals hidden_size, which has no projection).
           The discriminator and the generator each have their own config.json.

What a family's `config.json` cannot say (factorised embeddings in a BERT, sharing in a RoBERTa) is refused on
export, naming the field.
"""

from absl import logging

from bert_jax.handoff import hf_names
from bert_jax.model.bert_config import EXTENSION_FIELDS, BertConfig, from_bert_json, to_bert_json


def _bert_fields(config: BertConfig) -> dict:
  """The fields every family's config.json shares: BERT's, without bert_jax's extensions."""
  return {name: value for name, value in to_bert_json(config).items() if name not in EXTENSION_FIELDS}


def _refuse(config: BertConfig, family: str, **allowed) -> None:
  """Raises ValueError if a field of `config` has a value other than `allowed`'s, which `family` cannot write."""
  for name, value in allowed.items():
    if getattr(config, name) != value:
      raise ValueError(
        f"model.{name}={getattr(config, name)!r}: transformers' {family} has no such setting (it needs {value!r}); "
        "export this model as a bundle."
      )


def _read_bert(fields: dict, where: str) -> BertConfig:
  return from_bert_json(dict(fields, model_type="bert"), where)


def _write_bert(config: BertConfig) -> dict:
  _refuse(config, "BERT", embedding_size=0, layer_sharing="none", position_offset=0)
  return dict(_bert_fields(config), model_type="bert")


def _read_roberta(fields: dict, where: str) -> BertConfig:
  return from_bert_json(dict(fields, model_type="roberta", position_offset=fields.get("pad_token_id", 1) + 1), where)


def _write_roberta(config: BertConfig) -> dict:
  _refuse(config, "RoBERTa", embedding_size=0, layer_sharing="none")
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
  if fields.get("embedding_size") == fields.get("hidden_size"):
    raise ValueError(
      f"{where} has embedding_size = hidden_size = {fields['hidden_size']}; bert_jax projects the embeddings only "
      "when their width differs."
    )
  sharing = "all" if groups == 1 else "none"
  return from_bert_json(
    dict(fields, model_type="albert", hidden_act=fields.get("hidden_act", "gelu_new"), layer_sharing=sharing), where
  )


def _write_albert(config: BertConfig) -> dict:
  _refuse(config, "ALBERT", position_offset=0)
  if config.embedding_width == config.hidden_size:
    raise ValueError(
      f"model.embedding_size={config.embedding_size}: transformers' ALBERT always projects its embeddings to the "
      "hidden size; export needs an embedding_size other than hidden_size."
    )
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
    embedding_size=config.embedding_size,
    num_hidden_groups=groups,
    inner_group_num=1,
  )


def _read_electra(fields: dict, where: str) -> BertConfig:
  embedding_size = fields.get("embedding_size", 128)  # transformers' ElectraConfig default.
  if embedding_size == fields.get("hidden_size"):
    embedding_size = 0
  return from_bert_json(dict(fields, model_type="electra", embedding_size=embedding_size), where)


def _write_electra(config: BertConfig) -> dict:
  _refuse(config, "ELECTRA", position_offset=0, layer_sharing="none")
  return dict(_bert_fields(config), model_type="electra", embedding_size=config.embedding_width)


_FAMILIES = {
  "bert": (_read_bert, _write_bert),
  "roberta": (_read_roberta, _write_roberta),
  "albert": (_read_albert, _write_albert),
  "electra": (_read_electra, _write_electra),
}


def config_from_hf(fields: dict, where: str) -> BertConfig:
  """A Hugging Face `config.json` (as a dict) -> BertConfig, by its `model_type` (absent: BERT's); `where` names it
  in errors."""
  model_type = fields.get("model_type", "bert")
  if model_type not in _FAMILIES:
    raise ValueError(f"{where} has model_type={model_type!r}; bert_jax loads {tuple(_FAMILIES)}.")
  return _FAMILIES[model_type][0](fields, where)


def hf_config(config: BertConfig, architecture: str | None = None) -> dict:
  """The Hugging Face `config.json` of `config` as the transformers class `architecture` (default: the family's
  pretraining model)."""
  if config.model_type not in _FAMILIES:
    raise ValueError(
      f"model.model_type={config.model_type!r} has no Hugging Face config.json; bert_jax writes those of "
      f"{tuple(_FAMILIES)} (export this model as a bundle)."
    )
  architecture = architecture or hf_names.names(config, "").pretraining
  return dict(_FAMILIES[config.model_type][1](config), architectures=[architecture])
