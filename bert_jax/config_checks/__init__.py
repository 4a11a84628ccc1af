"""Every check of a config that needs no I/O: value ranges, allowed names and the keys that must agree with each
other, for every mode, by subject: `ranges.py` (the ranges and their check), `training.py` (every training run,
pretraining, its objectives, vocabulary training), `finetuning.py` (tasks, sweeps, a teacher), `tools.py` (features,
embed, the BERTology analyses, retrieval, the dry run and plan, export, merge, the placeholder bucket).

The front door (`bert_jax/jobs.py`) is the only importer: its table names each mode's check below, which it runs
once, before anything is imported, read or written; what checking found (`Findings`: the model config, a sweep's
members) is what the jobs' entry functions take. What needs I/O (that a checkpoint fits the config, that `init_from`
exists, that files match) is checked where it is read: train/start_order.py, handoff/pretrained.py,
data/manifest.py.

The package imports no TensorFlow and nothing that reads files: only the owners of the names it checks (the
objectives' registry, the optimizers, the guard's policies, the tokenizer, masking and instance names, the masking-rate
schedule, the sweep's members, the TPU topologies, the export formats, what a merge asks for, the sentence-embedding
poolings, `BertConfig` and its checks).
"""

import dataclasses

from bert_jax.config_checks.finetuning import TASKS, check_finetuning
from bert_jax.config_checks.ranges import Range, check_ranges
from bert_jax.config_checks.tools import (
  check_bertology,
  check_dry_run,
  check_embed,
  check_export,
  check_features,
  check_merge,
  check_mine,
  check_placeholders,
  check_retrieval,
)
from bert_jax.config_checks.training import check_pretraining, check_vocabulary_training
from bert_jax.data import phases
from bert_jax.finetune.members import Member
from bert_jax.model.bert_config import BertConfig

# What the front door and the tests read here besides the mode checks below.
__all__ = [
  "TASKS",
  "Findings",
  "Range",
  "check_finetuning",
  "check_placeholders",
  "check_pretraining",
  "check_ranges",
  "check_vocabulary_training",
]


@dataclasses.dataclass(frozen=True)
class Findings:
  """What checking a config found: the mode, the configured encoder (fine-tuning from `init_from` takes the
  source's sizes instead) and a fine-tuning sweep's members."""

  mode: str
  model: BertConfig | None = None
  members: tuple[Member, ...] = ()


def pretraining(config, mode: str) -> Findings:
  """Pretraining, and preparation (which reads the pretraining config's data and tokenizer keys)."""
  return Findings(mode, check_pretraining(config))


def finetuning(config, mode: str) -> Findings:
  return Findings(mode, *check_finetuning(config))


def ahead_of_time(config, mode: str) -> Findings:
  """The dry run and the plan: the topology, then the job they compile (fine-tuning when `finetune.task` is set)."""
  check_dry_run(config)
  return finetuning(config, mode) if config.finetune.task else pretraining(config, mode)


def features(config, mode: str) -> Findings:
  check_features(config.features)
  return Findings(mode)


def embed(config, mode: str) -> Findings:
  check_embed(config.embed)
  return Findings(mode)


def bertology(config, mode: str) -> Findings:
  check_bertology(config, mode)
  return Findings(mode)


def retrieval(config, mode: str) -> Findings:
  check_retrieval(config)
  return Findings(mode)


def mine(config, mode: str) -> Findings:
  check_mine(config)
  return Findings(mode)


def export(config, mode: str) -> Findings:
  check_export(config.export, config.embedding)
  return Findings(mode)


def data_order(config, mode: str) -> Findings:
  """A pretraining config's checks, and the steps to list."""
  findings = pretraining(config, mode)
  phases.step_list(config.data_order.steps, "data_order.steps")
  return findings


def merge(config, mode: str) -> Findings:
  check_merge(config.merge)
  return Findings(mode)
