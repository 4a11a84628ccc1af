"""TensorFlow for the host CPU only: bert_jax's TensorFlow (tf.data, corpus preparation, TensorBoard files, the
compiled WordPiece tokenizer) is imported through this module.

The `tensorflow` package (which tensorflow-text requires by that name) has CUDA kernels and by default takes a
visible GPU's memory at its first op: importing this module hides GPUs from it, before any op, so JAX keeps the
accelerators. The import's native start-up lines are left out of the console (see console.py).
"""

import sys

from bert_jax import console

with console.native_noise_left_out():
  import tensorflow as tf

  try:
    tf.config.set_visible_devices([], "GPU")
  except RuntimeError:  # The caller's own TensorFlow already ran in this process: its device choice stands.
    pass


def text():
  """The tensorflow_text module (imported on first use: only the compiled WordPiece tokenizer needs it)."""
  if "tensorflow_text" not in sys.modules:
    with console.native_noise_left_out():
      import tensorflow_text  # noqa: F401 - imported for sys.modules.
  return sys.modules["tensorflow_text"]
