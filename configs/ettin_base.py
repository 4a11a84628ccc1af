"""Ettin-shaped pretraining of a ModernBERT-base encoder (Weller et al. 2025, the Ettin suite): three phases in one
run on a mixture of prepared corpora whose weights change from phase to phase, 1.7T tokens of pretraining, 250B of
mid-training and a 50B-token decay, the learning rate decaying over the last.

    python -m bert_jax.main --config=configs/ettin_base.py --workdir=gs://your-bucket/ettin-base \\
        --config.tokenizer.path=gs://your-bucket/vocab/tokenizer.json \\
        --config.data.mixture_sources=web=gs://your-bucket/web,code=gs://your-bucket/code,...

The sources and weights below are placeholders with the recipe's shape (a web-heavy first phase; more code, papers,
books and math later; a decay on the cleanest sources): name your prepared corpora in `data.mixture_sources` (each
prepared with `--mode=prepare` and the one tokenizer) and write the published weights into `data.mixture_phases`
(docs/data.md, "Mixtures"). The phases begin at token counts (`1.7e12tokens`), which the batch-size warmup turns into
steps. A resume may change a later phase's weights where it begins (a declared boundary); checkpoints record the
mixture and refuse any other change.

Model, batch, optimizer and masking are ModernBERT-base's (configs/modernbert_base.py: 22 layers, hidden 768, 4,608
rows of 1,024 tokens after a batch-size warmup, StableAdamW at 8e-4, 30% masking, evaluation at 15%, each source's
held-out split drawn by size). Where it differs from Ettin: every phase here trains at 1,024 tokens; Ettin's later
phases extend the context to 8k, which in bert_jax is a launch of its own at the new length
(configs/modernbert_context_extension.py's pattern, `init_from` the previous phase): a mixture's phases share one
sequence length. Averaging the decay's checkpoints is `--mode=merge` (docs/handoff.md, "Merging checkpoints").

Planned for a v5p-64 slice (32 chips), as ModernBERT-base: the same program, so the same peak. Compiled for it
(2026-12-03, XLA's TPU compiler on a 2-core CPU machine, XLA's own peak, `--mode=dry_run` as below): the train step
fits at remat none, peak 62.75 GiB of 95.74 usable per chip.

    python -m bert_jax.main --config=configs/ettin_base.py --workdir=/tmp/ettin --mode=dry_run
"""

from configs import modernbert_base

PHASE_TOKENS = (1.7e12, 250e9, 50e9)  # Pretraining, mid-training, decay.
SOURCES = {name: f"gs://BUCKET/ettin/{name}" for name in ("web", "code", "papers", "books", "math", "wiki")}
# Placeholder weights, one draw per phase (a source left out is not drawn).
WEIGHTS = (
  "web=70,code=15,papers=5,books=4,math=3,wiki=3",
  "web=45,code=20,papers=12,books=10,math=8,wiki=5",
  "web=30,code=20,papers=15,books=15,math=10,wiki=10",
)


def get_config():
  config = modernbert_base.get_config()
  batches = modernbert_base.BATCHES
  begins = (0, PHASE_TOKENS[0], PHASE_TOKENS[0] + PHASE_TOKENS[1])
  config.tokenizer.path = "gs://BUCKET/vocab/tokenizer.json"
  config.data.mixture_sources = ",".join(f"{name}={path}" for name, path in SOURCES.items())
  config.data.mixture_phases = "; ".join(
    f"{'0' if not begin else f'{begin:g}tokens'}: {weights}" for begin, weights in zip(begins, WEIGHTS, strict=True)
  )
  config.num_train_steps = batches.step_reaching(sum(PHASE_TOKENS))
  decay_steps = config.num_train_steps - batches.step_reaching(begins[2])
  config.lr_decay_fraction = decay_steps / config.num_train_steps  # The decay phase's steps, 1-sqrt to zero.
  return config
