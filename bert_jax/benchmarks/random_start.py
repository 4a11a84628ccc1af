"""Random weights of the model a pretrained source would be fine-tuned as: the mark its pretraining must beat
(finetune_glue's and retrieval_pretraining's `random` starts)."""

import dataclasses

from bert_jax.finetune import plan
from bert_jax.handoff import formats


def random_start(config, source: str, vocab: str, lower_case: bool) -> None:
  """Sets `config` (a fine-tuning config without init_from) to start from random weights of the model it would
  fine-tune from `source` (from the source's metadata: its sizes, architecture, RoPE bases, dropout and head), with
  `vocab`'s WordPiece tokenizer."""
  pretrained_run = config.copy_and_resolve_references()
  pretrained_run.init_from = source
  model = plan.model_config(pretrained_run, formats.read_source(source))
  config.model.update({name: value for name, value in dataclasses.asdict(model).items() if name in config.model})
  config.tokenizer.update(kind="wordpiece", path=vocab, lower_case=lower_case)
