"""ALBERT-Base pretraining (Lan et al. 2019; google-research/albert): L12 H768 A12 with 128-wide factorised
embeddings, one set of layer parameters shared by all 12 layers, the tanh GELU, no dropout, a sentence-order task,
batch 4096 of 512 tokens, LAMB at 0.00176 for 125k steps after 3125 warmup steps.

    python -m bert_jax.main --config=configs/albert_base.py --workdir=gs://BUCKET/albert-base \\
        --config.tokenizer.path=gs://BUCKET/vocab/albert_30k.model --config.data.prepared_dir=gs://BUCKET/wiki_albert

The shared layer is scanned (`bert/shared_layer`, one layer's parameters broadcast to every step). Checkpoints
export as transformers' `AlbertForPreTraining` (`--mode=export --config.export.format=huggingface`) and ALBERT
checkpoints from the hub load through `init_from`. Not as the paper: ALBERT masks n-grams of up to 3 words.
"""

from bert_jax.model.bert_config import preset
from configs import default


def get_config():
  config = default.get_config()
  config.model.update(preset("base"))
  config.model.update(
    model_type="albert",
    vocab_size=30000,
    embedding_size=128,
    hidden_act="gelu_new",
    layer_sharing="all",
    hidden_dropout_prob=0.0,
    attention_dropout_prob=0.0,
    scan_layers=True,
  )
  config.tokenizer.kind = "sentencepiece"
  config.data.max_seq_length = 512
  config.data.max_predictions_per_seq = 20
  config.data.short_seq_prob = 0.1
  config.data.instances = "sop"  # Sentence-order prediction in place of NSP.
  config.batch_size = 4096
  config.num_train_steps = 125_000
  config.warmup_steps = 3125
  config.optimizer = "lamb"
  config.learning_rate = 0.00176
  config.weight_decay = 0.01
  return config
