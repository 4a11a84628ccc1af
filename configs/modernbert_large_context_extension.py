"""ModernBERT-large's context extension: configs/modernbert_context_extension.py's, from configs/modernbert_large.py's
second part (step 338,868), at the training code's large figures (yamls/modernbert/modernbert-large-context-
extension.yaml): batch 616 rows of 8,192 tokens, learning rate 5e-5 and weight decay 1e-6, fully decoupled (so
weight_decay = 1e-6 / 5e-5 = 0.02 here, as in phase 1).

    python -m bert_jax.main --config=configs/modernbert_large_context_extension.py \\
        --workdir=gs://BUCKET/modernbert-large-8k --config.init_from=gs://BUCKET/modernbert-large-5e-5 \\
        --config.tokenizer.path=gs://BUCKET/vocab/bpe/tokenizer.json --config.data.prepared_dir=gs://BUCKET/web_bpe

Planned for a v5p-16 slice (8 chips, as the training code's 8 GPUs: 616 rows divide among 8 chips, not 32), 77 rows
per chip in 11 microbatches of 7 (the training code's microbatch). Compiled for it (2026-11-29, XLA's TPU compiler on
a 2-core CPU machine, XLA's own peak, the command below): the train step fits at remat none with splash's local
mask, peak 50.90 GiB of 95.74 usable per chip (51.52 until the scanned kernels' gradients were stacked in
bfloat16, the same evening), compiled in 156 s; the eval step 5.48 GiB (its 77 rows a chip in the
train step's 11 slices; 37.49 GiB when it took them at once, before 2026-11-29).

    python -m bert_jax.main --config=configs/modernbert_large_context_extension.py --workdir=/tmp/mlc --mode=dry_run
"""

from configs import modernbert_context_extension, modernbert_large


def get_config():
  config = modernbert_context_extension.extend(
    modernbert_large.get_config(),
    phase_1_steps=modernbert_large.PHASE_1_STEPS,
    batch_size=616,
    num_microbatches=11,
    learning_rate=5e-5,
    decoupled_weight_decay=1e-6,
  )
  config.dry_run.topology = "v5p-16"
  # A placeholder that fails with a clear error until it names phase 1's workdir (its second part's).
  config.init_from = "gs://BUCKET/modernbert-large-5e-5"
  return config
