"""A pretrained source a run reads as a config key names it (`init_from`, `distill.teacher`): described from its
metadata with errors that name the key, and the config's tokenizer checked against the one it was trained with."""

from bert_jax.data.tokenizer import load_tokenizer
from bert_jax.handoff import formats


def describe(path: str, where: str) -> formats.Source:
  """`formats.describe(path)`, its errors prefixed with `where` (the config key that names it)."""
  try:
    return formats.describe(path)
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
