"""Input data: sources of pretraining batches (numpy dicts, per host) in the layout of `bert_jax.pretraining_batch`.

TensorFlow (tf.data, corpus preparation) runs on the host CPU only. The `tensorflow` package (which tensorflow-text
requires by that name) has CUDA kernels and by default takes a visible GPU's memory at its first op: importing this
package hides GPUs from it, before any of its modules runs an op, so JAX keeps the accelerators.
"""

import tensorflow as tf

try:
  tf.config.set_visible_devices([], "GPU")
except RuntimeError:  # The caller's own TensorFlow already ran in this process: its device choice stands.
  pass
