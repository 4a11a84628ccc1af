"""Fine-tune on SQuAD v1.1 with the BERT paper's hyperparameters: windows of 384 tokens every 128 with questions
cut to 64, batch 32, learning rate 5e-5, 3 epochs, 10% warmup, the source's dropout (BERT's 0.1). SQuAD v2.0 has a
config of its own, configs/squad_v2.py (the paper's 2 epochs at batch 48 for v2.0).

    python -m bert_jax.main --mode=finetune --config=configs/squad.py --config.finetune.data_dir=gs://bucket/squad \
        --config.init_from=gs://bucket/run --workdir=...

`data_dir` holds the official train-v1.1.json and dev-v1.1.json; without it, TFDS `squad/v1.1`
(`finetune.tfds_data_dir` for a prepared TFDS directory). `predictions/dev.json` is in the official format.
"""

from configs import glue


def get_config():
  config = glue.get_config()
  config.finetune.task = "squad_v1"
  config.finetune.max_seq_length = 384
  config.finetune.doc_stride = 128
  config.finetune.max_query_length = 64
  config.finetune.num_epochs = 3.0
  config.finetune.eval_batch_size = 64
  config.learning_rate = 5e-5
  return config
