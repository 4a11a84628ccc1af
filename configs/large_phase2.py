"""BERT-Large pretraining, phase 2 of 2: sequence 512 (80 predictions per sequence) from phase 1's checkpoint at
step 900k to step 1M, on the same schedule (`configs/large.py`). Its own workdir; `init_from` names phase 1's:

    python -m bert_jax.main --config=configs/large_phase2.py --workdir=gs://BUCKET/bert-large-phase2 \\
        --config.init_from=gs://BUCKET/bert-large \\
        --config.tokenizer.path=gs://BUCKET/vocab/uncased_vocab.txt --config.data.prepared_dir=gs://BUCKET/wiki_uncased

Rows pack several NSP instances each (`data.pack_instances`). The run starts from phase 1's newest checkpoint
(parameters, optimizer state and step; the data stream starts afresh at the new length) and, once it has its own
checkpoints, resumes from those. Phase 1's workdir is only read.

Planned, as phase 1, for a v5p-128 slice at batch 256 (4 packed rows of 512 tokens per chip): it fits there
(`--mode=dry_run` compiles it for the slice; docs/tpu.md has the figures), and `--mode=plan` there chooses remat
"none". On smaller slices, at the same batch of 256, `--mode=plan --config.dry_run.topology=...` finds (2026-11-28,
XLA's TPU compiler from libtpu 0.0.42.1, XLA's own peak; docs/tpu.md):

    v6e-16  16 rows per chip: remat none fits (peak 15.30 of 31.25 GiB per chip)
    v5e-16  16 rows per chip: remat none fits (peak 15.11 of 15.75 GiB per chip), no flag to pass
    v5e-8   32 rows per chip: remat none in 2 microbatches of 16 (peak 14.84 GiB; 2026-11-29):
            --config.model.remat=none --config.num_microbatches=2
"""

from configs import large


def get_config():
  config = large.get_config()
  config.num_train_steps = large.TOTAL_STEPS
  config.data.max_seq_length = 512
  config.data.max_predictions_per_seq = 80
  # At 512 tokens most rows are padding without packing; packed, rows are >= 95% real tokens (docs/benchmarks.md).
  config.data.pack_instances = True
  # A placeholder that fails with a clear error until it names phase 1's workdir: phase 2 must not start from
  # scratch by accident.
  config.init_from = "gs://BUCKET/bert-large"
  return config
