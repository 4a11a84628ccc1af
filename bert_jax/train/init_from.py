"""A pretrained source a run reads as a config key names it (`init_from`, `distill.teacher`): described from its
metadata with errors that name the key, the config's tokenizer checked against the one it was trained with, and its
content, by which a resume knows it (`source_input`)."""

from bert_jax.data.tokenizer import load_tokenizer
from bert_jax.handoff import formats
from bert_jax.train import start_order


def read_source(path: str, where: str) -> formats.Source:
  """`formats.read_source(path)`, its errors prefixed with `where` (the config key that names it)."""
  try:
    return formats.read_source(path)
  except (FileNotFoundError, ValueError) as error:
    raise type(error)(f"{where}: {error}") from None


def source_tokenizer(config, source: formats.Source, where: str):
  """The config's tokenizer, refused unless it is the one `source` was trained with; None for synthetic data."""
  if config.data.source == "synthetic":
    return None
  if not config.tokenizer.path:
    raise ValueError(
      f"{where} was trained with the tokenizer {source.tokenizer_file}; set tokenizer.path to it (the run would "
      "train a new one)."
    )
  tokenizer = load_tokenizer(config.tokenizer.kind, config.tokenizer.path, config.tokenizer.lower_case)
  formats.check_tokenizer(source, tokenizer.identity(), where)
  return tokenizer


def source_input(
  key: str, path: str, optional: bool = False, source: formats.Source | None = None
) -> start_order.Input:
  """The source at `path` (config key `key`) as a run's input, known by its content (`formats.content`: described,
  unless `source` is its description already, and fingerprinted when its content is first asked for)."""
  return start_order.Input(key, path, lambda: formats.content(source or read_source(path, f"{key}={path}")), optional)
