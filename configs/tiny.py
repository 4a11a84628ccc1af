"""BERT-Tiny (L2 H128 A2) for the demo and tests, on real English that ships with Python (its documentation):
trains a SentencePiece vocabulary, prepares the corpus and pretrains, offline, in about a minute on a laptop CPU.

python -m bert_jax.main --config=configs/tiny.py --workdir=/tmp/bert_tiny
"""

from bert_jax.model_config import preset
from configs import default


def get_config():
  config = default.get_config()
  config.model.update(preset("tiny"))
  config.model.vocab_size = 2000
  config.tokenizer.kind = "sentencepiece"
  config.data.embedded_corpus = "python_docs"
  config.data.shuffle_buffer = 2_000
  config.data.max_seq_length = 64
  config.data.max_predictions_per_seq = 10
  config.batch_size = 32
  config.num_train_steps = 200
  config.warmup_steps = 20
  config.learning_rate = 1e-3
  config.log_every_steps = 20
  config.eval_every_steps = 100
  config.eval_steps = 4
  config.checkpoint_every_steps = 100
  return config
