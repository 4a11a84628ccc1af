"""ELECTRA-Base pretraining (Clark et al. 2020), with the official code's settings (configure_pretraining.py): a
BERT-Base discriminator (12 layers, hidden 768, 12 heads, feed-forward 3072, 768-wide embeddings: no projection)
and a generator of a third of its width (256, 4 heads, feed-forward 1024) and all its depth, sharing its
embeddings; sequence 512, batch 256, learning rate 2e-4 with 10k warmup steps, 766k steps, weight decay 0.01, loss
MLM + 50 x RTD.

    python -m bert_jax.main --config=configs/electra_base.py --workdir=gs://BUCKET/electra-base \\
        --config.tokenizer.path=gs://BUCKET/vocab/uncased_vocab.txt --config.data.prepared_dir=gs://BUCKET/wiki_uncased

Everything else, and where it differs from the official code, as in configs/electra_small.py.
"""

from configs import electra_small


def get_config():
  config = electra_small.get_config()
  config.model.update(hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072, embedding_size=0)
  config.electra.generator_hidden_fraction = 1 / 3
  config.data.max_seq_length = 512
  config.data.max_predictions_per_seq = 79  # int((0.15 + 0.005) * 512), the official code's.
  config.batch_size = 256
  config.learning_rate = 2e-4
  config.num_train_steps = 766_000
  return config
