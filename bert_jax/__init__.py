"""bert_jax: pretrain BERT-family encoders with JAX/Flax and hand the result to fine-tuning jobs."""

import os

import fsspec.config

# etils.epath reaches gs:// through gcsfs, not TensorFlow's GCS file system: one client for every file operation
# bert_jax makes (see paths.py), which the tests run against a GCS emulator. Set before etils first looks.
os.environ.setdefault("EPATH_USE_TF", "false")
# gcsfs would otherwise cache directory listings for the life of the process, so a reader never saw a checkpoint
# step, bundle or pipeline state that another process (another host, a later run) wrote after it first looked.
fsspec.config.conf.setdefault("gcs", {}).setdefault("use_listings_cache", False)
