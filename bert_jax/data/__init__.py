"""Input data: sources of pretraining batches (numpy dicts, per host) in the layout of `bert_jax.pretraining_batch`."""
