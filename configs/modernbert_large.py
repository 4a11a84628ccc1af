"""ModernBERT-large pretraining (Warner et al. 2024), phase 1 at 1,024 tokens per row: configs/modernbert_base.py's
recipe and differences at the large size (28 layers, hidden 1,024, 16 heads, GeGLU feed-forward 2,624), batch
4,928 rows (5.0M tokens), learning-rate warmup over 2B tokens, peak learning rate 5e-4 and a fully decoupled weight
decay of 1e-5 (bert_jax's weight_decay = 1e-5 / 5e-4 = 0.02).

Its batch-size warmup is base's scheme at the paper's large figures: from the training code's 56-row microbatch on each
of 8 GPUs, 448 rows, by 448 at a time, over the first 10B tokens: 448 to 4,480 rows for 397 steps each (steps 1 to
3,970, 10.017B token positions), then 4,928; eleven compiled train steps. On the v5p-64 below 448 rows are 14 per
chip, 7 per microbatch. As for base, the step counts are those that read the tokens under the warmup.

    python -m bert_jax.main --config=configs/modernbert_large.py --workdir=gs://BUCKET/modernbert-large \\
        --config.tokenizer.path=gs://BUCKET/vocab/bpe/tokenizer.json --config.data.prepared_dir=gs://BUCKET/web_bpe

The paper trained large at 5e-4 for 900B tokens, where its loss had plateaued, then at 5e-5 (weight decay 1e-6:
still 0.02 here) for the remaining 800B. This config stops at the first 900B (step 180,335); the second part
continues from it in its own workdir, as configs/large_phase2.py continues configs/large.py (parameters, optimizer
state and step), to step 338,868 (1.7T tokens in all):

    python -m bert_jax.main --config=configs/modernbert_large.py --workdir=gs://BUCKET/modernbert-large-5e-5 \\
        --config.init_from=gs://BUCKET/modernbert-large --config.learning_rate=5e-5 \\
        --config.num_train_steps=338868 \\
        --config.tokenizer.path=gs://BUCKET/vocab/bpe/tokenizer.json --config.data.prepared_dir=gs://BUCKET/web_bpe

`configs/modernbert_large_context_extension.py` continues from there at 8,192 tokens. The paper started large from
base's weights (tiled); this one starts from the seed.

Planned for a v5p-64 slice (32 chips: 154 rows of 1,024 tokens per chip, in 2 microbatches of 77, against the
training code's 56 rows per 80 GB GPU), in bfloat16 with the splash kernel. Compiled for it (2026-11-29, XLA's TPU
compiler on a 2-core CPU machine, XLA's own peak, the command below): the train step fits at remat none, peak 67.27
GiB of 95.74 usable per chip (67.89 until the scanned kernels' gradients were stacked in bfloat16, the same
evening), compiled in 194 s (the full batch; the warmup's smaller ones take less); in 7 microbatches of 22, 25.02
GiB (then).

    python -m bert_jax.main --config=configs/modernbert_large.py --workdir=/tmp/ml --mode=dry_run
"""

from bert_jax.data.batch_warmup import BatchSchedule
from configs import modernbert_base

BATCH_SIZE = 4928
TOKENS_PER_STEP = BATCH_SIZE * modernbert_base.SEQ_LENGTH
BATCH_WARMUP_START, BATCH_WARMUP_TOKENS = 448, 10_000_000_000
BATCHES = BatchSchedule.warmup(BATCH_SIZE, BATCH_WARMUP_START, BATCH_WARMUP_TOKENS, modernbert_base.SEQ_LENGTH)
# The first 900B tokens at 5e-4 (this config), then 800B at 5e-5 (its second launch, above).
FIRST_PART_STEPS = BATCHES.step_reaching(900e9)  # 180,335
PHASE_1_STEPS = BATCHES.step_reaching(1_700e9)  # 338,868
PEAK_LEARNING_RATE = 5e-4


def get_config():
  config = modernbert_base.get_config()
  config.model.update(num_layers=28, hidden_size=1024, num_heads=16, intermediate_size=2624)
  config.batch_size = BATCH_SIZE
  config.batch_warmup_start, config.batch_warmup_tokens = BATCH_WARMUP_START, BATCH_WARMUP_TOKENS
  config.num_microbatches = 2
  config.num_train_steps = FIRST_PART_STEPS
  config.warmup_steps = BATCHES.step_reaching(2e9)  # 1,666
  config.learning_rate = PEAK_LEARNING_RATE
  config.weight_decay = modernbert_base.DECOUPLED_WEIGHT_DECAY / PEAK_LEARNING_RATE
  return config
