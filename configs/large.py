"""BERT-Large pretraining (L24 H1024 A16) as in the paper, phase 1 of 2: sequence 128, batch 256, lr 1e-4,
10k warmup steps, AdamW with weight decay 0.01, for the first 900k of 1M steps; `configs/large_phase2.py`
continues at sequence 512 for the last 100k steps (the paper's 90% / 10% split), on the same learning-rate
schedule, which reaches zero at step 1M.

    python -m bert_jax.main --config=configs/large.py --workdir=gs://BUCKET/bert-large \\
        --config.tokenizer.path=gs://BUCKET/vocab/uncased_vocab.txt --config.data.prepared_dir=gs://BUCKET/wiki_uncased

The corpus is prepared once as shown in configs/base.py (the same prepared data serves every model size).
Position embeddings are sized 512 throughout, so phase 2 loads phase 1's checkpoint as it is. On a pod slice,
`--config.model.scan_layers=True` compiles one layer instead of 24, and `--config.model.remat=save_dots` or
`full` trades recomputation for activation memory; `--config.optimizer=lamb` with a larger batch follows
You et al. (2019).
"""

from bert_jax.model_config import preset
from configs import default

# The whole two-phase run: the schedule of both phases ends here; phase 1 stops at 90% of it.
TOTAL_STEPS = 1_000_000
PHASE_1_STEPS = 900_000


def get_config():
  config = default.get_config()
  config.model.update(preset("large"))
  config.batch_size = 256
  config.num_train_steps = PHASE_1_STEPS
  config.schedule_end_step = TOTAL_STEPS
  config.warmup_steps = 10_000
  config.learning_rate = 1e-4
  config.data.max_seq_length = 128
  config.data.max_predictions_per_seq = 20
  return config
