"""Fine-tune on CoNLL-2003 named entities with the BERT paper's hyperparameters: a label on the first piece of
each word, rows of 128 tokens (longer sentences split at word boundaries), batch 32, learning rate 5e-5,
3 epochs, 10% warmup, the source's dropout (BERT's 0.1); entity-level F1 as conlleval computes it.

    python -m bert_jax.main --mode=finetune --config=configs/ner.py --config.finetune.data_dir=gs://bucket/conll2003 \
        --config.init_from=gs://bucket/run --workdir=...

`data_dir` holds train.txt, valid.txt and test.txt in CoNLL column layout (word first, tag last). Tags in the
original IOB1 scheme: --config.finetune.tag_scheme=IOB1.
"""

from configs import glue


def get_config():
  config = glue.get_config()
  config.finetune.task = "conll2003"
  config.finetune.max_seq_length = 128
  config.learning_rate = 5e-5
  return config
