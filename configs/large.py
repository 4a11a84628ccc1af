"""BERT-Large pretraining (L24 H1024 A16) as in the paper, phase 1 of 2: sequence 128, batch 256, lr 1e-4,
10k warmup steps, AdamW with weight decay 0.01, for the first 900k of 1M steps; `configs/large_phase2.py`
continues at sequence 512 for the last 100k steps (the paper's 90% / 10% split), on the same learning-rate
schedule, which reaches zero at step 1M.

    python -m bert_jax.main --config=configs/large.py --workdir=gs://BUCKET/bert-large \\
        --config.tokenizer.path=gs://BUCKET/vocab/uncased_vocab.txt --config.data.prepared_dir=gs://BUCKET/wiki_uncased

The corpus is prepared once as shown in configs/base.py (the same prepared data serves every model size).
Position embeddings are sized 512 throughout, so phase 2 loads phase 1's checkpoint as it is. Layers are scanned
(one layer compiled instead of 24; checkpoints load into either layout); computation is in bfloat16 (float32
parameters, optimizer state, softmax and loss); `--config.model.remat` trades recomputation for activation memory
(`--mode=plan` picks it for a slice); `--config.optimizer=lamb` with a larger batch follows You et al. (2019).

Planned for a v5p-128 slice (64 chips, as the paper's 64 TPU chips), batch 256 (4 rows per chip, data parallel):
compiled for it on any machine with libtpu, no TPU needed, the train step fits with a wide margin (docs/tpu.md), and
`--mode=plan` there chooses remat "none", the least recomputation (element-wise work only, model/remat.py):

    python -m bert_jax.main --config=configs/large.py --workdir=/tmp/plan --mode=dry_run
    python -m bert_jax.main --config=configs/large.py --workdir=/tmp/plan --mode=plan
"""

from bert_jax.model.bert_config import preset
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
  config.model.scan_layers = True
  # On a TPU: bfloat16 activations and matmuls; float32 parameters, optimizer state, softmax and loss.
  config.model.dtype = "bfloat16"
  # What --mode=plan chose for the slice below: the least recomputation that fits (model/remat.py).
  config.model.remat = "none"
  # The slice this config was planned for: --mode=dry_run compiles for it; tests/test_planned_configs.py checks it fits.
  config.dry_run.topology = "v5p-128"
  return config
