"""Fine-tune a ModernBERT on a GLUE task with ModernBERT's reference recipe (AnswerDotAI/ModernBERT,
src/evals/glue_jobs.py: each task's learning rate, decoupled weight decay, epochs and batch size; betas (0.9, 0.98),
eps 1e-6, no gradient clipping, a linear decay after 6% warmup), and the source's dropout (ModernBERT's 0, its
classifier head's 0). The task follows the config file after a colon:

    python -m bert_jax.main --mode=finetune --config=configs/glue_modernbert.py:rte \
        --config.finetune.data_dir=gs://bucket/glue_data/RTE --config.init_from=gs://bucket/modernbert --workdir=...

configs/glue.py is BERT's recipe (AdamW with betas (0.9, 0.999), clipping at 1.0, 10% warmup, the paper's rates).
The reference's weight decay is Composer's DecoupledAdamW's (a step multiplies a weight by 1 - decay x lr_t / lr,
the decay not scaled by the rate); bert_jax's `weight_decay` is AdamW's (1 - lr_t x weight_decay), so the same decay
is weight_decay = decay / lr at the task's rate (RTE's 1e-5 at 1e-5: 1.0; a sweep's other rates scale it with
them). The reference starts RTE, MRPC and STS-B from its MNLI fine-tuning (here: `init_from` that run's workdir is
not supported; start them from the pretrained encoder), and cuts rows at 256 tokens.
"""

import ml_collections

from configs import glue

# task: (peak learning rate, decoupled weight decay per step, epochs, batch size), as the reference's jobs set them.
RECIPES = {
  "mnli": (5e-5, 1e-6, 2, 64),
  "rte": (1e-5, 1e-5, 3, 16),
  "qqp": (3e-5, 3e-6, 5, 16),
  "cola": (5e-5, 5e-6, 10, 32),
  "mrpc": (8e-5, 8e-6, 10, 32),
  "qnli": (1e-5, 1e-6, 10, 16),
  "sst2": (3e-5, 3e-6, 3, 16),
  "stsb": (3e-5, 3e-6, 10, 32),
}


def get_config(task: str = "mnli") -> ml_collections.ConfigDict:
  if task not in RECIPES:
    raise ValueError(f"configs/glue_modernbert.py:{task}: expected one of {sorted(RECIPES)} after the colon.")
  learning_rate, decoupled_decay, epochs, batch_size = RECIPES[task]
  config = glue.get_config()
  config.finetune.update(task=task, num_epochs=float(epochs), warmup_fraction=0.06, max_seq_length=256)
  config.update(
    batch_size=batch_size,
    learning_rate=learning_rate,
    weight_decay=round(decoupled_decay / learning_rate, 12),
    adam_b1=0.9,
    adam_b2=0.98,
    adam_eps=1e-6,
    max_grad_norm=float("inf"),
    lr_schedule="transformers",
  )
  return config
