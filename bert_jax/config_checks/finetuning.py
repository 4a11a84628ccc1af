"""The checks of a fine-tuning run's keys (`check_finetuning`): the task, its files, the sweep, a teacher."""

from bert_jax.config_checks.ranges import AT_LEAST_ONE, POSITIVE, Range, check_ranges
from bert_jax.config_checks.training import DISTILLATION, check_training
from bert_jax.finetune.contrastive import Contrastive, check_matryoshka_dims, matryoshka_dims
from bert_jax.finetune.members import Member, sweep_members
from bert_jax.model.bert_config import BertConfig, check_fine_tunable

# finetune.task: GLUE's nine, SQuAD, CoNLL-2003, SWAG and the embeddings task (finetune/tasks.py builds them; a test
# keeps the two equal).
TASKS = (
  "cola",
  "mnli",
  "mrpc",
  "qnli",
  "qqp",
  "rte",
  "sst2",
  "stsb",
  "wnli",
  "squad_v1",
  "squad_v2",
  "conll2003",
  "swag",
  "embeddings",
)


FINETUNING = (
  ("finetune.num_epochs", POSITIVE),
  ("finetune.warmup_fraction", Range(0, 1)),
  ("finetune.max_seq_length", Range(8)),
  ("finetune.eval_batch_size", AT_LEAST_ONE),
  ("finetune.doc_stride", AT_LEAST_ONE),
  ("finetune.max_query_length", AT_LEAST_ONE),
  ("finetune.n_best_size", AT_LEAST_ONE),
  ("finetune.max_answer_length", AT_LEAST_ONE),
  ("sweep.seeds", AT_LEAST_ONE),
)


def check_finetuning(config) -> tuple[BertConfig, tuple[Member, ...]]:
  """Fine-tuning's keys; returns the configured encoder (a baseline's: `init_from` brings its own sizes) and the
  sweep's members."""
  model = check_training(config)
  check_ranges(config, FINETUNING)
  if config.batch_warmup_tokens:
    raise ValueError(
      f"batch_warmup_tokens={config.batch_warmup_tokens}: the batch-size warmup is pretraining's; fine-tuning has "
      "none (set it to 0)."
    )
  if config.lr_schedule == "wsd" and config.finetune.warmup_fraction + config.lr_decay_fraction > 1:
    raise ValueError(
      f"lr_decay_fraction={config.lr_decay_fraction} and finetune.warmup_fraction={config.finetune.warmup_fraction} "
      "sum to more than 1: expected wsd's warmup and decay to fit in the steps (their sum at most 1)."
    )
  if config.ema_decay:
    raise ValueError(
      f"ema_decay={config.ema_decay}: the moving average of the parameters is pretraining's; fine-tuning keeps none "
      "(set it to 0)."
    )
  name = config.finetune.task.lower()
  if name not in TASKS and name.replace("-", "") not in TASKS:
    raise ValueError(f"finetune.task={config.finetune.task!r}; expected one of {TASKS}.")
  if name in ("conll2003", "swag") and not config.finetune.data_dir:
    raise ValueError(f"finetune.task={name!r} reads files: set finetune.data_dir.")
  if (config.finetune.tags or config.finetune.tag_column != -1) and name != "conll2003":
    raise ValueError(
      f"finetune.tags={config.finetune.tags!r}, tag_column={config.finetune.tag_column} describe CoNLL files; "
      f"finetune.task={name!r} reads none."
    )
  if name == "embeddings":
    check_embeddings(config)
  if config.distill.teacher:
    check_ranges(config, DISTILLATION)
  if not config.init_from:  # A baseline fine-tunes config.model; init_from's encoder is checked where it is described.
    check_fine_tunable(model)
    if name == "embeddings":
      check_matryoshka_dims(matryoshka_dims(config.contrastive.matryoshka_dims), model.hidden_size)
    if config.finetune.max_seq_length > model.max_sequence_length:
      raise ValueError(f"finetune.max_seq_length={config.finetune.max_seq_length} exceeds {model.max_sequence_text}.")
  return model, sweep_members(config)


def check_embeddings(config) -> None:
  """The embeddings task's keys: its files, the contrastive loss's, and what its global negatives rule out."""
  if not config.finetune.data_dir:
    raise ValueError("finetune.task='embeddings' reads a BEIR-layout set and pairs: set finetune.data_dir.")
  Contrastive.from_config(config.contrastive)
  if config.num_microbatches != 1:
    raise ValueError(
      f"num_microbatches={config.num_microbatches}: the embeddings task's negatives are the whole batch's documents, "
      "so its loss does not split into microbatches (no gradient caching); set num_microbatches=1."
    )
  if config.distill.teacher:
    raise ValueError(f"distill.teacher={config.distill.teacher!r}: the embeddings task has no task distillation.")
