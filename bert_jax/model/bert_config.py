"""The model's own configuration: a frozen dataclass and the published size presets.

The model never sees an ml_collections ConfigDict; `train/loop.py` turns `config.model` into a `BertConfig`.
"""

import dataclasses

import jax.numpy as jnp

COMPUTE_DTYPES = ("float32", "bfloat16")
# The fields that fix the parameters' shapes: a checkpoint loads into any config that agrees on these.
SIZE_FIELDS = (
  "vocab_size",
  "hidden_size",
  "num_layers",
  "num_heads",
  "intermediate_size",
  "max_position_embeddings",
  "type_vocab_size",
)
# What the backward pass keeps of each layer's activations: everything ("none": no rematerialisation), nothing
# but the layer's input ("full": the layer is recomputed), or the matmul outputs ("save_dots").
REMAT_POLICIES = ("none", "full", "save_dots")
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

  def __post_init__(self):
    for name in SIZE_FIELDS:
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"model.{name} must be a positive integer, got {value!r}.")
    if self.hidden_size % self.num_heads:
      raise ValueError(
        f"model.hidden_size={self.hidden_size} is not divisible by model.num_heads={self.num_heads}; "
        f"each head needs hidden_size / num_heads dimensions."
      )
    for name in ("hidden_dropout_prob", "attention_dropout_prob"):
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

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def compute_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.dtype)


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


def to_bert_json(config: BertConfig) -> dict:
  """The architecture in the original `bert_config.json` names (plus `layer_norm_eps`, which Hugging Face reads;
  the original code fixes it at 1e-12)."""
  fields = {original: getattr(config, ours) for ours, original in _BERT_JSON_NAMES.items()}
  return dict(fields, hidden_act="gelu", layer_norm_eps=config.layer_norm_eps)


def from_bert_json(fields: dict, where: str) -> BertConfig:
  """A `bert_config.json` or Hugging Face `config.json` (as a dict) -> BertConfig; `where` names it in errors."""
  missing = [name for name in _BERT_JSON_NAMES.values() if name not in fields]
  if missing:
    raise ValueError(f"{where} lacks {missing}; a BERT config names {sorted(_BERT_JSON_NAMES.values())}.")
  if fields.get("hidden_act", "gelu") != "gelu":
    raise ValueError(f"{where} has hidden_act={fields['hidden_act']!r}; bert_jax implements BERT's exact 'gelu'.")
  if fields.get("model_type", "bert") != "bert":
    raise ValueError(f"{where} has model_type={fields['model_type']!r}; bert_jax loads BERT ('bert') models.")
  if fields.get("position_embedding_type", "absolute") != "absolute":
    raise ValueError(
      f"{where} has position_embedding_type={fields['position_embedding_type']!r}; BERT's is 'absolute'."
    )
  values = {ours: fields[original] for ours, original in _BERT_JSON_NAMES.items()}
  return BertConfig(**values, layer_norm_eps=fields.get("layer_norm_eps", 1e-12))
