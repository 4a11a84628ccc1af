"""Input data: sources of pretraining batches (numpy dicts, per host) in the layout of
`bert_jax.data.pretraining_batch`.

TensorFlow (tf.data, corpus preparation) runs on the host CPU only: the package imports it through
`bert_jax.tensorflow_cpu`, which hides GPUs from it before any of its modules runs an op.
"""

from bert_jax import tensorflow_cpu  # noqa: F401 - imported first, for its effect on TensorFlow.
