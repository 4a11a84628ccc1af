"""BERT-Tiny (L2 H128 A2) for the demo and tests, on real English that ships with Python (its documentation):
trains a SentencePiece vocabulary, prepares the corpus (holding out documents for evaluation) and pretrains,
offline, in about a minute on a laptop CPU, to a held-out MLM accuracy well above the unigram model's.

python -m bert_jax.main --config=configs/tiny.py --workdir=/tmp/bert_tiny
"""

from bert_jax.model.bert_config import preset
from configs import default


def get_config():
  config = default.get_config()
  config.model.update(preset("tiny"))
  # Tuned for a minute on 2 CPU cores (~8 passes over ~150k tokens; docs/benchmarks.md, "The quick start"): a
  # 400-piece vocabulary leaves each piece enough examples; no dropout, which only slows a run this short; the
  # highest learning rate that did not stall at the unigram solution (4e-3 and 5e-3 did).
  config.model.vocab_size = 400
  config.model.hidden_dropout_prob = 0.0
  config.model.attention_dropout_prob = 0.0
  config.tokenizer.kind = "sentencepiece"
  config.data.embedded_corpus = "python_docs"
  config.data.shuffle_buffer = 2_000
  config.data.max_seq_length = 64
  config.data.max_predictions_per_seq = 10
  config.batch_size = 32
  config.num_train_steps = 550
  config.warmup_steps = 50
  config.learning_rate = 3e-3
  config.log_every_steps = 50
  config.eval_every_steps = 100
  config.eval_steps = 8
  config.checkpoint_every_steps = 100
  return config
