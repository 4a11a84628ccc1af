"""ModernBERT-base's context extension (Warner et al. 2024): configs/modernbert_base.py's model continued at 8,192
tokens per row from phase 1's checkpoint, the global layers' RoPE base raised from 10,000 to 160,000 (the local
layers' stays 10,000, as the training code's yamls/modernbert/modernbert-base-context-extension.yaml and the released
model have it). Its own workdir; `init_from` names phase 1's:

    python -m bert_jax.main --config=configs/modernbert_context_extension.py \\
        --workdir=gs://BUCKET/modernbert-base-8k --config.init_from=gs://BUCKET/modernbert-base \\
        --config.tokenizer.path=gs://BUCKET/vocab/bpe/tokenizer.json --config.data.prepared_dir=gs://BUCKET/web_bpe

The run starts from phase 1's newest checkpoint (parameters, StableAdamW's moments and step; the data stream starts
afresh at the new length), as configs/large_phase2.py continues configs/large.py. The training code's two runs,
250B tokens at a constant 3e-4 and then 50B decaying by 1-sqrt to 0.001 of it, are one warmup-stable-decay schedule
here, over batches of 576 rows (4.7M tokens): from phase 1's last step at 3e-4 (a step down from 8e-4, as the
training code restarts its schedule), the decay over the last 10,596 steps. Weight decay 1e-5 fully decoupled, so
weight_decay = 1e-5 / 3e-4. The same recipe otherwise (30% masking, evaluation at 15%, packed rows).

Planned, as phase 1, for a v5p-64 slice (32 chips: 18 rows of 8,192 tokens per chip in one microbatch, against the
training code's 12 rows per 80 GB GPU). Compiled for it (2026-11-29, XLA's TPU compiler on a 2-core CPU machine,
XLA's own peak, the command below): the train step fits at remat none with splash's local mask, peak 62.61 GiB of
95.74 usable per chip, compiled in 196 s; in 2 microbatches of 9, 32.24 GiB.

    python -m bert_jax.main --config=configs/modernbert_context_extension.py --workdir=/tmp/mc --mode=dry_run
"""

from configs import modernbert_base

SEQ_LENGTH = 8192
# The training code's extension, in tokens: a stable part, then the decay, to this fraction of the peak.
STABLE_TOKENS, DECAY_TOKENS, DECAY_FLOOR = 250e9, 50e9, 0.001
# The RoPE base of the global layers from here on (the local layers keep phase 1's).
GLOBAL_ROPE_THETA = 160_000.0


def extend(
  config,
  *,
  phase_1_steps: int,
  batch_size: int,
  num_microbatches: int,
  learning_rate: float,
  decoupled_weight_decay: float,
):
  """`config`, a ModernBERT phase 1's, continued from step `phase_1_steps` at 8,192 tokens: the training code's
  stable and decay parts as one wsd schedule at `learning_rate`, `batch_size` rows a step in `num_microbatches`."""
  tokens_per_step = batch_size * SEQ_LENGTH
  decay_steps = round(DECAY_TOKENS / tokens_per_step)
  config.num_train_steps = phase_1_steps + round(STABLE_TOKENS / tokens_per_step) + decay_steps
  config.batch_size, config.num_microbatches = batch_size, num_microbatches
  config.batch_warmup_tokens = config.batch_warmup_start = 0  # Phase 1 warmed the batch up; its steps are past it.
  config.model.rope_theta = GLOBAL_ROPE_THETA
  config.data.max_seq_length = SEQ_LENGTH
  config.data.max_predictions_per_seq = modernbert_base.max_predictions(SEQ_LENGTH)
  config.learning_rate = learning_rate
  config.lr_decay_fraction = decay_steps / config.num_train_steps
  config.lr_decay_floor = DECAY_FLOOR
  config.weight_decay = decoupled_weight_decay / learning_rate
  return config


def get_config():
  config = extend(
    modernbert_base.get_config(),
    phase_1_steps=modernbert_base.PHASE_1_STEPS,
    batch_size=576,
    num_microbatches=1,
    learning_rate=3e-4,
    decoupled_weight_decay=modernbert_base.DECOUPLED_WEIGHT_DECAY,
  )
  # A placeholder that fails with a clear error until it names phase 1's workdir: the extension must not start from
  # scratch by accident.
  config.init_from = "gs://BUCKET/modernbert-base"
  return config
