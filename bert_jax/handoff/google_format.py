"""The original Google BERT checkpoint format (google-research/bert) <-> Hugging Face tensor names.

A Google BERT directory holds `bert_config.json`, a TF1 checkpoint `bert_model.ckpt.{index,data-*}` with
variable names such as `bert/encoder/layer_0/attention/self/query/kernel`, `cls/predictions/output_bias` and
`cls/seq_relationship/output_weights`, and `vocab.txt`. This module renames those variables to and from the
Hugging Face names that `hf_format` maps onto bert_jax params (TF kernels are [in, out], torch weights
[out, in]; `output_weights` is stored [out, in] in both), and reads and writes the checkpoint with TensorFlow's
own reader and `SaveV2`. TensorFlow's file system does not take part: files pass through a local directory and
are copied with `etils.epath` (see paths.py), so `gs://` takes the same code as a local path.
"""

import re
import tempfile
from collections.abc import Mapping

import numpy as np
from etils import epath

from bert_jax import paths

CONFIG = "bert_config.json"
CHECKPOINT = "bert_model.ckpt"
# Variables a Google checkpoint may hold besides the model's: optimizer slots and counters.
_OPTIMIZER_VARIABLES = re.compile(r"(/adam_[mv]$|^global_step$|^(good|bad)_steps$|^loss_scale$)")
# Names that do not follow the mechanical rule below.
_SPECIAL = {
  "cls.predictions.bias": "cls/predictions/output_bias",
  "cls.seq_relationship.weight": "cls/seq_relationship/output_weights",
  "cls.seq_relationship.bias": "cls/seq_relationship/output_bias",
}
_SPECIAL_BACK = {google: hf for hf, google in _SPECIAL.items()}


def google_name(hf_name: str) -> tuple[str, bool]:
  """A Hugging Face tensor name -> (the TF1 variable name, whether the tensor is transposed between them)."""
  if hf_name in _SPECIAL:
    return _SPECIAL[hf_name], False
  name = re.sub(r"\.layer\.(\d+)\.", r".layer_\1.", hf_name).replace(".", "/")
  if "/LayerNorm/" in name:
    return name.replace("/weight", "/gamma").replace("/bias", "/beta"), False
  if re.search(r"_embeddings/weight$", name):
    return name.removesuffix("/weight"), False
  if name.endswith("/weight"):
    return name.removesuffix("/weight") + "/kernel", True
  return name, False


def hf_name(google: str) -> tuple[str, bool]:
  """A TF1 variable name -> (the Hugging Face tensor name, whether the tensor is transposed between them)."""
  if google in _SPECIAL_BACK:
    return _SPECIAL_BACK[google], False
  name = re.sub(r"/layer_(\d+)/", r"/layer/\1/", google).replace("/", ".")
  if name.endswith((".gamma", ".beta")):
    return name.removesuffix(".gamma").removesuffix(".beta") + (".weight" if name.endswith("gamma") else ".bias"), False
  if name.endswith("_embeddings"):
    return name + ".weight", False
  if name.endswith(".kernel"):
    return name.removesuffix(".kernel") + ".weight", True
  return name, False


def checkpoint_prefix(directory: epath.Path) -> str:
  """The one TF1 checkpoint in `directory` (`<prefix>.index`), by its file name prefix."""
  indexes = sorted(path.name for path in directory.glob("*.index"))
  if len(indexes) != 1:
    raise FileNotFoundError(
      f"{directory} should hold one TF1 checkpoint (<prefix>.index + <prefix>.data-*), found {indexes or 'none'}."
    )
  return indexes[0].removesuffix(".index")


def is_google_dir(directory: epath.Path) -> bool:
  return (directory / CONFIG).exists() and any(directory.glob("*.index"))


def read_checkpoint(directory) -> dict[str, np.ndarray]:
  """The model variables of the TF1 checkpoint in `directory` (local or gs://), as Hugging Face-named float32
  numpy tensors (optimizer slots and counters left out)."""
  from bert_jax.tensorflow_cpu import tf  # Deferred: TensorFlow's checkpoint reader is only needed for this format.

  prefix = checkpoint_prefix(epath.Path(directory))
  with paths.local_copy(directory) as local:
    reader = tf.train.load_checkpoint(f"{local}/{prefix}")
    tensors = {}
    for name in sorted(reader.get_variable_to_shape_map()):
      if _OPTIMIZER_VARIABLES.search(name):
        continue
      hf, transposed = hf_name(name)
      value = np.asarray(reader.get_tensor(name), np.float32)
      tensors[hf] = value.T if transposed else value
  return tensors


def write_checkpoint(tensors: Mapping[str, np.ndarray], directory) -> None:
  """Writes Hugging Face-named tensors as `<directory>/bert_model.ckpt.{index,data-00000-of-00001}`, with the
  original BERT's variable names (TensorFlow's `SaveV2`: what `tf.train.load_checkpoint` and
  `transformers`' `load_tf_weights_in_bert` read)."""
  from bert_jax.tensorflow_cpu import tf

  names, values = [], []
  for hf, value in tensors.items():
    google, transposed = google_name(hf)
    names.append(google)
    values.append(tf.constant(np.ascontiguousarray(value.T if transposed else value, np.float32)))
  with tempfile.TemporaryDirectory() as local:
    tf.raw_ops.SaveV2(
      prefix=f"{local}/{CHECKPOINT}", tensor_names=names, shape_and_slices=[""] * len(names), tensors=values
    )
    paths.copy_tree(local, directory)
