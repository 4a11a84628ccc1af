"""The checks of a training run's keys: every training run's (`check_training`), pretraining's and its objectives'
(`check_pretraining`), and the tokenizer keys that training a vocabulary reads."""

import math

from bert_jax import distributed
from bert_jax.config_checks.ranges import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, Range, check_ranges
from bert_jax.data import mixture, phases
from bert_jax.data.batch_warmup import MAX_SIZES, BatchSchedule
from bert_jax.data.input_formats import check_input_format
from bert_jax.data.instances import SENTENCE_TASKS, check_instances, instance_kind, sentence_task
from bert_jax.data.masking_names import check_masking, masking_scheme
from bert_jax.data.masking_schedule import KEY as MASKING_PHASES
from bert_jax.data.masking_schedule import MaskingRates, phase_rates
from bert_jax.data.tokenizer_names import BPE_FORMATS
from bert_jax.data.tokenizer_names import KINDS as TOKENIZER_KINDS
from bert_jax.model.bert_config import BertConfig, electra_generator, model_config
from bert_jax.model.sentence_embedding import POOLINGS
from bert_jax.train.guard import POLICIES
from bert_jax.train.objectives.registry import NAMES as OBJECTIVES
from bert_jax.train.optim import LR_SCHEDULES, OPTIMIZERS, WSD_DECAYS, wsd_decay_steps

DATA_SOURCES = ("pretraining", "synthetic")
EMBEDDED_CORPORA = ("", "python_docs")  # data.embedded_corpus: none, or the text of Python's own documentation.


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
  ("ema_decay", Range(0, 1), "0: no moving average of the parameters."),
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

# The retrieval probe (retrieval_probe.data_dir set): train/retrieval_probe.py.
RETRIEVAL_PROBE = (
  ("retrieval_probe.max_seq_length", NON_NEGATIVE, "0: data.max_seq_length."),
  ("retrieval_probe.batch_size", NON_NEGATIVE, "0: batch_size / num_microbatches."),
  ("retrieval_probe.max_queries", NON_NEGATIVE, "0: every judged query."),
)

# ELECTRA (objective="electra"): the generator's size and the loss; checked in every pretraining config.
ELECTRA = (
  ("electra.generator_hidden_fraction", Range(0, 1, low_open=True, high_open=False)),
  ("electra.generator_layers_fraction", Range(0, 1, low_open=True, high_open=False)),
  ("electra.rtd_weight", NON_NEGATIVE),
  ("electra.sampling_temperature", POSITIVE),
)

# SpanBERT's span-boundary objective (objective="span_boundary"): its head's position table and width.
SPAN_BOUNDARY = (
  ("span_boundary.max_span_tokens", AT_LEAST_ONE),
  ("span_boundary.position_embedding_size", AT_LEAST_ONE),
)

# Distillation, in pretraining (objective="distillation") and fine-tuning (distill.teacher set).
DISTILLATION = (
  ("distill.temperature", POSITIVE),
  ("distill.alpha_ce", NON_NEGATIVE),
  ("distill.alpha_mlm", NON_NEGATIVE),
  ("distill.alpha_cos", NON_NEGATIVE),
  ("distill.alpha_hard", Range(0, 1, high_open=False)),
)


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
  check_input_format(config.data)
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
  _check_masking_phases(config)
  _check_mixture(config)
  check_objective(config, model)
  check_retrieval_probe(config, model)
  return model


def _check_mixture(config) -> None:
  """A mixture (`data/mixture.py`): its sources and phases well formed, in order, and it replaces the one corpus
  (data.prepared_dir, data.embedded_corpus) of the prepared source; what the sources hold is checked when they are
  opened (data/corpus.py), before anything is written."""
  data = config.data
  if not data.mixture_sources:
    if data.mixture_phases:
      raise ValueError(f"data.mixture_phases={data.mixture_phases!r} without data.mixture_sources: nothing to mix.")
    return
  if data.source != "pretraining" or data.prepared_dir or data.embedded_corpus or not config.tokenizer.path:
    raise ValueError(
      f"data.mixture_sources={data.mixture_sources!r} reads prepared corpora through the pipeline: it needs "
      f"data.source='pretraining' (got {data.source!r}), tokenizer.path set (got {config.tokenizer.path!r}) and "
      f"neither data.prepared_dir (got {data.prepared_dir!r}) nor data.embedded_corpus (got "
      f"{data.embedded_corpus!r})."
    )
  written, _ = mixture.schedule(data)
  phases.begin_steps(written, BatchSchedule.of(config), mixture.PHASES_KEY)


def check_retrieval_probe(config, model: BertConfig) -> None:
  """`config.retrieval_probe` (and the `config.embedding` it embeds by) when its data_dir is set; the set itself is
  read and checked where the run is made (train/retrieval_probe.py), before anything is written."""
  probe = config.retrieval_probe
  if not probe.data_dir:
    return
  check_ranges(config, RETRIEVAL_PROBE)
  if config.data.source != "pretraining":
    raise ValueError(
      f"retrieval_probe.data_dir={probe.data_dir!r} with data.source={config.data.source!r}: the probe tokenizes its "
      "set with the run's tokenizer, and the synthetic source has none; set data.source='pretraining' or unset "
      "retrieval_probe.data_dir."
    )
  if not config.eval_steps:
    raise ValueError(
      f"retrieval_probe.data_dir={probe.data_dir!r} with eval_steps=0: the probe runs at each evaluation, and "
      "eval_steps=0 disables them; set eval_steps or unset retrieval_probe.data_dir."
    )
  if not probe.split:
    raise ValueError("retrieval_probe.split is empty; expected the split whose qrels/<split>.tsv scores the probe.")
  seq = probe.max_seq_length or config.data.max_seq_length
  if not 2 < seq <= model.max_sequence_length:
    raise ValueError(
      f"retrieval_probe.max_seq_length={probe.max_seq_length} (0: data.max_seq_length) gives rows of {seq} tokens; "
      f"expected more than a row's special tokens and at most {model.max_sequence_text}."
    )
  embedding = config.embedding
  if embedding.pooling not in (None, *POOLINGS):
    raise ValueError(f"embedding.pooling={embedding.pooling!r}; expected one of {POOLINGS} (None: mean).")


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


def _check_masking_phases(config) -> None:
  """`data.masking_phases` (data/masking_schedule.py): phases that parse, in order, each rate in (0,
  data.masked_lm_prob], the rate every instance is selected at before its batch is trimmed to the phase's."""
  selection = config.data.masked_lm_prob
  for rates in phase_rates(config.data.masking_phases):
    for rate in (rates.first, rates.last):
      if not 0 < rate <= selection:
        raise ValueError(
          f"{MASKING_PHASES}: phase {rates.written!r} has rate {rate:g}; expected rates in (0, data.masked_lm_prob="
          f"{selection:g}]: every instance is selected at data.masked_lm_prob, then trimmed to its phase's rate."
        )
  MaskingRates.of(config)  # Phases out of order are refused, naming the two.


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
  if config.objective == "span_boundary":
    scheme = masking_scheme(config.data)
    if scheme != "spans":
      raise ValueError(
        f"objective='span_boundary' with data.masking={scheme!r}: SpanBERT's span-boundary objective predicts each "
        "masked span from the two tokens just outside it, so the tokens must be masked in spans; set "
        "data.masking='spans'."
      )
    check_ranges(config, SPAN_BOUNDARY)
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
