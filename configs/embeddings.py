"""Contrastive fine-tuning of sentence embeddings (finetune.task="embeddings", docs/embeddings.md) with
sentence-transformers' usual recipe: MultipleNegativesRankingLoss at scale 20 over every document of the global
batch, batches of 64 pairs with no text twice, 128 tokens, learning rate 2e-5, one epoch, 10% warmup, linear decay;
mean pooling and normalised embeddings unless the source (a sentence-transformers directory, an earlier contrastive
run) or config.embedding says otherwise:

    python -m bert_jax.main --mode=finetune --config=configs/embeddings.py \
        --config.finetune.data_dir=gs://bucket/msmarco --config.init_from=gs://bucket/run --workdir=...

`data_dir` holds a BEIR-layout set (corpus.jsonl, queries.jsonl, qrels/dev.tsv: the dev set whose nDCG@10 picks
best/) and the training pairs: train.jsonl, train.tsv or train.csv (anchor, positive, negative* columns), else the
set's qrels/train.tsv. Hard negatives: `--config.contrastive.hard_negatives=1`; Matryoshka:
`--config.contrastive.matryoshka_dims=768,512,256,128,64`; a sweep: `--config.sweep.learning_rates=5e-5,2e-5`.
"""

from configs import glue


def get_config():
  config = glue.get_config()
  config.finetune.task = "embeddings"
  config.finetune.max_seq_length = 128
  config.finetune.num_epochs = 1.0
  config.batch_size = 64
  config.learning_rate = 2e-5
  return config
