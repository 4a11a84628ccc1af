"""Input data: sources of pretraining batches (numpy dicts, per host) in the layout of
`bert_jax.data.pretraining_batch`.

TensorFlow (tf.data, corpus preparation) runs on the host CPU only: each module that uses it imports it through
`bert_jax.tensorflow_cpu`, which hides GPUs from it before any of its modules runs an op. Importing this package, or
a light module of it (instances, windows, readers, the tokenizers), imports no TensorFlow.
"""
