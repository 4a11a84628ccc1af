"""The checks of the modes that run no training: features, embed, the BERTology analyses, retrieval, the dry run
and plan, export, merge, and the placeholder bucket a shipped config writes where the user's own path goes."""

from bert_jax.config_checks.finetuning import TASKS
from bert_jax.config_checks.ranges import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, Range, check_ranges
from bert_jax.dry_run import tpu_topology
from bert_jax.handoff import merge_settings
from bert_jax.handoff.export_formats import FORMATS as EXPORT_FORMATS
from bert_jax.model.bert_config import REMAT_POLICIES
from bert_jax.model.sentence_embedding import POOLINGS

FEATURES = (
  ("features.max_seq_length", Range(3), "([CLS] x [SEP])"),
  ("features.batch_size", AT_LEAST_ONE),
  ("features.lines_per_shard", AT_LEAST_ONE),
)

EMBED = (
  ("embed.max_seq_length", Range(0), "(0: the source's)"),
  ("embed.batch_size", AT_LEAST_ONE),
)
EMBED_KINDS = ("document", "query")

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


def check_embed(settings) -> None:
  """`config.embed`, for --mode=embed (`config.embedding`'s values: `sentence_embedding.Settings`, before the source
  is read)."""
  if not settings.input_pattern or not settings.output_dir:
    raise ValueError("--mode=embed needs embed.input_pattern and embed.output_dir.")
  check_ranges({"embed": settings}, EMBED)
  if settings.max_seq_length in (1, 2):
    raise ValueError(
      f"embed.max_seq_length={settings.max_seq_length}: a row needs its special tokens and a token more."
    )
  if settings.kind not in EMBED_KINDS:
    raise ValueError(f"embed.kind={settings.kind!r}; expected one of {EMBED_KINDS}.")
  if not settings.text_field or not settings.id_field:
    raise ValueError("embed.text_field and embed.id_field name a .jsonl line's fields: neither may be empty.")


RETRIEVAL = (
  ("retrieval.batch_size", AT_LEAST_ONE),
  # Retrieval's metrics count the first 100 documents (recall@100, MAP@100).
  ("retrieval.top_k", Range(100), "(recall@100 and MAP@100 count the first 100 documents)"),
)


def check_embedding(settings) -> None:
  """`config.embedding`: a pooling sentence_embedding.py computes, where set."""
  if settings.pooling is not None and settings.pooling not in POOLINGS:
    raise ValueError(f"embedding.pooling={settings.pooling!r}; expected one of {POOLINGS} (or unset: the source's).")


def check_retrieval(config) -> None:
  """`config.retrieval` and `config.embedding`, for --mode=retrieve."""
  settings = config.retrieval
  if not settings.data_dir or not settings.output_dir:
    raise ValueError(
      "--mode=retrieve needs retrieval.data_dir (a BEIR-layout set: corpus.jsonl, queries.jsonl, qrels/<split>.tsv) "
      "and retrieval.output_dir."
    )
  if not settings.split:
    raise ValueError("retrieval.split is empty: name the judgements to evaluate (qrels/<split>.tsv; e.g. test).")
  check_ranges({"retrieval": settings}, RETRIEVAL)
  if settings.max_seq_length != 0 and settings.max_seq_length < 3:
    raise ValueError(
      f"retrieval.max_seq_length={settings.max_seq_length} must be 0 (the source's) or at least 3 ([CLS] x [SEP])."
    )
  check_embedding(config.embedding)


MINE = (
  ("mine.batch_size", AT_LEAST_ONE),
  ("mine.num_negatives", AT_LEAST_ONE),
  ("mine.range_min", NON_NEGATIVE),
  ("mine.range_max", NON_NEGATIVE),
)


def check_mine(config) -> None:
  """`config.mine` and `config.embedding`, for --mode=mine."""
  settings = config.mine
  if not settings.pairs_file or not settings.output_dir:
    raise ValueError(
      "--mode=mine needs mine.pairs_file (anchor and positive columns: .jsonl, .tsv or .csv) and mine.output_dir."
    )
  check_ranges({"mine": settings}, MINE)
  if settings.range_max and settings.range_max - settings.range_min < settings.num_negatives:
    raise ValueError(
      f"mine.num_negatives={settings.num_negatives} exceeds the {max(settings.range_max - settings.range_min, 0)} "
      f"ranks from mine.range_min={settings.range_min} to mine.range_max={settings.range_max}."
    )
  if settings.max_seq_length != 0 and settings.max_seq_length < 3:
    raise ValueError(f"mine.max_seq_length={settings.max_seq_length} must be 0 (the source's) or at least 3.")
  check_embedding(config.embedding)


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


def check_export(settings, embedding) -> None:
  """`config.export`, for --mode=export, and `config.embedding` for a sentence-transformers export."""
  if settings.format not in EXPORT_FORMATS:
    raise ValueError(f"export.format={settings.format!r}; expected one of {EXPORT_FORMATS}.")
  if not settings.dir:
    raise ValueError("export.dir is empty: name the directory to write (local or gs://).")
  if settings.format == "sentence-transformers" and embedding.pooling not in (None, *POOLINGS):
    raise ValueError(f"embedding.pooling={embedding.pooling!r}; expected one of {POOLINGS} (None: the source's).")


def check_merge(settings) -> None:
  """`config.merge`, for --mode=merge: what `merge_settings.parse` checks without reading a file (the weights, their
  count, how the checkpoints are named, the output)."""
  merge_settings.parse(settings)


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
