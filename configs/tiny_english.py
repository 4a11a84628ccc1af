"""BERT-Tiny (L2 H128 A2) pretrained on a directory of English text with Google's uncased WordPiece vocabulary:
the encoder of the fine-tuning evaluation in docs/benchmarks.md. Point it at the text and vocabulary, prepare
once, train:

    VOCAB=../shared/data/vocab/bert-base-uncased-vocab.txt
    python -m bert_jax.main --config=configs/tiny_english.py --mode=prepare --workdir=/tmp/tiny_english \
        --config.data.input_pattern='../shared/data/pretrain/*/*.txt' --config.tokenizer.path=$VOCAB \
        --config.data.prepared_dir=/tmp/english_prepared
    python -m bert_jax.main --config=configs/tiny_english.py --workdir=/tmp/tiny_english \
        --config.tokenizer.path=$VOCAB --config.data.prepared_dir=/tmp/english_prepared

About 1.5 M tokens of text (the shared corpus): 1,500 steps of 64 x 128 are about 8 passes over it (40 minutes
on a 2-core CPU).
"""

from bert_jax.model.bert_config import preset
from configs import default


def get_config():
  config = default.get_config()
  config.model.update(preset("tiny"))
  config.tokenizer.kind = "wordpiece"
  config.tokenizer.lower_case = True
  config.data.input_format = "document"
  config.data.num_shards = 16
  config.data.shuffle_buffer = 10_000
  config.data.max_seq_length = 128
  config.data.max_predictions_per_seq = 20
  config.batch_size = 64
  config.num_train_steps = 1_500
  config.warmup_steps = 150
  config.learning_rate = 1e-3
  config.log_every_steps = 50
  config.eval_every_steps = 500
  config.eval_steps = 10
  config.checkpoint_every_steps = 500
  config.keep_checkpoints = 1
  return config
