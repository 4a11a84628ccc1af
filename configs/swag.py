"""Fine-tune on SWAG with the BERT paper's hyperparameters: four (context, ending) sequences per example scored
through [CLS], rows of 128 tokens, batch 16, learning rate 2e-5, 3 epochs, 10% warmup, the source's dropout
(BERT's 0.1).

    python -m bert_jax.main --mode=finetune --config=configs/swag.py --config.finetune.data_dir=gs://bucket/swag \
        --config.init_from=gs://bucket/run --workdir=...

`data_dir` holds the official train.csv, val.csv and test.csv.
"""

from configs import glue


def get_config():
  config = glue.get_config()
  config.finetune.task = "swag"
  config.finetune.max_seq_length = 128
  config.batch_size = 16
  config.learning_rate = 2e-5
  return config
