"""Fine-tune on SQuAD v2.0 with the BERT paper's hyperparameters for it: configs/squad.py's windows (384 tokens
every 128, questions cut to 64) and learning rate 5e-5, with batch 48 and 2 epochs (v1.1: batch 32, 3 epochs),
10% warmup, the source's dropout (BERT's 0.1).

    python -m bert_jax.main --mode=finetune --config=configs/squad_v2.py --config.finetune.data_dir=gs://bucket/squad \
        --config.init_from=gs://bucket/run --workdir=...

`data_dir` holds the official train-v2.0.json and dev-v2.0.json; without it, TFDS `squad/v2.0`
(`finetune.tfds_data_dir` for a prepared TFDS directory). The null-score threshold is chosen on dev and
`null_odds.json` written beside `predictions/dev.json`.
"""

from configs import squad


def get_config():
  config = squad.get_config()
  config.finetune.task = "squad_v2"
  config.finetune.num_epochs = 2.0
  config.batch_size = 48
  return config
