"""The model's own configuration: a frozen dataclass and the published size presets.

The model never sees an ml_collections ConfigDict; `model_config` (below) turns a run config's `model` into a
`BertConfig` (a source's comes from its `bert_config.json`, `config.json` or saved config: `handoff/formats.py`).
"""

import dataclasses

import jax.numpy as jnp

from bert_jax.model import architectures, remat

COMPUTE_DTYPES = ("float32", "bfloat16")
# The sizes that must be positive integers.
_POSITIVE_SIZES = (
  "vocab_size",
  "hidden_size",
  "num_layers",
  "num_heads",
  "intermediate_size",
  "max_position_embeddings",
  "type_vocab_size",
)
# model.vocab_size's largest value: 2**24 = 16,777,216, 18 times the largest vocabularies in use (XLM-V's 901,629;
# Gemma's 256,000, mT5's 250,112). Ids are int32 (the batch contract), so 2**31 is a hard ceiling, but already at
# 2**24 the embedding table of a 768-wide model is 48 GiB in float32, and one masked position's logits 64 MiB: a
# larger value is a typo, which JAX would meet as an OverflowError deep in initialisation, naming no key.
MAX_VOCAB_SIZE = 2**24
# The fields that fix the parameters' shapes: a checkpoint loads into any config that agrees on these.
SIZE_FIELDS = (*_POSITIVE_SIZES, "embedding_size", "layer_sharing")
# The fields that change what the same parameters compute: a checkpoint of another family (a RoBERTa into a BERT
# config) has the shapes but not the function. The RoPE bases are not among them: raising them is how a ModernBERT's
# context is extended (phase 2 continues phase 1's parameters at a new base).
ARCHITECTURE_FIELDS = (
  "model_type",
  "hidden_act",
  "position_offset",
  "norm",
  "linear_bias",
  "norm_bias",
  "local_attention",
  "global_attention_every",
  "classifier_activation",
  "classifier_bias",
)
# model.hidden_act: "gelu" is BERT's exact (erf) form; "gelu_new" the tanh approximation (ALBERT's); "silu" (swish)
# gates NeoBERT's SwiGLU feed-forward (a "glu" feed-forward with "gelu" is ModernBERT's GeGLU).
ACTIVATIONS = ("gelu", "gelu_new", "silu")
# model.norm: the normalisation every norm of the model applies: LayerNorm (BERT, ModernBERT) or RMSNorm (NeoBERT).
NORMS = ("layer_norm", "rms_norm")
# model.classifier_pooling: what ModernBERT's sequence and choice heads read of the last hidden states: the first
# token's, or the mean over real tokens (transformers' ModernBertConfig.classifier_pooling).
CLASSIFIER_POOLING = ("cls", "mean")
# ModernBERT's task-head fields (model/task_heads.py): BERT's heads have no pooling, prediction head or dropout of
# their own. A config may leave them unset (None): `from_fields` takes them from a source (a fine-tuning run's
# `init_from`), as transformers' from_pretrained reads them from the source's config.json.
PREDICTION_HEAD_FIELDS = ("classifier_pooling", "classifier_activation", "classifier_bias", "classifier_dropout")
# The encoder's dropout: a fine-tuning config leaves it unset (None) to take the source's, as from_pretrained does
# (BERT's, RoBERTa's and ELECTRA's 0.1; ModernBERT's and ALBERT v2's 0).
DROPOUT_FIELDS = ("hidden_dropout_prob", "attention_dropout_prob")
# model.layer_sharing: which parameters every layer shares (ALBERT): none, all, or the attention or the
# feed-forward sub-layer (with its LayerNorm) only.
LAYER_SHARING = ("none", "all", "attention", "ffn")
# What the backward pass keeps of each layer's activations: the policies of model/remat.py, by name.
REMAT_POLICIES = remat.POLICY_NAMES
# model.attention: the kernels of bert_jax/model/attention.py.
ATTENTION_KINDS = ("xla", "splash", "cudnn", "auto")


@dataclasses.dataclass(frozen=True)
class BertConfig:
  """Hyperparameters of a BERT encoder, named as in the original `bert_config.json`."""

  vocab_size: int = 30522
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  intermediate_size: int = 3072
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  hidden_dropout_prob: float = 0.1
  attention_dropout_prob: float = 0.1
  initializer_range: float = 0.02
  layer_norm_eps: float = 1e-12
  # Activations and matmuls run in this dtype; parameters stay float32, softmax and loss run in float32.
  dtype: str = "float32"
  # Rematerialisation of each transformer layer in the backward pass: one of REMAT_POLICIES.
  remat: str = "none"
  # One `nn.scan` over stacked layer parameters (compiles one layer, not num_layers) instead of a Python loop.
  # The parameter layouts differ (`layers` with a leading layer axis vs `layer_{i}`); `param_layout` converts.
  scan_layers: bool = False
  # The attention kernel, one of ATTENTION_KINDS: "xla" (the reference), "splash" (TPU), "cudnn" (GPU) or "auto".
  attention: str = "xla"
  # The family, a key of model/architectures.py's ARCHITECTURES: its composition of parts, and the names of its
  # tensors in Hugging Face files.
  model_type: str = "bert"
  # Width of the embedding tables (ALBERT's factorisation, projected to hidden_size); 0: hidden_size.
  embedding_size: int = 0
  # The feed-forward and masked-LM activation, one of ACTIVATIONS.
  hidden_act: str = "gelu"
  # Added to every real token's position (RoBERTa: 2, its padding index + 1); padding takes position_offset - 1.
  position_offset: int = 0
  # Which parameters the layers share, one of LAYER_SHARING.
  layer_sharing: str = "none"
  # The normalisation of every norm (one of NORMS), and whether norms and dense layers have biases (BERT: both;
  # ModernBERT: neither, but the masked-LM decoder's output bias).
  norm: str = "layer_norm"
  norm_bias: bool = True
  linear_bias: bool = True
  # Rotary positions (RoPE, Su et al. 2021) on queries and keys for the families whose layers attend with them
  # (model/attention_patterns.py): the base of global layers, and of local ones (0: rope_theta). ModernBERT: 10,000 in
  # every layer in phase 1; context extension raises the global layers' to 160,000 (the released model's). 0: no
  # rotary positions (BERT's position table).
  rope_theta: float = 0.0
  local_rope_theta: float = 0.0
  # Local attention (the "local_global" pattern): a local layer's query sees the keys within local_attention // 2
  # tokens on each side (ModernBERT: 128, so 64 each way); every global_attention_every-th layer (layer 0 first)
  # attends globally.
  local_attention: int = 0
  global_attention_every: int = 1
  # ModernBERT's prediction head (transformers' ModernBertPredictionHead: dense H -> H, activation, norm), which its
  # masked LM and its task models (model/task_heads.py) put on the encoder: the dense layer's activation (one of
  # ACTIVATIONS) and bias. Its task models pool by `classifier_pooling` (one of CLASSIFIER_POOLING; sequence and
  # choice heads) and drop out `classifier_dropout` before the output layer. transformers' defaults; BERT's families
  # read none of them (their heads are BERT's).
  classifier_activation: str = "gelu"
  classifier_bias: bool = False
  classifier_pooling: str = "cls"
  classifier_dropout: float = 0.0

  def __post_init__(self):
    for name in _POSITIVE_SIZES:
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"model.{name} must be a positive integer, got {value!r}.")
    if self.vocab_size > MAX_VOCAB_SIZE:
      raise ValueError(
        f"model.vocab_size={self.vocab_size} must be in [1, {MAX_VOCAB_SIZE}] (2**24, 18 times the largest "
        "vocabularies in use: bert_config.MAX_VOCAB_SIZE)."
      )
    if self.hidden_size % self.num_heads:
      raise ValueError(
        f"model.hidden_size={self.hidden_size} is not divisible by model.num_heads={self.num_heads}; "
        f"each head needs hidden_size / num_heads dimensions."
      )
    for name in ("initializer_range", "layer_norm_eps"):
      value = getattr(self, name)
      if not value > 0:  # NaN too.
        raise ValueError(f"model.{name}={value} must be positive.")
    for name in ("hidden_dropout_prob", "attention_dropout_prob", "classifier_dropout"):
      value = getattr(self, name)
      if not 0.0 <= value < 1.0:
        raise ValueError(f"model.{name} must be in [0, 1), got {value!r}.")
    if self.dtype not in COMPUTE_DTYPES:
      raise ValueError(f"model.dtype={self.dtype!r} is not supported; expected one of {COMPUTE_DTYPES}.")
    if self.remat not in REMAT_POLICIES:
      raise ValueError(f"model.remat={self.remat!r} is not supported; expected one of {REMAT_POLICIES}.")
    if self.attention not in ATTENTION_KINDS:
      raise ValueError(f"model.attention={self.attention!r} is not supported; expected one of {ATTENTION_KINDS}.")
    if self.attention in ("splash", "cudnn") and self.attention_dropout_prob > 0:
      raise ValueError(
        f"model.attention={self.attention!r} has no dropout on attention probabilities, and "
        f"model.attention_dropout_prob={self.attention_dropout_prob}: set model.attention_dropout_prob=0 (as "
        "MosaicBERT and ModernBERT train) or model.attention='xla' ('auto' takes the kernel only without it)."
      )
    if self.attention == "cudnn" and self.dtype != "bfloat16":
      raise ValueError(f"model.attention='cudnn' runs in bfloat16 only; model.dtype={self.dtype!r}.")
    if not isinstance(self.scan_layers, bool):
      raise ValueError(f"model.scan_layers must be True or False, got {self.scan_layers!r}.")
    family = architectures.architecture(self.model_type)  # A ValueError naming the families there are.
    if family.part("embeddings").name == "token" and not self.rope_theta:
      raise ValueError(
        f"model.model_type={self.model_type!r} has no position table: its layers take rotary positions, and "
        "model.rope_theta=0 gives none; set it (ModernBERT: 160000)."
      )
    for name, allowed in (
      ("hidden_act", ACTIVATIONS),
      ("layer_sharing", LAYER_SHARING),
      ("classifier_activation", ACTIVATIONS),
      ("classifier_pooling", CLASSIFIER_POOLING),
    ):
      if getattr(self, name) not in allowed:
        raise ValueError(f"model.{name}={getattr(self, name)!r} is not supported; expected one of {allowed}.")
    for name in ("embedding_size", "position_offset", "local_attention"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 0:
        raise ValueError(f"model.{name} must be a non-negative integer, got {value!r}.")
    if not isinstance(self.global_attention_every, int) or self.global_attention_every < 1:
      raise ValueError(f"model.global_attention_every must be a positive integer, got {self.global_attention_every!r}.")
    if self.norm not in NORMS:
      raise ValueError(f"model.norm={self.norm!r} is not supported; expected one of {NORMS}.")
    for name in ("norm_bias", "linear_bias", "classifier_bias"):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(f"model.{name} must be True or False, got {getattr(self, name)!r}.")
    for name in ("rope_theta", "local_rope_theta"):
      value = getattr(self, name)
      if not (isinstance(value, (int, float)) and value >= 0):  # NaN too.
        raise ValueError(f"model.{name}={value!r} must be 0 (no rotary positions) or a positive base, e.g. 10000.")
    if self.rope_theta and self.head_dim % 2:
      raise ValueError(
        f"model.rope_theta={self.rope_theta} rotates pairs of each head's dimensions, and hidden_size / num_heads = "
        f"{self.head_dim} is odd."
      )
    if self.scan_layers and self.layer_sharing in ("attention", "ffn"):
      raise ValueError(
        f"model.layer_sharing={self.layer_sharing!r} shares a part of each layer, which a scan over layers cannot "
        "express: set model.scan_layers=False (or layer_sharing 'none' or 'all')."
      )

  @property
  def max_sequence_length(self) -> int:
    """The longest sequence the position table covers: beyond it, positions have no embedding."""
    return self.max_position_embeddings - self.position_offset

  @property
  def max_sequence_text(self) -> str:
    """`max_sequence_length` as errors name it, by the keys it comes from."""
    text = f"model.max_position_embeddings={self.max_position_embeddings}"
    return f"{text} - model.position_offset={self.position_offset}" if self.position_offset else text

  @property
  def architecture(self) -> architectures.Architecture:
    """The family's composition of parts, by name (model/architectures.py)."""
    return architectures.architecture(self.model_type)

  @property
  def title(self) -> str:
    """The family and its sizes, as run headers and dry runs name the model: e.g. "ModernBERT L22 H768 A12"."""
    return f"{self.architecture.name} L{self.num_layers} H{self.hidden_size} A{self.num_heads}"

  @property
  def embedding_width(self) -> int:
    """The width of the embedding tables: embedding_size, or hidden_size when it is 0."""
    return self.embedding_size or self.hidden_size

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def compute_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.dtype)


def from_fields(fields: dict, source: BertConfig | None = None) -> BertConfig:
  """`fields` (`config.model` as a dict, or the model a checkpoint recorded) as a BertConfig, which checks them; the
  PREDICTION_HEAD_FIELDS and DROPOUT_FIELDS they leave unset (None) are `source`'s, else BertConfig's (transformers'
  defaults)."""
  values = dict(fields)
  for name in PREDICTION_HEAD_FIELDS + DROPOUT_FIELDS:
    if values.get(name) is None:
      values[name] = getattr(source or BertConfig(), name)
  return BertConfig(**values)


def model_config(config, source: BertConfig | None = None) -> BertConfig:
  """A run config's `model` section as a BertConfig, which checks its values; the prediction-head fields it leaves
  unset are `source`'s, else transformers' defaults (`from_fields`)."""
  return from_fields(config.model.to_dict(), source)


def check_fine_tunable(model: BertConfig, where: str = "") -> None:
  """Raises ValueError naming the field (after `where`, the source it came from) that the family's fine-tuning heads
  (model/heads.py, by `Architecture.task_head`) cannot honour: BERT's ("bert": dropout `hidden_dropout_prob` and a
  dense layer on the pooler's output or on every token) read none of ModernBERT's `classifier_*`, so a value other
  than the default is refused rather than ignored."""
  if model.architecture.task_head != "bert":
    return
  default = BertConfig()
  for name in PREDICTION_HEAD_FIELDS:
    if getattr(model, name) != getattr(default, name):
      raise ValueError(
        f"{where}model.{name}={getattr(model, name)!r} sets ModernBERT's task heads, and model.model_type="
        f"{model.model_type!r} fine-tunes with BERT's (dropout and a dense layer on the pooler's [CLS] output, or on "
        f"every token), which read none of them: leave it at {getattr(default, name)!r}."
      )


def generator_config(discriminator: BertConfig, hidden_fraction: float, layers_fraction: float) -> BertConfig:
  """ELECTRA's generator for `discriminator`, as the official `get_generator_config` sizes it: hidden
  round(H * hidden_fraction), round(L * layers_fraction) layers, a 4x feed-forward, 64-wide heads (at least one); the
  embeddings (width, vocabulary, positions) are the discriminator's, which it shares. Raises ValueError naming the
  fraction that gives no valid size."""
  hidden = round(discriminator.hidden_size * hidden_fraction)
  num_layers = round(discriminator.num_layers * layers_fraction)
  heads = max(1, hidden // 64)
  for name, fraction, size, of in (
    ("generator_hidden_fraction", hidden_fraction, hidden, f"hidden_size={discriminator.hidden_size}"),
    ("generator_layers_fraction", layers_fraction, num_layers, f"num_layers={discriminator.num_layers}"),
  ):
    if size < 1:
      raise ValueError(f"electra.{name}={fraction} of model.{of} rounds to {size}: the generator needs at least 1.")
  if hidden % heads:
    raise ValueError(
      f"electra.generator_hidden_fraction={hidden_fraction} gives a generator hidden size of {hidden}, which its "
      f"{heads} heads (hidden // 64) do not divide; pick a fraction that gives a multiple of 64 (or less than 128)."
    )
  return dataclasses.replace(
    discriminator,
    hidden_size=hidden,
    num_layers=num_layers,
    num_heads=heads,
    intermediate_size=4 * hidden,
    embedding_size=0 if discriminator.embedding_width == hidden else discriminator.embedding_width,
  )


def electra_generator(config, discriminator: BertConfig) -> BertConfig:
  """ELECTRA's generator for `discriminator` from `config["electra"]`'s fractions (`config` a config, or a
  checkpoint's saved config as a dict); raises ValueError naming a fraction outside (0, 1] or one that gives no
  valid size."""
  settings = config["electra"]
  fractions = [settings[name] for name in ("generator_hidden_fraction", "generator_layers_fraction")]
  for name, value in zip(("generator_hidden_fraction", "generator_layers_fraction"), fractions, strict=True):
    if not 0 < value <= 1:
      raise ValueError(f"electra.{name}={value} must be in (0, 1].")
  return generator_config(discriminator, *fractions)


def _size(num_layers: int, hidden_size: int) -> dict:
  # The BERT recipe: 64-dimensional heads and a 4x feed-forward.
  return dict(
    num_layers=num_layers, hidden_size=hidden_size, num_heads=hidden_size // 64, intermediate_size=4 * hidden_size
  )


# The 24 BERT miniatures (Turc et al. 2019), named `L{layers}_H{hidden}`, plus the paper's two sizes.
PRESETS = {
  f"L{layers}_H{hidden}": _size(layers, hidden) for layers in (2, 4, 6, 8, 10, 12) for hidden in (128, 256, 512, 768)
}
PRESETS.update(
  {
    "tiny": PRESETS["L2_H128"],  # BERT-Tiny: tests and the demo.
    "mini": PRESETS["L4_H256"],
    "small": PRESETS["L4_H512"],
    "medium": PRESETS["L8_H512"],
    "base": _size(12, 768),
    "large": _size(24, 1024),
  }
)


def preset(name: str) -> dict:
  """The size fields (layers, hidden, heads, intermediate) of a named preset, for `config.model.update`."""
  if name not in PRESETS:
    raise ValueError(f"Unknown model preset {name!r}; expected one of {sorted(PRESETS)}.")
  return dict(PRESETS[name])


# The original `bert_config.json` field names (google-research/bert), which Hugging Face's `config.json` extends.
_BERT_JSON_NAMES = {
  "vocab_size": "vocab_size",
  "hidden_size": "hidden_size",
  "num_layers": "num_hidden_layers",
  "num_heads": "num_attention_heads",
  "intermediate_size": "intermediate_size",
  "max_position_embeddings": "max_position_embeddings",
  "type_vocab_size": "type_vocab_size",
  "hidden_dropout_prob": "hidden_dropout_prob",
  "attention_dropout_prob": "attention_probs_dropout_prob",
  "initializer_range": "initializer_range",
}


# bert_jax's fields beyond the original's: a bundle's `bert_config.json` names those that differ from BERT's, so
# that a BERT's file is the original format and a RoBERTa's, ALBERT's or ModernBERT's still says what it is.
EXTENSION_FIELDS = (
  "model_type",
  "embedding_size",
  "position_offset",
  "layer_sharing",
  "norm",
  "norm_bias",
  "linear_bias",
  "rope_theta",
  "local_rope_theta",
  "local_attention",
  "global_attention_every",
  "classifier_activation",
  "classifier_bias",
  "classifier_pooling",
  "classifier_dropout",
)


def to_bert_json(config: BertConfig) -> dict:
  """The architecture in the original `bert_config.json` names (plus `layer_norm_eps`, which Hugging Face reads;
  the original code fixes it at 1e-12), and the fields of `EXTENSION_FIELDS` that differ from BERT's."""
  fields = {original: getattr(config, ours) for ours, original in _BERT_JSON_NAMES.items()}
  bert = BertConfig()
  extensions = {
    name: getattr(config, name) for name in EXTENSION_FIELDS if getattr(config, name) != getattr(bert, name)
  }
  return dict(fields, hidden_act=config.hidden_act, layer_norm_eps=config.layer_norm_eps, **extensions)


def from_bert_json(fields: dict, where: str) -> BertConfig:
  """A `bert_config.json` (Google's, or a bert_jax bundle's with the fields `to_bert_json` adds) or a Hugging Face
  BERT `config.json`, as a dict -> BertConfig; `where` names it in errors."""
  missing = [name for name in _BERT_JSON_NAMES.values() if name not in fields]
  if missing:
    raise ValueError(f"{where} lacks {missing}; a BERT config names {sorted(_BERT_JSON_NAMES.values())}.")
  if fields.get("position_embedding_type", "absolute") != "absolute":
    raise ValueError(
      f"{where} has position_embedding_type={fields['position_embedding_type']!r}; BERT's is 'absolute'."
    )
  values = {ours: fields[original] for ours, original in _BERT_JSON_NAMES.items()}
  values.update({name: fields[name] for name in EXTENSION_FIELDS if name in fields})
  try:
    return BertConfig(
      **values, hidden_act=fields.get("hidden_act", "gelu"), layer_norm_eps=fields.get("layer_norm_eps", 1e-12)
    )
  except ValueError as error:
    raise ValueError(f"{where}: {error}") from None
