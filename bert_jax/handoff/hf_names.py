"""Each model family's Hugging Face tensor names, as tables of (HF name, path in bert_jax params, kind); the kinds
(how a tensor's layout changes) are `hf_format._KINDS`.

`names(config, prefix)` gives the family of `config.model_type`: the encoder's entries (embeddings, the projection
of factorised embeddings, the layers), the pooler's, the pretraining heads' in groups that a file holds whole or
not at all, the tensors tied to others (which `save_pretrained` leaves out), and the architectures written. The
encoder's names start with `prefix`: the family's in its pretraining model (`bert.`, `roberta.`, `albert.`), empty
in a bare encoder's file (`BertModel`, ...).

  family   pretraining model (heads: `mlm`, `sentence`)     encoder           pooler in the pretraining model
  bert     BertForPreTraining (cls.predictions, cls.seq_relationship)    BertModel     yes
  roberta  RobertaForMaskedLM (lm_head; no sentence head)   RobertaModel      no
  albert   AlbertForPreTraining (predictions, sop_classifier)            AlbertModel   yes
  electra  ElectraForPreTraining (discriminator_predictions: `rtd`)      ElectraModel  no
           ElectraForMaskedLM, the generator (generator_predictions, generator_lm_head: `mlm`)
  modernbert  ModernBertForMaskedLM (head, decoder: `mlm`)  ModernBertModel   none (no pooler)

The fine-tuning heads' names (`task_heads`) are transformers' BERT and ModernBERT task models' (model/heads.py); the
other families' fine-tuned models have no Hugging Face names. A ModernBERT task model's prediction head has its masked
LM's names (`head.*`): `prediction_head_of_masked_lm` pairs the two by name, which is how a fine-tuning run starts
that head from a masked LM, as transformers' from_pretrained does.

ModernBERT's attention holds the query, key and value projections in one tensor (`Wqkv`, their rows in that
order): `fused` names its parts, which the conversion splits on loading and joins on export.

A layer shared across the model (`layer_sharing`) is written once per layer that uses it, as copies: BERT and
RoBERTa files have a place per layer, and ALBERT's groups hold "all" as one group and anything else as one group
per layer. A new family is one more function in `_FAMILIES`.
"""

import dataclasses

from bert_jax.model import stack
from bert_jax.model.bert_config import BertConfig

Entry = tuple[str, tuple[str, ...], str]  # (HF name, path in bert_jax params, kind of hf_format._KINDS)


@dataclasses.dataclass(frozen=True)
class Names:
  """One family's tensor names for one config and prefix."""

  encoder: tuple[Entry, ...]
  pooler: tuple[Entry, ...]
  heads: dict[str, tuple[Entry, ...]]  # Head group ("mlm", "sentence") -> its entries.
  tied: dict[str, str]  # Tied tensor -> the tensor it must equal (both HF names).
  pretraining: str  # The architecture of a file with the heads ...
  encoder_only: str  # ... and without.
  pooler_with_heads: bool  # Whether the pretraining architecture has the pooler.
  # Fine-tuning heads named as transformers' task models of this family (model/heads.py), by output layer (a file
  # holds its head when it holds that layer's weight; one of TASK_HEADS) -> the head's entries.
  task_heads: dict[str, tuple[Entry, ...]] = dataclasses.field(default_factory=dict)
  # The architecture of a file that holds one head group alone, when it is not `pretraining` (ELECTRA's generator).
  head_architectures: dict[str, str] = dataclasses.field(default_factory=dict)
  # A tensor of the file -> the names of its parts, stacked along its first axis in this order.
  fused: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
  # Linear layers (HF names, without `.weight`/`.bias`) that the family's transformers model always has and bert_jax's
  # model of this config does not: written as the identity, read only when they are (ALBERT's projection when
  # embedding_size equals hidden_size).
  identity: tuple[str, ...] = ()


def _layer_norm(hf: str, ours: tuple) -> list[Entry]:
  return [(f"{hf}.weight", ours + ("scale",), "copy"), (f"{hf}.bias", ours + ("bias",), "copy")]


def _dense(hf: str, ours: tuple) -> list[Entry]:
  return [(f"{hf}.weight", ours + ("kernel",), "linear"), (f"{hf}.bias", ours + ("bias",), "copy")]


def _heads_in(hf: str, ours: tuple) -> list[Entry]:
  return [(f"{hf}.weight", ours + ("kernel",), "split_heads"), (f"{hf}.bias", ours + ("bias",), "head_bias")]


def _heads_out(hf: str, ours: tuple) -> list[Entry]:
  return [(f"{hf}.weight", ours + ("kernel",), "merge_heads"), (f"{hf}.bias", ours + ("bias",), "copy")]


def _embeddings(prefix: str) -> list[Entry]:
  embed = ("bert", "embeddings")
  return [
    (f"{prefix}embeddings.word_embeddings.weight", embed + ("word_embeddings", "embedding"), "copy"),
    (f"{prefix}embeddings.position_embeddings.weight", embed + ("position_embeddings", "embedding"), "copy"),
    (f"{prefix}embeddings.token_type_embeddings.weight", embed + ("token_type_embeddings", "embedding"), "copy"),
    *_layer_norm(f"{prefix}embeddings.LayerNorm", embed + ("layer_norm",)),
  ]


# A post-norm layer's sub-modules (model/post_norm.py `sublayers`, then the path inside) -> HF module name and entry
# maker.
_BERT_LAYER = (
  (("attention", "query"), "attention.self.query", _heads_in),
  (("attention", "key"), "attention.self.key", _heads_in),
  (("attention", "value"), "attention.self.value", _heads_in),
  (("attention", "output"), "attention.output.dense", _heads_out),
  (("attention_layer_norm",), "attention.output.LayerNorm", _layer_norm),
  (("intermediate",), "intermediate.dense", _dense),
  (("output",), "output.dense", _dense),
  (("output_layer_norm",), "output.LayerNorm", _layer_norm),
)
_ALBERT_LAYER = (
  (("attention", "query"), "attention.query", _heads_in),
  (("attention", "key"), "attention.key", _heads_in),
  (("attention", "value"), "attention.value", _heads_in),
  (("attention", "output"), "attention.dense", _heads_out),
  (("attention_layer_norm",), "attention.LayerNorm", _layer_norm),
  (("intermediate",), "ffn", _dense),
  (("output",), "ffn_output", _dense),
  (("output_layer_norm",), "full_layer_layer_norm", _layer_norm),
)


def _layers(config: BertConfig, count: int, hf_layer, sublayers) -> list[Entry]:
  """Entries of layers 0..count-1: layer i's modules are under `hf_layer(i)` in the file, and wherever
  `layer_sharing` puts them in bert_jax's tree."""
  return [
    entry
    for i in range(count)
    for (name, *inside), hf, make in sublayers
    for entry in make(f"{hf_layer(i)}.{hf}", ("bert", *stack.sublayer_path(config, i, name), *inside))
  ]


def _tied(decoder: str, prefix: str, bias: str) -> dict[str, str]:
  """The MLM decoder, tied to the word embeddings, and its bias, tied to the output bias."""
  return {f"{decoder}.weight": f"{prefix}embeddings.word_embeddings.weight", f"{decoder}.bias": bias}


def _mlm(transform: str, layer_norm: str, bias: str) -> list[Entry]:
  return [
    *_dense(transform, ("mlm_transform",)),
    *_layer_norm(layer_norm, ("mlm_layer_norm",)),
    (bias, ("mlm_output_bias",), "copy"),
  ]


# The output layers of the fine-tuning heads (model/heads.py), named as transformers' BertFor{SequenceClassification,
# TokenClassification, MultipleChoice} and every ModernBERT task model (`classifier`) and BertForQuestionAnswering
# (`qa_outputs`); their width is the task's.
TASK_HEADS = ("classifier", "qa_outputs")


def _bert(config: BertConfig, prefix: str) -> Names:
  return Names(
    encoder=(
      *_embeddings(prefix),
      *_layers(config, config.num_layers, lambda i: f"{prefix}encoder.layer.{i}", _BERT_LAYER),
    ),
    pooler=tuple(_dense(f"{prefix}pooler.dense", ("bert", "pooler"))),
    heads={
      "mlm": tuple(
        _mlm("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm", "cls.predictions.bias")
      ),
      "sentence": tuple(_dense("cls.seq_relationship", ("nsp",))),
    },
    tied=_tied("cls.predictions.decoder", prefix, "cls.predictions.bias"),
    pretraining="BertForPreTraining",
    encoder_only="BertModel",
    pooler_with_heads=True,
    task_heads={head: tuple(_dense(head, (head,))) for head in TASK_HEADS},
  )


def _roberta(config: BertConfig, prefix: str) -> Names:
  return Names(
    encoder=(
      *_embeddings(prefix),
      *_layers(config, config.num_layers, lambda i: f"{prefix}encoder.layer.{i}", _BERT_LAYER),
    ),
    pooler=tuple(_dense(f"{prefix}pooler.dense", ("bert", "pooler"))),
    heads={"mlm": tuple(_mlm("lm_head.dense", "lm_head.layer_norm", "lm_head.bias"))},
    tied=_tied("lm_head.decoder", prefix, "lm_head.bias"),
    pretraining="RobertaForMaskedLM",
    encoder_only="RobertaModel",
    pooler_with_heads=False,
  )


def _albert(config: BertConfig, prefix: str) -> Names:
  groups = 1 if config.layer_sharing == "all" else config.num_layers
  group = lambda g: f"{prefix}encoder.albert_layer_groups.{g}.albert_layers.0"  # noqa: E731
  project, identity = f"{prefix}encoder.embedding_hidden_mapping_in", ()
  if config.embedding_width == config.hidden_size:  # transformers' AlbertModel has it even then; bert_jax does not.
    identity = (project,)
  return Names(
    encoder=(
      *_embeddings(prefix),
      *(() if identity else _dense(project, ("bert", "embeddings_project"))),
      *_layers(config, groups, group, _ALBERT_LAYER),
    ),
    identity=identity,
    pooler=tuple(_dense(f"{prefix}pooler", ("bert", "pooler"))),
    heads={
      "mlm": tuple(_mlm("predictions.dense", "predictions.LayerNorm", "predictions.bias")),
      "sentence": tuple(_dense("sop_classifier.classifier", ("nsp",))),
    },
    tied=_tied("predictions.decoder", prefix, "predictions.bias"),
    pretraining="AlbertForPreTraining",
    encoder_only="AlbertModel",
    pooler_with_heads=True,
  )


def _electra(config: BertConfig, prefix: str) -> Names:
  """The discriminator (ElectraForPreTraining: the `rtd` head) and the generator (ElectraForMaskedLM: the `mlm`
  head), each a model of its own config in a file of its own (model/electra.py `generator_as_masked_lm`)."""
  project = []
  if config.embedding_width != config.hidden_size:  # transformers' ElectraModel has it only then.
    project = _dense(f"{prefix}embeddings_project", ("bert", "embeddings_project"))
  return Names(
    encoder=(
      *_embeddings(prefix),
      *project,
      *_layers(config, config.num_layers, lambda i: f"{prefix}encoder.layer.{i}", _BERT_LAYER),
    ),
    pooler=(),
    heads={
      "rtd": (
        *_dense("discriminator_predictions.dense", ("rtd_dense",)),
        *_dense("discriminator_predictions.dense_prediction", ("rtd_prediction",)),
      ),
      "mlm": tuple(_mlm("generator_predictions.dense", "generator_predictions.LayerNorm", "generator_lm_head.bias")),
    },
    tied={"generator_lm_head.weight": f"{prefix}embeddings.word_embeddings.weight"},
    pretraining="ElectraForPreTraining",
    encoder_only="ElectraModel",
    pooler_with_heads=False,
    head_architectures={"mlm": "ElectraForMaskedLM"},
  )


def _modernbert(config: BertConfig, prefix: str) -> Names:
  """transformers' ModernBERT: norms and dense layers with a bias only where the config has them (`norm_bias`,
  `linear_bias`, the prediction head's `classifier_bias`; the decoder's output bias and a task's `classifier`
  always), no norm before layer 0's attention, the query, key and value in one `Wqkv`, the gated feed-forward's input
  and gate in one `Wi`. The prediction head `head` is the masked LM's transform (beside `decoder`) or a task
  model's own (beside `classifier`)."""

  def norm(hf: str, ours: tuple) -> list[Entry]:
    return _layer_norm(hf, ours) if config.norm_bias and config.norm == "layer_norm" else [_layer_norm(hf, ours)[0]]

  def linear(hf: str, ours: tuple, kinds=("linear", "copy"), bias: bool = config.linear_bias) -> list[Entry]:
    entries = [(f"{hf}.weight", ours + ("kernel",), kinds[0]), (f"{hf}.bias", ours + ("bias",), kinds[1])]
    return entries if bias else entries[:1]

  def layer(i: int) -> list[Entry]:
    hf, ours = f"{prefix}layers.{i}", ("bert", f"layer_{i}")
    attention = [
      entry
      for name, part in (("query", "Wq"), ("key", "Wk"), ("value", "Wv"))
      for entry in linear(f"{hf}.attn.{part}", ours + ("attention", name), ("split_heads", "head_bias"))
    ]
    return [
      *(norm(f"{hf}.attn_norm", ours + ("attention_norm",)) if i else []),
      *attention,
      *linear(f"{hf}.attn.Wo", ours + ("attention", "output"), ("merge_heads", "copy")),
      *norm(f"{hf}.mlp_norm", ours + ("feed_forward_norm",)),
      *linear(f"{hf}.mlp.Wi", ours + ("intermediate",), ("glu_in", "glu_bias")),
      *linear(f"{hf}.mlp.Wo", ours + ("output",)),
    ]

  fused = {
    f"{prefix}layers.{i}.attn.Wqkv.{kind}": tuple(
      f"{prefix}layers.{i}.attn.{part}.{kind}" for part in ("Wq", "Wk", "Wv")
    )
    for i in range(config.num_layers)
    for kind in (("weight", "bias") if config.linear_bias else ("weight",))
  }
  embedding = f"{prefix}embeddings.tok_embeddings.weight"
  return Names(
    encoder=(
      (embedding, ("bert", "embeddings", "word_embeddings", "embedding"), "copy"),
      *norm(f"{prefix}embeddings.norm", ("bert", "embeddings", "layer_norm")),
      *(entry for i in range(config.num_layers) for entry in layer(i)),
      *norm(f"{prefix}final_norm", ("bert", "final_norm")),
    ),
    pooler=(),
    heads={
      "mlm": (
        *linear("head.dense", ("mlm_transform",), bias=config.classifier_bias),
        *norm("head.norm", ("mlm_layer_norm",)),
        ("decoder.bias", ("mlm_output_bias",), "copy"),
      )
    },
    tied={"decoder.weight": embedding},
    pretraining="ModernBertForMaskedLM",
    encoder_only="ModernBertModel",
    pooler_with_heads=False,
    task_heads={
      "classifier": (
        *linear("head.dense", ("head", "dense"), bias=config.classifier_bias),
        *norm("head.norm", ("head", "norm")),
        *_dense("classifier", ("classifier",)),
      )
    },
    fused=fused,
  )


_FAMILIES = {"bert": _bert, "roberta": _roberta, "albert": _albert, "electra": _electra, "modernbert": _modernbert}
# The encoder's prefix in each family's pretraining model.
PREFIXES = {"bert": "bert.", "roberta": "roberta.", "albert": "albert.", "electra": "electra.", "modernbert": "model."}


def prediction_head_of_masked_lm(config: BertConfig) -> dict[tuple[str, ...], tuple[str, ...]]:
  """The task models' parameters that are the masked LM's in `config.model_type`'s family, as transformers'
  from_pretrained of a masked LM's file into a task model loads them (their Hugging Face names and layouts are the
  same: ModernBERT's `head.dense`, `head.norm`): path in the pretraining model's params -> path in the task model's
  (e.g. ("mlm_transform", "kernel") -> ("head", "dense", "kernel")). Empty for a family whose task heads share none
  (BERT's: `classifier`, `qa_outputs`)."""
  family = names(config, "")
  masked_lm = {(hf, kind): ours for hf, ours, kind in family.heads.get("mlm", ())}
  return {
    masked_lm[hf, kind]: ours
    for entries in family.task_heads.values()
    for hf, ours, kind in entries
    if (hf, kind) in masked_lm
  }


def names(config: BertConfig, prefix: str) -> Names:
  """The tensor names of `config.model_type`'s family, the encoder's under `prefix` (PREFIXES', or empty). Raises
  ValueError for a family with no Hugging Face names."""
  if config.model_type not in _FAMILIES:
    raise ValueError(
      f"model.model_type={config.model_type!r} has no Hugging Face tensor names; bert_jax names {tuple(_FAMILIES)}'s "
      "(export this model as a bundle)."
    )
  return _FAMILIES[config.model_type](config, prefix)
