"""BERT-Base pretraining (L12 H768 A12), phase 1 of the paper: sequence 128, batch 256, 1M steps.

python -m bert_jax.main --config=configs/base.py --workdir=gs://BUCKET/bert-base
"""

from configs import default


def get_config():
  return default.get_config()  # The defaults are BERT-Base's.
