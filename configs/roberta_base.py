"""RoBERTa-Base pretraining (Liu et al. 2019, Table 9; fairseq's roberta.base): L12 H768 A12, dynamic masking,
no next-sentence task, batch 8k of 512 tokens, peak learning rate 6e-4 after 24k warmup steps, 500k steps, Adam with
beta2 0.98 and no gradient clipping, a linear decay from the peak.

    python -m bert_jax.main --config=configs/roberta_base.py --workdir=gs://BUCKET/roberta-base \\
        --config.tokenizer.path=gs://BUCKET/roberta/vocab.json --config.data.prepared_dir=gs://BUCKET/wiki_roberta

The architecture is BERT's with RoBERTa's conventions: positions start at 2 (its padding index 1, plus one), so
the position table has 514 rows for 512 tokens; one token type; LayerNorm epsilon 1e-5; a 50,265-piece byte-level
BPE vocabulary. Checkpoints export as transformers' `RobertaForMaskedLM` (`--mode=export
--config.export.format=huggingface`), and RoBERTa checkpoints from the hub load through `init_from`.
"""

from bert_jax.model.bert_config import preset
from configs import default


def get_config():
  config = default.get_config()
  config.model.update(preset("base"))
  config.model.update(
    model_type="roberta",
    vocab_size=50265,
    max_position_embeddings=514,
    position_offset=2,
    type_vocab_size=1,
    layer_norm_eps=1e-5,
    dtype="bfloat16",  # fairseq trained in fp16.
  )
  config.tokenizer.kind = "bpe"  # vocab.json with merges.txt beside it, or a tokenizer.json.
  config.data.instances = "full_sentences"  # FULL-SENTENCES, no next-sentence task.
  config.data.max_seq_length = 512
  config.data.max_predictions_per_seq = 80
  config.batch_size = 8192
  config.num_train_steps = 500_000
  config.warmup_steps = 24_000
  config.lr_schedule = "transformers"  # fairseq's polynomial decay (power 1) from the peak.
  config.learning_rate = 6e-4
  config.adam_b2 = 0.98
  config.adam_eps = 1e-6
  config.weight_decay = 0.01
  config.max_grad_norm = float("inf")  # fairseq --clip-norm 0.0.
  return config
