"""The front door: every job by mode, in one table, each checked once and dispatched.

`run(config, workdir, mode)` is how a job is started from Python (the notebook, the tests, the benchmarks); `main`
runs the same two halves with its process set up between them: `check` (the mode, then every I/O-free check of the
config: `config_checks`, once, before anything is imported, read or written), then `start` (the job's entry with
what checking found). The entries take that (the model config, a sweep's members) as arguments and never check a
config themselves; nothing else in the package imports `config_checks`.

A job is one entry of `JOBS`: its check (a function of `config_checks`), its entry (below: it imports the job's
module when the job starts, so that the table stays light, and hands it what checking found) and how it runs
(`Job`'s fields). Adding a job is its module, its check and one entry here.
"""

import dataclasses
from collections.abc import Callable

from bert_jax import config_checks


@dataclasses.dataclass(frozen=True)
class Job:
  """One mode: what it does (the `--mode` help), its check, its entry, and how it runs."""

  summary: str
  check: Callable  # (config, mode) -> config_checks.Findings
  entry: Callable  # (config, workdir, checked) -> what the job returns; imports its module when called.
  one_machine: bool = False  # Runs on one machine: a distributed setting is refused.
  joins_job: bool = False  # Joins a multi-host job (`distributed.initialize`) before it touches a device.
  compiles_ahead: bool = False  # Compiles for a TPU topology or fake CPU devices; runs nothing.


def _pretrain(config, workdir: str, checked):
  from bert_jax.train import pretraining

  return pretraining.pretrain(config, workdir, checked.model)


def _finetune(config, workdir: str, checked):
  from bert_jax.finetune import job

  return job.finetune(config, workdir, checked.members)


def _prepare(config, workdir: str, checked):
  from bert_jax.data import prepare

  return prepare.prepare_for_run(config, workdir)


def _dry_run(config, workdir: str, checked):
  from bert_jax.dry_run import ahead_of_time

  return ahead_of_time.dry_run(config, checked.model, checked.members)


def _plan(config, workdir: str, checked):
  from bert_jax.dry_run import planner

  return planner.plan(config, checked.model, checked.members)


def _export(config, workdir: str, checked):
  from bert_jax.handoff import export

  settings = config.export
  return export.export(
    settings.source or workdir, settings.dir, settings.format, settings.overwrite, embedding=config.embedding
  )


def _data_order(config, workdir: str, checked):
  from bert_jax.train import data_order

  return data_order.list_order(config, workdir, checked.model)


def _merge(config, workdir: str, checked):
  from bert_jax.handoff import merge

  return merge.merge(config.merge, workdir)


def _features(config, workdir: str, checked):
  from bert_jax.handoff import extract_features

  return extract_features.extract(config, workdir)


def _embed(config, workdir: str, checked):
  from bert_jax.retrieval import embed_files

  return embed_files.embed(config, workdir)


def _retrieve(config, workdir: str, checked):
  from bert_jax.retrieval import evaluation

  return evaluation.evaluate(config, workdir)


def _mine(config, workdir: str, checked):
  from bert_jax.finetune import hard_negatives

  return hard_negatives.mine(config, workdir)


def _bertology(config, workdir: str, checked):
  from bert_jax.bertology import attention, feature_based, heads, probe

  analyses = dict(attention=attention, heads=heads, probe=probe, feature_based=feature_based)
  return analyses[checked.mode].analyse(config, workdir)


JOBS = {
  "pretrain": Job("pretrain (resuming from the workdir).", config_checks.pretraining, _pretrain, joins_job=True),
  "finetune": Job(
    "fine-tune finetune.task (resuming from the workdir).",
    config_checks.finetuning,
    _finetune,
    joins_job=True,
  ),
  "prepare": Job(
    "train the vocabulary if tokenizer.path is missing, then tokenize data.input_pattern / data.tfds_name into "
    "data.prepared_dir.",
    config_checks.pretraining,
    _prepare,
  ),
  "dry_run": Job(
    "compile the train and eval steps on abstract inputs and report per-chip memory, whether it fits, FLOPs, "
    "collectives and parameter shardings, for dry_run.topology (a Cloud TPU accelerator type, e.g. v5p-128; needs "
    "libtpu) or this machine (on CPU, a mesh with no -1 gets that many fake devices).",
    config_checks.ahead_of_time,
    _dry_run,
    compiles_ahead=True,
  ),
  "plan": Job(
    "the remat policy with the least recomputation that fits dry_run.topology at the config's batch (and, with "
    "dry_run.plan_largest, each policy's largest per-chip batch).",
    config_checks.ahead_of_time,
    _plan,
    compiles_ahead=True,
  ),
  "export": Job(
    "write the workdir's newest checkpoint (or export.source) to export.dir as export.format (bundle, huggingface, "
    "google, sentence-transformers: embedding.* where set).",
    config_checks.export,
    _export,
    one_machine=True,
  ),
  "data_order": Job(
    "list the documents of data_order.steps of the pretraining stream (each row's source, shard file and document "
    "number), as the run reads them on any host count; data_order.output: also as JSONL.",
    config_checks.data_order,
    _data_order,
    one_machine=True,
  ),
  "merge": Job(
    "the (weighted) mean of checkpoints of one model, written as a bundle to merge.output_dir: the workdir's last "
    "merge.last checkpoints, its merge.steps, or merge.sources' (workdirs, steps, bundles); merge.ema: their moving "
    "averages of the parameters (ema_decay).",
    config_checks.merge,
    _merge,
    one_machine=True,
  ),
  "features": Job(
    "per-token vectors of features.input_pattern's lines into features.output_dir (.npz).",
    config_checks.features,
    _features,
    one_machine=True,
  ),
  "embed": Job(
    "sentence embeddings of embed.input_pattern's texts (text lines or JSONL) with their ids into embed.output_dir "
    "(embeddings.npy, ids.json, manifest.json).",
    config_checks.embed,
    _embed,
    one_machine=True,
  ),
  "retrieve": Job(
    "retrieval metrics (nDCG@10, MRR@10, recall@10 and @100, MAP@100, as BEIR computes them) of retrieval.source on "
    "the BEIR-layout set in retrieval.data_dir (its retrieval.split), exact search over the mesh, into "
    "retrieval.output_dir/metrics.json.",
    config_checks.retrieval,
    _retrieve,
    one_machine=True,
  ),
  "mine": Job(
    "hard negatives for mine.pairs_file's (anchor, positive) pairs from mine.corpus_file's documents (and the "
    "positives), as sentence-transformers' mine_hard_negatives picks them, into mine.output_dir/negatives.jsonl.",
    config_checks.mine,
    _mine,
    one_machine=True,
  ),
  "attention": Job(
    "what each attention head looks at over bertology.input_pattern's lines (entropy, [CLS], [SEP], "
    "previous/next/self, distance) into bertology.output_dir (JSON, PNG heat maps and attention maps).",
    config_checks.bertology,
    _bertology,
    one_machine=True,
  ),
  "heads": Job(
    "each attention head's importance to a model fine-tuned on finetune.task (its dev split), and the metric as "
    "heads are pruned, into bertology.output_dir.",
    config_checks.bertology,
    _bertology,
    one_machine=True,
  ),
  "probe": Job(
    "linear probes for finetune.task on each frozen layer and on their learned scalar mix.",
    config_checks.bertology,
    _bertology,
    one_machine=True,
  ),
  "feature_based": Job(
    "the BERT paper's BiLSTM tagger for finetune.task on frozen layers (bertology.feature_layers).",
    config_checks.bertology,
    _bertology,
    one_machine=True,
  ),
}


def mode_of(config, mode: str | None = None) -> str:
  """The job: `mode`, else finetune when the config names a task, else pretrain. Raises ValueError for a mode that
  is not in the table or that the config contradicts."""
  task = config.finetune.task
  mode = mode or ("finetune" if task else "pretrain")
  if mode not in JOBS:
    raise ValueError(f"--mode={mode!r} is not a mode; expected one of {tuple(JOBS)}.")
  if mode == "pretrain" and task:
    raise ValueError(
      f"--mode=pretrain, but the config sets finetune.task={task!r}: use --mode=finetune, or unset the task."
    )
  if mode == "finetune" and not task:
    raise ValueError("--mode=finetune needs finetune.task (configs/glue.py, squad.py, ner.py and swag.py set it).")
  return mode


def check(config, mode: str | None = None) -> config_checks.Findings:
  """Every I/O-free check of `config` for its mode (`mode_of`), once; raises ValueError naming the first bad value."""
  mode = mode_of(config, mode)
  config_checks.check_placeholders(config, mode)
  return JOBS[mode].check(config, mode)


def start(config, workdir: str, checked: config_checks.Findings):
  """Starts `checked.mode`'s job on `config` (which `check` found good) in `workdir`; returns what its entry
  returns."""
  return JOBS[checked.mode].entry(config, workdir, checked)


def run(config, workdir: str, mode: str | None = None):
  """Checks `config` for its job, then runs the job: what `python -m bert_jax.main` does, from Python."""
  return start(config, workdir, check(config, mode))
