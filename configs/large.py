"""BERT-Large pretraining (L24 H1024 A16) as in the paper: sequence 128, batch 256, 1M steps, lr 1e-4,
10k warmup steps, AdamW with weight decay 0.01.

    python -m bert_jax.main --config=configs/large.py --workdir=gs://BUCKET/bert-large \
        --config.tokenizer.path=gs://BUCKET/vocab/uncased_vocab.txt --config.data.prepared_dir=gs://BUCKET/wiki_uncased

The corpus is prepared once as shown in configs/base.py (the same prepared data serves every model size).
"""

from bert_jax.model_config import preset
from configs import default


def get_config():
  config = default.get_config()
  config.model.update(preset("large"))
  config.batch_size = 256
  config.num_train_steps = 1_000_000
  config.warmup_steps = 10_000
  config.learning_rate = 1e-4
  config.data.max_seq_length = 128
  config.data.max_predictions_per_seq = 20
  return config
