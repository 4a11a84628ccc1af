"""A tiny ModernBERT for the demo and tests: configs/modernbert_base.py's architecture and recipe at configs/tiny.py's
scale, on the same embedded text (Python's documentation), offline on a laptop CPU, to a held-out MLM accuracy above
the unigram model's.

python -m bert_jax.main --config=configs/modernbert_tiny.py --workdir=/tmp/modernbert_tiny

Four layers of hidden 128 (2 heads, GeGLU feed-forward 192, 1.5x as base's), layers 0 and 3 global, 1 and 2 local
over 16 tokens (8 each side) of 64-token rows, positions declared up to 128 as base declares its context
extension's 8,192 (rotary: no table); no biases, no dropout, RoPE base 10,000. The recipe: 30% of tokens
masked, evaluation at 15%, StableAdamW, warmup-stable-decay with a 1-sqrt decay over the last fifth of the steps;
no batch-size warmup (base's grows its batch over 50B tokens).
Float32, unscanned, XLA's attention: what a CPU runs fastest.
"""

from configs import modernbert_base


def get_config():
  config = modernbert_base.get_config()
  config.model.update(
    vocab_size=400,
    num_layers=4,
    hidden_size=128,
    num_heads=2,
    intermediate_size=192,
    max_position_embeddings=128,  # Its context extension's length (as base declares 8,192): no table, rotary.
    local_attention=16,
    dtype="float32",
    attention="xla",
    scan_layers=False,
  )
  config.tokenizer.kind = "sentencepiece"
  config.data.embedded_corpus = "python_docs"
  config.data.shuffle_buffer = 2_000
  config.data.max_seq_length = 64
  config.data.max_predictions_per_seq = modernbert_base.max_predictions(64)
  config.batch_size = 32
  config.batch_warmup_tokens = config.batch_warmup_start = 0  # No batch-size warmup in a run of a CPU minute.
  config.num_microbatches = 1
  config.num_train_steps = 550
  config.warmup_steps = 50
  config.lr_decay_fraction = 0.2
  config.learning_rate = 3e-3
  config.weight_decay = modernbert_base.DECOUPLED_WEIGHT_DECAY / config.learning_rate
  config.log_every_steps = 50
  config.eval_every_steps = 100
  config.eval_steps = 8
  config.checkpoint_every_steps = 100
  config.dry_run.topology = ""
  return config
