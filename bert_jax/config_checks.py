"""Every check of a config that needs no I/O, in one place: value ranges, allowed names and the keys that must agree
with each other, for every mode.

`main` runs `check(config, mode)` once, right after the flags are parsed and before bert_jax's other modules are
imported or anything is written, and ends with one line naming the bad value. The library entry points
(`pretraining.pretrain`, `finetune.job.finetune`, `extract_features.extract`) take its result, or run it themselves
when called from Python. What needs I/O (that a checkpoint fits the config, that `init_from` exists, that files
match) is checked where it is read: train/start_order.py, handoff/pretrained.py, data/manifest.py.

This module imports no TensorFlow and nothing that reads files; the allowed values it checks against live here or
in the leaf that owns them (model.bert_config, train.guard, dry_run.tpu_topology, distributed).
"""

import dataclasses
import functools
import math
from collections.abc import Sequence

from bert_jax import distributed
from bert_jax.data.batch_warmup import MAX_SIZES
from bert_jax.data.instances import SENTENCE_TASKS, check_instances, instance_kind, sentence_task
from bert_jax.data.masking_names import check_masking
from bert_jax.data.tokenizer_names import BPE_FORMATS
from bert_jax.data.tokenizer_names import KINDS as TOKENIZER_KINDS
from bert_jax.dry_run import tpu_topology
from bert_jax.finetune.members import Member, sweep_members
from bert_jax.model.bert_config import (
  PREDICTION_HEAD_FIELDS,
  REMAT_POLICIES,
  BertConfig,
  electra_generator,
  from_fields,
)
from bert_jax.train.guard import POLICIES
from bert_jax.train.objectives.registry import NAMES as OBJECTIVES
from bert_jax.train.optim import LR_SCHEDULES, OPTIMIZERS, WSD_DECAYS, wsd_decay_steps


@dataclasses.dataclass(frozen=True)
class Range:
  """The values a numeric config key may take: from `low` to `high`, each end included unless open. NaN is in no
  range, and `inf` only in one that includes it."""

  low: float
  high: float = math.inf
  low_open: bool = False
  high_open: bool = True

  def __contains__(self, value) -> bool:
    above = self.low < value if self.low_open else self.low <= value
    below = value < self.high if self.high_open else value <= self.high
    return above and below

  def __str__(self) -> str:
    if self.high == math.inf and self.high_open:
      if self.low == 0:
        return "positive" if self.low_open else "non-negative"
      return f"greater than {self.low}" if self.low_open else f"at least {self.low}"
    return f"in {'(' if self.low_open else '['}{self.low}, {self.high}{')' if self.high_open else ']'}"


POSITIVE = Range(0, low_open=True)
NON_NEGATIVE = Range(0)
AT_LEAST_ONE = Range(1)

DATA_SOURCES = ("pretraining", "synthetic")
EMBEDDED_CORPORA = ("", "python_docs")  # data.embedded_corpus: none, or the text of Python's own documentation.
# finetune.task: GLUE's nine, SQuAD, CoNLL-2003 and SWAG (finetune/tasks.py builds them; a test keeps the two equal).
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
)
EXPORT_FORMATS = ("bundle", "huggingface", "google")


def check_ranges(config, ranges: Sequence[tuple]) -> None:
  """Raises ValueError naming the key, its value and its range for the first (dotted key, Range[, hint]) of `ranges`
  whose value is out of range; the hint follows the message."""
  for key, allowed, *hint in ranges:
    value = functools.reduce(lambda node, name: node[name], key.split("."), config)
    if value not in allowed:
      raise ValueError(" ".join([f"{key}={value} must be {allowed}.", *hint]))


# Every training run, pretraining or fine-tuning; `model.*` keys: BertConfig checks them.
TRAINING = (
  ("seed", NON_NEGATIVE),
  ("batch_size", AT_LEAST_ONE),
  ("num_train_steps", AT_LEAST_ONE),
  ("warmup_steps", NON_NEGATIVE),
  ("schedule_end_step", NON_NEGATIVE, "0 ends the schedule at num_train_steps."),
  ("learning_rate", POSITIVE),
  ("adam_b1", Range(0, 1)),
  ("adam_b2", Range(0, 1)),
  ("adam_eps", POSITIVE),
  ("weight_decay", NON_NEGATIVE),
  ("lr_decay_fraction", Range(0, 1, high_open=False), "(wsd's decay: a fraction of the schedule's steps)"),
  ("lr_decay_floor", Range(0, 1, high_open=False), "(wsd's final rate: a fraction of learning_rate)"),
  ("max_grad_norm", Range(0, math.inf, low_open=True, high_open=False), "inf disables clipping."),
  ("log_every_steps", AT_LEAST_ONE),
  ("checkpoint_every_steps", AT_LEAST_ONE),
  ("keep_checkpoints", AT_LEAST_ONE),
  ("lease_timeout_seconds", POSITIVE),
  ("guard.spike_window", AT_LEAST_ONE),
  ("guard.max_consecutive_skips", AT_LEAST_ONE),
)

PRETRAINING = (
  ("data.masked_lm_prob", Range(0, 1, low_open=True, high_open=False)),
  ("data.eval_masked_lm_prob", Range(0, 1, high_open=False), "0: evaluation masks at data.masked_lm_prob."),
  ("data.mask_token_fraction", Range(0, 1, high_open=False)),
  ("data.random_token_fraction", Range(0, 1, high_open=False)),
  ("data.span_geometric_p", Range(0, 1, low_open=True, high_open=False)),
  ("data.span_max_words", AT_LEAST_ONE),
  ("data.short_seq_prob", Range(0, 1, high_open=False)),
  ("data.shuffle_buffer", AT_LEAST_ONE),
  ("data.num_readers", NON_NEGATIVE, "0: one per host of the first launch."),
  ("data.max_instances_per_row", AT_LEAST_ONE),
  ("data.packing_group", AT_LEAST_ONE),
  ("data.num_shards", AT_LEAST_ONE),
  ("data.prepare_unit_bytes", Range(1024)),
  ("data.max_document_bytes", Range(1024)),
  ("data.eval_fraction", Range(0, 0.5, high_open=False)),
  ("data.eval_min_documents", NON_NEGATIVE),
  ("eval_every_steps", AT_LEAST_ONE),
  ("profile.start_step", NON_NEGATIVE, "0: no profile."),
  ("profile.num_steps", AT_LEAST_ONE),
  ("eval_steps", NON_NEGATIVE, "0 disables evaluation."),
  ("batch_warmup_tokens", NON_NEGATIVE, "0: no batch-size warmup."),
)

# ELECTRA (objective="electra"): the generator's size and the loss; checked in every pretraining config.
ELECTRA = (
  ("electra.generator_hidden_fraction", Range(0, 1, low_open=True, high_open=False)),
  ("electra.generator_layers_fraction", Range(0, 1, low_open=True, high_open=False)),
  ("electra.rtd_weight", NON_NEGATIVE),
  ("electra.sampling_temperature", POSITIVE),
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

# Distillation, in pretraining (objective="distillation") and fine-tuning (distill.teacher set).
DISTILLATION = (
  ("distill.temperature", POSITIVE),
  ("distill.alpha_ce", NON_NEGATIVE),
  ("distill.alpha_mlm", NON_NEGATIVE),
  ("distill.alpha_cos", NON_NEGATIVE),
  ("distill.alpha_hard", Range(0, 1, high_open=False)),
)

FEATURES = (
  ("features.max_seq_length", Range(3), "([CLS] x [SEP])"),
  ("features.batch_size", AT_LEAST_ONE),
  ("features.lines_per_shard", AT_LEAST_ONE),
)

BERTOLOGY = (
  ("bertology.max_seq_length", Range(3), "([CLS] x [SEP])"),
  ("bertology.batch_size", AT_LEAST_ONE),
  ("bertology.prune_step", Range(0, 1, low_open=True, high_open=False)),
  ("bertology.prune_max", Range(0, 1, high_open=False)),
  ("bertology.probe_epochs", AT_LEAST_ONE),
  ("bertology.probe_learning_rate", POSITIVE),
  ("bertology.lstm_layers", AT_LEAST_ONE),
  ("bertology.lstm_size", AT_LEAST_ONE),
)
PROBE_POOLING = ("mean", "cls")
FEATURE_COMBINE = ("concat", "sum")


@dataclasses.dataclass(frozen=True)
class Checked:
  """What checking a config found: the mode, the configured encoder (fine-tuning from `init_from` takes the
  source's sizes instead) and a fine-tuning sweep's members."""

  mode: str
  model: BertConfig | None = None
  members: tuple[Member, ...] = ()


def model_config(config, source: BertConfig | None = None) -> BertConfig:
  """`config.model` as the model's own dataclass, which checks its values; the prediction-head fields it leaves unset
  are `source`'s, else transformers' defaults (`bert_config.from_fields`)."""
  return from_fields(config.model.to_dict(), source)


def check_training(config) -> BertConfig:
  """The keys every training run has; returns the configured encoder."""
  check_ranges(config, TRAINING)
  if config.optimizer not in OPTIMIZERS:
    raise ValueError(f"optimizer={config.optimizer!r} is not supported; expected one of {tuple(OPTIMIZERS)}.")
  if config.lr_schedule not in LR_SCHEDULES:
    raise ValueError(f"lr_schedule={config.lr_schedule!r} is not supported; expected one of {LR_SCHEDULES}.")
  if config.lr_decay not in WSD_DECAYS:
    raise ValueError(f"lr_decay={config.lr_decay!r} is not supported; expected one of {tuple(WSD_DECAYS)}.")
  if config.num_microbatches < 1 or config.batch_size % config.num_microbatches:
    raise ValueError(
      f"num_microbatches={config.num_microbatches} must be at least 1 and divide batch_size={config.batch_size}."
    )
  if config.guard.nonfinite not in POLICIES:
    raise ValueError(f"guard.nonfinite={config.guard.nonfinite!r}; expected one of {POLICIES}.")
  if not (config.guard.spike_factor == 0 or config.guard.spike_factor > 1):
    raise ValueError(f"guard.spike_factor={config.guard.spike_factor} must be 0 (off) or greater than 1.")
  if not 0 <= config.peak_tflops_per_device < math.inf:
    raise ValueError(
      f"peak_tflops_per_device={config.peak_tflops_per_device} must be positive (0: look up the device kind)."
    )
  distributed.settings(config.distributed)
  return model_config(config)


def check_pretraining(config) -> BertConfig:
  """Pretraining's keys and how they fit together; returns the model config."""
  model = check_training(config)
  check_ranges(config, PRETRAINING)
  seq, preds = config.data.max_seq_length, config.data.max_predictions_per_seq
  if seq > model.max_sequence_length:
    raise ValueError(
      f"data.max_seq_length={seq} exceeds {model.max_sequence_text}: positions beyond it have no embedding."
    )
  if seq < 5:
    raise ValueError(f"data.max_seq_length={seq} cannot fit a pair: [CLS] A [SEP] B [SEP] needs at least 5.")
  if not 0 < preds <= seq:
    raise ValueError(f"data.max_predictions_per_seq={preds} must be in [1, data.max_seq_length={seq}].")
  _check_masking(config.data)
  if config.schedule_end_step and config.schedule_end_step < config.num_train_steps:
    raise ValueError(
      f"schedule_end_step={config.schedule_end_step} is before num_train_steps={config.num_train_steps}: the "
      "learning rate would reach zero before training ends (0: end the schedule at num_train_steps)."
    )
  end_step = config.schedule_end_step or config.num_train_steps
  if config.warmup_steps > end_step:
    raise ValueError(f"warmup_steps={config.warmup_steps} must be within [0, num_train_steps={end_step}].")
  decay_steps = wsd_decay_steps(config.lr_decay_fraction, end_step)
  if config.lr_schedule == "wsd" and config.warmup_steps + decay_steps > end_step:
    raise ValueError(
      f"lr_decay_fraction={config.lr_decay_fraction} is {decay_steps} of the schedule's {end_step} steps, more than "
      f"the {end_step - config.warmup_steps} after warmup_steps={config.warmup_steps}: expected at most "
      f"{(end_step - config.warmup_steps) / end_step:g} (wsd's decay follows warmup)."
    )
  if config.data.embedded_corpus not in EMBEDDED_CORPORA:
    raise ValueError(f"data.embedded_corpus={config.data.embedded_corpus!r}; expected one of {EMBEDDED_CORPORA}.")
  if config.data.source not in DATA_SOURCES:
    raise ValueError(f"data.source={config.data.source!r}; expected one of {DATA_SOURCES}.")
  check_instances(config.data)
  check_vocabulary_training(config)
  task = sentence_task(config.data)
  if task and not model.architecture.has_sentence_head:
    raise ValueError(
      f"data.instances={config.data.instances!r} trains a sentence task ({task}), and model.model_type="
      f"{model.model_type!r} has no sentence head (it trains a masked LM alone): set data.instances to "
      "'full_sentences' or 'doc_sentences'."
    )
  check_ranges(config, ELECTRA)
  readers = config.data.num_readers
  if config.data.source == "pretraining" and readers and config.batch_size % readers:
    raise ValueError(
      f"batch_size={config.batch_size} does not split over data.num_readers={readers}: each reader makes an equal "
      "part of every batch."
    )
  _check_batch_warmup(config)
  check_objective(config, model)
  return model


def check_vocabulary_training(config) -> None:
  """The tokenizer keys that training a vocabulary reads (--mode=prepare with a missing tokenizer.path:
  data/tokenizer/training.py, which also runs this when called from Python)."""
  if config.tokenizer.kind not in TOKENIZER_KINDS:
    raise ValueError(f"tokenizer.kind={config.tokenizer.kind!r}; expected one of {TOKENIZER_KINDS}.")
  if config.tokenizer.train_bpe_format not in BPE_FORMATS:
    raise ValueError(
      f"tokenizer.train_bpe_format={config.tokenizer.train_bpe_format!r}; expected one of {BPE_FORMATS}."
    )
  check_ranges(config, (("tokenizer.train_max_sentences", AT_LEAST_ONE),))


def _check_batch_warmup(config) -> None:
  """The batch-size warmup's keys (data/batch_warmup.py; `batch_warmup_tokens`' range: PRETRAINING): its sizes,
  batch_warmup_start, 2 x, ... up to batch_size, split as batch_size must (the mesh's share: `pretraining.make_run`;
  the readers a resume takes from its checkpoint: `pretraining_start.run_readers`)."""
  tokens, start, batch = config.batch_warmup_tokens, config.batch_warmup_start, config.batch_size
  if not tokens:
    return
  if not 0 < start < batch:
    raise ValueError(
      f"batch_warmup_start={start} must be in [1, batch_size={batch}): the warmup's first batch, in rows "
      f"(batch_warmup_tokens={tokens})."
    )
  if batch % start:
    raise ValueError(
      f"batch_size={batch} is not a multiple of batch_warmup_start={start}: the warmup's sizes are {start}, "
      f"{2 * start}, ... up to batch_size."
    )
  if batch // start > MAX_SIZES:
    raise ValueError(
      f"batch_warmup_start={start} makes {batch // start} batch sizes up to batch_size={batch}, each its own compiled "
      f"train step; expected at most {MAX_SIZES}: a batch_warmup_start of at least {-(-batch // MAX_SIZES)} that "
      "divides batch_size."
    )
  if start % config.num_microbatches:
    raise ValueError(
      f"batch_warmup_start={start} does not split into num_microbatches={config.num_microbatches}: every size of the "
      "warmup is processed in them, as batch_size is."
    )
  readers = config.data.num_readers
  if config.data.source == "pretraining" and readers and start % readers:
    raise ValueError(
      f"batch_warmup_start={start} does not split over data.num_readers={readers}: each reader makes an equal part "
      "of every batch, the warmup's too."
    )


def _check_masking(data) -> None:
  """The masking keys that must agree (their ranges: PRETRAINING): `data.masking` names a scheme, the older keys
  beside it agree with it (data/masking_names.py), the replacement fractions fit. A masked_lm_prob that
  max_predictions_per_seq caps is allowed: the run's header gives the rate a full sequence gets, with a warning."""
  check_masking(data)
  fractions = data.mask_token_fraction + data.random_token_fraction
  if fractions > 1 + 1e-9:  # Up to rounding: 0.7 and 0.3 are fine.
    raise ValueError(
      f"data.mask_token_fraction={data.mask_token_fraction} and data.random_token_fraction="
      f"{data.random_token_fraction} add up to {fractions:g}, more than 1: the rest stays unchanged, so they must add "
      "up to at most 1."
    )


def check_objective(config, model: BertConfig) -> None:
  """`config.objective` and, for distillation, `config.distill`'s pretraining keys; ELECTRA's generator."""
  if config.objective not in OBJECTIVES:
    raise ValueError(f"objective={config.objective!r}; expected one of {OBJECTIVES}.")
  if (config.objective == "electra") != (model.model_type == "electra"):
    raise ValueError(
      f"objective={config.objective!r} with model.model_type={model.model_type!r}: ELECTRA trains a discriminator "
      "of model_type 'electra' (its Hugging Face names), and only ELECTRA does; set both or neither."
    )
  kind = instance_kind(config.data)
  if config.objective != "bert" and kind in SENTENCE_TASKS:
    raise ValueError(
      f"objective={config.objective!r} with data.instances={kind!r}: this objective has no sentence task, so its "
      f"loss would never read the {kind!r} labels, while the rows would still hold their pairs; set "
      "data.instances='doc_sentences' or 'full_sentences'."
    )
  if config.objective == "electra":
    electra_generator(config, model)
  settings = config.distill
  if config.objective != "distillation":
    if settings.teacher:
      raise ValueError(
        f"distill.teacher={settings.teacher!r} is set, but objective={config.objective!r}: set "
        "objective='distillation' to distil from it, or unset it."
      )
    return
  if not settings.teacher:
    raise ValueError("objective='distillation' needs distill.teacher: the model to distil from.")
  check_ranges(config, DISTILLATION)
  if not settings.alpha_ce + settings.alpha_mlm + settings.alpha_cos > 0:
    raise ValueError("distill.alpha_ce, alpha_mlm and alpha_cos are all 0: nothing to train on.")
  layers = tuple(settings.student_layers)
  if layers and (len(layers) != model.num_layers or not all(isinstance(i, int) and i >= 0 for i in layers)):
    raise ValueError(
      f"distill.student_layers={layers} must name one teacher layer (from 0) per student layer: "
      f"model.num_layers={model.num_layers} of them (empty: every other one, 0, 2, 4, ...)."
    )


def check_fine_tunable(model: BertConfig, where: str = "") -> None:
  """Raises ValueError naming the field (after `where`, the source it came from) that the family's fine-tuning heads
  (model/heads.py, by `Architecture.task_head`) cannot honour: BERT's ("bert": dropout `hidden_dropout_prob` and a
  dense layer on the pooler's output or on every token) read none of ModernBERT's `classifier_*`, so a value other
  than the default is refused rather than ignored."""
  if model.architecture.task_head != "bert":
    return
  default = BertConfig()
  for name in PREDICTION_HEAD_FIELDS:
    if getattr(model, name) != getattr(default, name):
      raise ValueError(
        f"{where}model.{name}={getattr(model, name)!r} sets ModernBERT's task heads, and model.model_type="
        f"{model.model_type!r} fine-tunes with BERT's (dropout and a dense layer on the pooler's [CLS] output, or on "
        f"every token), which read none of them: leave it at {getattr(default, name)!r}."
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
  if config.distill.teacher:
    check_ranges(config, DISTILLATION)
  if not config.init_from:  # A baseline fine-tunes config.model; init_from's encoder is checked where it is described.
    check_fine_tunable(model)
    if config.finetune.max_seq_length > model.max_sequence_length:
      raise ValueError(f"finetune.max_seq_length={config.finetune.max_seq_length} exceeds {model.max_sequence_text}.")
  return model, sweep_members(config)


def check_features(settings) -> None:
  """`config.features`, for --mode=features."""
  if not settings.input_pattern or not settings.output_dir:
    raise ValueError("--mode=features needs features.input_pattern and features.output_dir.")
  check_ranges({"features": settings}, FEATURES)
  if not 0 < settings.doc_stride <= settings.max_seq_length - 2:
    raise ValueError(
      f"features.doc_stride={settings.doc_stride} must be in [1, max_seq_length - 2 = {settings.max_seq_length - 2}]."
    )
  if not settings.layers:
    raise ValueError("features.layers is empty: name at least one layer (-1: the last).")


def check_bertology(config, mode: str) -> None:
  """`config.bertology` for --mode=attention, heads, probe and feature_based (all but attention also read
  `config.finetune`'s task)."""
  settings = config.bertology
  if mode == "attention" and (not settings.input_pattern or not settings.output_dir):
    raise ValueError(f"--mode={mode} needs bertology.input_pattern and bertology.output_dir.")
  if mode in ("heads", "probe", "feature_based"):
    if not settings.output_dir:
      raise ValueError(f"--mode={mode} needs bertology.output_dir.")
    what = "the model was fine-tuned on" if mode == "heads" else "to train on"
    if config.finetune.task not in TASKS:
      raise ValueError(
        f"--mode={mode} needs finetune.task, the task {what} (and finetune.data_dir, its files; configs/glue.py, "
        f"...): got {config.finetune.task!r}, expected one of {TASKS}."
      )
  check_ranges({"bertology": settings}, BERTOLOGY)
  if settings.probe_pooling not in PROBE_POOLING:
    raise ValueError(f"bertology.probe_pooling={settings.probe_pooling!r}; expected one of {PROBE_POOLING}.")
  if settings.feature_combine not in FEATURE_COMBINE:
    raise ValueError(f"bertology.feature_combine={settings.feature_combine!r}; expected one of {FEATURE_COMBINE}.")
  if not settings.feature_layers:
    raise ValueError("bertology.feature_layers is empty: name at least one layer (-1: the last).")
  if not all(isinstance(number, int) and number >= 0 for number in settings.show_lines):
    raise ValueError(f"bertology.show_lines={tuple(settings.show_lines)} must be line numbers, from 0.")


def check_dry_run(config) -> None:
  """The topology to compile for: a Cloud TPU accelerator type, or none (this machine) with one slice."""
  if config.dry_run.topology:
    tpu_topology.parse(config.dry_run.topology, config.dry_run.num_slices)
  elif config.dry_run.num_slices != 1:
    raise ValueError(f"dry_run.num_slices={config.dry_run.num_slices} needs dry_run.topology (a TPU slice).")
  unknown = [name for name in config.dry_run.plan_remat if name not in REMAT_POLICIES]
  if unknown or not config.dry_run.plan_remat:
    raise ValueError(
      f"dry_run.plan_remat={tuple(config.dry_run.plan_remat)!r}: expected one or more of {REMAT_POLICIES}."
    )
  if config.dry_run.plan_min_microbatch_tokens < 1:
    raise ValueError(
      f"dry_run.plan_min_microbatch_tokens={config.dry_run.plan_min_microbatch_tokens}: expected a positive number "
      "of tokens a chip."
    )


# The bucket name the shipped configs and their docstrings' commands write where the user's own goes (gs://BUCKET/...).
PLACEHOLDER_BUCKET = "BUCKET"


def _strings(node, prefix: str = ""):
  """(dotted key, value) of every string value under `node` (a ConfigDict or dict)."""
  for name, value in node.items():
    if isinstance(value, str):
      yield f"{prefix}{name}", value
    elif hasattr(value, "items"):
      yield from _strings(value, f"{prefix}{name}.")


def check_placeholders(config, mode: str) -> None:
  """Refuses a path that still names the placeholder bucket (`gs://BUCKET/...`, as configs/distil.py ships its
  teacher and configs/large_phase2.py its init_from) before anything reads it: else a run spends a minute on
  credential retries and ends in a network traceback that never names the key. A dry run reads the metadata of the
  teacher and of a fine-tuning run's init_from only (a pretraining phase 2 compiles without its phase 1); every
  other mode may read any path key."""
  dry_run_reads = ("distill.teacher", "init_from") if config.finetune.task else ("distill.teacher",)
  for key, value in _strings(config):
    if mode in ("dry_run", "plan") and key not in dry_run_reads:
      continue
    scheme, separator, rest = value.partition("://")
    if separator and scheme and rest.split("/", 1)[0] == PLACEHOLDER_BUCKET:
      raise ValueError(
        f"{key}={value!r} names the placeholder bucket {PLACEHOLDER_BUCKET} (as the shipped config writes it): set "
        f"{key} to the real path (local or gs://your-bucket/...)."
      )


def check(config, mode: str) -> Checked:
  """Every I/O-free check of `config` for `mode` (main's modes); raises ValueError naming the first bad value."""
  check_placeholders(config, mode)
  if mode in ("pretrain", "prepare"):  # Preparation reads the pretraining config's data keys.
    return Checked(mode, check_pretraining(config))
  if mode == "finetune":
    return Checked(mode, *check_finetuning(config))
  if mode in ("dry_run", "plan"):
    check_dry_run(config)
    if config.finetune.task:
      return Checked(mode, *check_finetuning(config))
    return Checked(mode, check_pretraining(config))
  if mode == "features":
    check_features(config.features)
  elif mode in ("attention", "heads", "probe", "feature_based"):
    check_bertology(config, mode)
  elif mode == "export":
    if config.export.format not in EXPORT_FORMATS:
      raise ValueError(f"export.format={config.export.format!r}; expected one of {EXPORT_FORMATS}.")
    if not config.export.dir:
      raise ValueError("export.dir is empty: name the directory to write (local or gs://).")
  else:
    raise ValueError(f"--mode={mode!r} is not a mode.")
  return Checked(mode)
