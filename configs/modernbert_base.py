"""ModernBERT-base pretraining (Warner et al. 2024), phase 1: 1.719T tokens at 1,024 tokens per row, with the settings
of ModernBERT's training code (github.com/AnswerDotAI/ModernBERT, yamls/modernbert/modernbert-base-pretrain.yaml);
`configs/modernbert_context_extension.py` continues it at 8,192 tokens.

    python -m bert_jax.main --config=configs/modernbert_base.py --workdir=gs://BUCKET/modernbert-base \\
        --config.tokenizer.path=gs://BUCKET/vocab/bpe/tokenizer.json --config.data.prepared_dir=gs://BUCKET/web_bpe

The model: 22 pre-norm layers, hidden 768, 12 heads, a GeGLU feed-forward of 1,152, LayerNorm (eps 1e-5) without
biases and no bias in any dense layer (the masked-LM decoder's output bias only), rotary positions (no position
table), local attention over 128 tokens (64 each side) with a global layer every third from layer 0; a 50,368-piece
byte-level BPE vocabulary (`tokenizer.kind="bpe"`: a tokenizer.json with RoBERTa's or BERT's special names, as
ModernBERT's [CLS]/[SEP]/[MASK]; a tokenizer.json with a normalizer is refused naming it, and the published file is
not checked here: docs/handoff.md). The recipe: 30% of tokens masked (80/10/10), evaluation at 15%;
instances of one document's text each (`doc_sentences`), packed into rows, attention within each instance; batch
4,608 rows (4.7M tokens) after a batch-size warmup from 768 rows over the first 50B tokens; learning-rate warmup over
3B tokens, then the peak 8e-4 to the end (warmup-stable-decay with no decay: the decay comes at the end of the
context extension); StableAdamW, betas (0.9, 0.98), eps 1e-6, no gradient clipping (StableAdamW's update clipping
replaces it); no dropout.

The batch-size warmup (`batch_warmup_tokens`, `batch_warmup_start`; bert_jax/data/batch_warmup.py) is the training
code's: its `batch_size_warmup_min_size` is its 96-row microbatch on each of its 8 GPUs, 768 rows, and it adds a
microbatch per GPU at a time over `batch_size_warmup_tokens: 50_000_000_000tok`. Here the same figures: 768, 1,536,
... 3,840 rows for 4,239 steps each (steps 1 to 21,195, 50.005B token positions), then 4,608; six compiled train
steps. On the v5p-64 below 768 rows are 24 per chip. The training code schedules its learning rate
and its length in tokens, and bert_jax in steps: `warmup_steps` and `num_train_steps` are the steps that read 3B and
1.719T tokens under the batch warmup (`BatchSchedule.step_reaching`), 3,815 (all at 768 rows) and 374,902.

Where it differs from the training code, and why:
- RoPE base 10,000 in every layer, as the training code's phase 1 (`rotary_emb_base: 10000`); the context extension
  raises the global layers' to 160,000 (the released model's `global_rope_theta`).
- Weight decay: ModernBERT's is "fully decoupled", 1e-5 x lr_t / peak per step; bert_jax's decays by lr_t x
  weight_decay, so the same decay is weight_decay = 1e-5 / 8e-4 = 0.0125 (also divided by StableAdamW's per-tensor
  RMS, as optimi's is).
- The warmup's batch grows at fixed steps, computed ahead from token positions (padding included); the training
  code counts the real tokens its packer emits, so its sizes change a little later.
- Its attention-output dropout of 0.1 is left out: `model.attention_dropout_prob` covers the attention's
  probabilities and output together (as transformers' ModernBERT), and the splash kernel takes none (the released
  config has every dropout at 0).
- Parameters start from bert_jax's initialiser (truncated normal, 0.02), not the training code's Megatron one.

Planned for a v5p-64 slice (32 chips: 144 rows of 1,024 tokens per chip in one microbatch, against the training
code's 96 rows per 80 GB GPU), in bfloat16 with the splash kernel. Compiled for it (2026-11-29, XLA's TPU compiler
on a 2-core CPU machine, XLA's own peak, `--mode=dry_run` as below): the train step fits at remat none, peak 62.75
GiB of 95.74 usable per chip, compiled in 100 s; the eval step 9.06 GiB (the dry run compiles the full batch: the
warmup's smaller ones take less). In 2 microbatches of 72 the peak is 32.26 GiB; `--mode=plan` keeps remat none
there (it tries the config's microbatches and more, never fewer).

    python -m bert_jax.main --config=configs/modernbert_base.py --workdir=/tmp/mb --mode=dry_run
"""

from bert_jax.data.batch_warmup import BatchSchedule
from configs import default

# The training code's figures, in tokens; steps follow from the batches.
BATCH_SIZE, SEQ_LENGTH = 4608, 1024
TOKENS_PER_STEP = BATCH_SIZE * SEQ_LENGTH
BATCH_WARMUP_START, BATCH_WARMUP_TOKENS = 768, 50_000_000_000
BATCHES = BatchSchedule.warmup(BATCH_SIZE, BATCH_WARMUP_START, BATCH_WARMUP_TOKENS, SEQ_LENGTH)
PHASE_1_STEPS = BATCHES.step_reaching(1_719e9)  # 374,902
WARMUP_STEPS = BATCHES.step_reaching(3e9)  # 3,815
PEAK_LEARNING_RATE = 8e-4
# ModernBERT's fully decoupled weight decay per step at the peak, before it becomes bert_jax's weight_decay.
DECOUPLED_WEIGHT_DECAY = 1e-5
MASKED_LM_PROB, EVAL_MASKED_LM_PROB = 0.3, 0.15


def max_predictions(seq_length: int) -> int:
  """Masked positions per row at 30% (the masking rounds as this does): the cap never binds."""
  return round(seq_length * MASKED_LM_PROB)


def get_config():
  config = default.get_config()
  config.model.update(
    model_type="modernbert",
    vocab_size=50368,
    num_layers=22,
    hidden_size=768,
    num_heads=12,
    intermediate_size=1152,
    # No position table: the longest context the released model takes, the same in both phases (a size field).
    max_position_embeddings=8192,
    layer_norm_eps=1e-5,
    hidden_act="gelu",  # GeGLU with the gated ("glu") feed-forward.
    norm="layer_norm",
    norm_bias=False,
    linear_bias=False,
    rope_theta=10_000.0,
    local_rope_theta=10_000.0,
    local_attention=128,
    global_attention_every=3,
    hidden_dropout_prob=0.0,
    attention_dropout_prob=0.0,
    dtype="bfloat16",
    attention="auto",  # Splash on a TPU.
    scan_layers=True,
  )
  config.tokenizer.kind = "bpe"
  config.tokenizer.train_bpe_format = "modernbert"  # A missing tokenizer.path is trained as ModernBERT's file.
  config.data.instances = "doc_sentences"
  config.data.pack_instances = True
  config.data.short_seq_prob = 0.0  # Rows are filled: no short targets.
  config.data.masked_lm_prob = MASKED_LM_PROB
  config.data.eval_masked_lm_prob = EVAL_MASKED_LM_PROB
  config.data.max_seq_length = SEQ_LENGTH
  config.data.max_predictions_per_seq = max_predictions(SEQ_LENGTH)
  config.batch_size = BATCH_SIZE
  config.batch_warmup_start, config.batch_warmup_tokens = BATCH_WARMUP_START, BATCH_WARMUP_TOKENS
  config.num_microbatches = 1
  config.num_train_steps = PHASE_1_STEPS
  config.warmup_steps = WARMUP_STEPS
  config.lr_schedule = "wsd"
  config.lr_decay = "1-sqrt"
  config.lr_decay_fraction = 0.0  # The stable phase; the context extension decays.
  config.learning_rate = PEAK_LEARNING_RATE
  config.optimizer = "stable_adamw"
  config.adam_b1, config.adam_b2, config.adam_eps = 0.9, 0.98, 1e-6
  config.weight_decay = DECOUPLED_WEIGHT_DECAY / PEAK_LEARNING_RATE
  config.max_grad_norm = float("inf")
  config.dry_run.topology = "v5p-64"
  return config
