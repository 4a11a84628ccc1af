"""mmBERT-shaped multilingual pretraining of a ModernBERT-base encoder (Marone et al. 2025, mmBERT): three phases in
one run over one source per language, drawn by a temperature over their token counts that anneals from phase to phase
(tau 0.7, then 0.5, then 0.3: ever closer to uniform, so the small languages gain share), with the masking rate
lowered at the same boundaries (30%, then 15%, then 5%): 2.3T tokens of pretraining, 600B of mid-training and a
100B-token decay, the learning rate decaying over the last.

    python -m bert_jax.main --config=configs/mmbert_base.py --workdir=gs://your-bucket/mmbert-base \\
        --config.tokenizer.path=gs://your-bucket/vocab/tokenizer.json \\
        --config.data.mixture_sources=en=gs://your-bucket/en,de=gs://your-bucket/de,...

The sources below are placeholders, one per language: name your prepared corpora in `data.mixture_sources`, each
prepared with `--mode=prepare` and the one 256k-entry tokenizer (mmBERT's is Gemma 2's; `tokenizer.kind` is
ModernBERT's byte-level BPE here). A temperature draws from every source by its prepared token count, so the shares
follow from the corpora you prepare (the run header prints each phase's planned shares, docs/data.md, "Mixtures").
The phases begin at token counts, which the batch-size warmup turns into steps; `data.masking_phases` begins its rates
at the same counts. A resume may change a later phase where it begins; checkpoints record both schedules and refuse
any other change.

Where it differs from mmBERT:
- mmBERT adds languages at each phase (60, then 110, then 1,833); a temperature phase here draws from every source,
  so a language joins when you add its source at a boundary (a resume naming other sources is refused: start the
  later phase as a launch of its own, `init_from` the previous phase's workdir), or from the start.
- Every phase trains at 1,024 tokens; mmBERT's later phases extend the context to 8k, which in bert_jax is a launch
  of its own (configs/modernbert_context_extension.py's pattern): a mixture's phases share one sequence length.
- Model, batch and optimizer are ModernBERT-base's (configs/modernbert_base.py: 4,608 rows of 1,024 tokens after a
  batch-size warmup) with mmBERT's 256k vocabulary: 307,786,240 parameters, as mmBERT-base's 307M.
Averaging the decay's checkpoints, as mmBERT merges its decay variants, is `--mode=merge` (docs/handoff.md).

Planned for a v5p-64 slice (32 chips), as ModernBERT-base. Compiled for it (2026-12-03, XLA's TPU compiler on a
2-core CPU machine, XLA's own peak, `--mode=dry_run` as below): in 2 microbatches of 72 rows per chip the train step
fits at remat none, peak 41.94 GiB of 95.74 usable per chip, compiled in 245 s. In one microbatch, as ModernBERT-base
runs, the 256k vocabulary's logits take it to 113.88 GiB: it does not fit.

    python -m bert_jax.main --config=configs/mmbert_base.py --workdir=/tmp/mmbert --mode=dry_run
"""

from configs import modernbert_base

VOCAB_SIZE = 256_000
PHASE_TOKENS = (2.3e12, 600e9, 100e9)  # Pretraining, mid-training, decay.
TEMPERATURES = (0.7, 0.5, 0.3)
MASKING_RATES = (0.3, 0.15, 0.05)
# Placeholder languages, one prepared corpus each.
SOURCES = {name: f"gs://BUCKET/mmbert/{name}" for name in ("en", "zh", "ru", "de", "es", "ja", "hi", "sw")}


def get_config():
  config = modernbert_base.get_config()
  batches = modernbert_base.BATCHES
  config.model.vocab_size = VOCAB_SIZE
  config.num_microbatches = 2  # In one, the 256k vocabulary's logits take the step past a v5p chip's memory.
  config.tokenizer.path = "gs://BUCKET/vocab/tokenizer.json"
  config.data.mixture_sources = ",".join(f"{name}={path}" for name, path in SOURCES.items())
  begins = ["0", f"{PHASE_TOKENS[0]:g}tokens", f"{PHASE_TOKENS[0] + PHASE_TOKENS[1]:g}tokens"]
  config.data.mixture_phases = "; ".join(
    f"{begin}: tau={tau:g}" for begin, tau in zip(begins, TEMPERATURES, strict=True)
  )
  config.data.masked_lm_prob = MASKING_RATES[0]  # Rows are selected at the highest rate, then trimmed to the phase's.
  config.data.masking_phases = "; ".join(
    f"{begin}: {rate:g}" for begin, rate in zip(begins, MASKING_RATES, strict=True)
  )
  config.num_train_steps = batches.step_reaching(sum(PHASE_TOKENS))
  decay_steps = config.num_train_steps - batches.step_reaching(PHASE_TOKENS[0] + PHASE_TOKENS[1])
  config.lr_decay_fraction = decay_steps / config.num_train_steps  # The decay phase's steps, 1-sqrt to zero.
  return config
