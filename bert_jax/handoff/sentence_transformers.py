"""A sentence-transformers directory, both ways: how its model embeds, read from its metadata (`read_settings`), and
the metadata files that make a Hugging Face export one (`files`).

Read (`modules.json` lists the modules by `idx`, `name`, `path`, `type`): bert_jax computes exactly

  0  Transformer  a BERT-family or ModernBERT Hugging Face model that `formats.read_source` reads, in the module's
                  `path` ("" the directory itself, as sentence-transformers saves it, or e.g. "0_Transformer"), with
                  `sentence_bert_config.json` (`max_seq_length`, `do_lower_case`)
  1  Pooling      one of `cls` or `mean` (`pooling_mode`, or the older `pooling_mode_*_token` flags; all false is
                  mean, as sentence-transformers reads it), prompts included in the pooling (`include_prompt`)
  2  Normalize    optional: the embedding divided by its L2 norm (its folder holds nothing and may be absent)

matched by the class name of `type` under the `sentence_transformers.` package, in its older
(`sentence_transformers.models.Pooling`) or newer (`sentence_transformers.sentence_transformer.modules.pooling.Pooling`)
module paths. Any other module (Dense, LayerNorm, WordEmbeddings, CNN, a custom one), any other pooling (max,
weightedmean, lasttoken, mean_sqrt_len_tokens, several at once) is refused naming the module's index and type.

`config_sentence_transformers.json` gives the prompts: the query prompt is the prompt named "query", the document
prompt the first of "document", "passage", "corpus" (the names `SentenceTransformer.encode_document` tries, in that
order); a side without a named prompt takes `default_prompt_name`'s prompt, as `encode` would. Its
`similarity_fn_name` must be "cosine" or "dot" (or absent: cosine): bert_jax scores by dot product, so a cosine model
without a Normalize module is logged as scored by dot product unless `embedding.normalize=True`.

The longest input is `sentence_bert_config.json`'s `max_seq_length`, else (sentence-transformers 5 writes none there)
the Transformer directory's `tokenizer_config.json` `model_max_length` when it is a real bound; else 0 (none
recorded).

Written (`files`), beside the Hugging Face export in the directory itself (the Transformer module's path ""), in the
layout every sentence-transformers version since 2 reads: `modules.json` (the older type names, which newer versions
map to theirs), `sentence_bert_config.json`, `1_Pooling/config.json` (the `pooling_mode_*_token` flags),
`2_Normalize/` when normalised, `config_sentence_transformers.json` (the prompts as "query" and "document",
`similarity_fn_name` "cosine" when normalised, else "dot" (the score bert_jax's search computes), and a
`__version__` naming bert_jax). No README.
"""

import importlib.metadata
import json

from absl import logging
from etils import epath

from bert_jax.model.sentence_embedding import POOLINGS, Settings

MODULES = "modules.json"
MODEL_CONFIG = "config_sentence_transformers.json"
TRANSFORMER_CONFIG = "sentence_bert_config.json"
POOLING_DIR = "1_Pooling"
NORMALIZE_DIR = "2_Normalize"
# The module class names bert_jax computes, in their order in modules.json.
_TRANSFORMER, _POOLING, _NORMALIZE = "Transformer", "Pooling", "Normalize"
# sentence-transformers' older pooling flags, by the mode each turns on.
_POOLING_FLAGS = {
  "pooling_mode_cls_token": "cls",
  "pooling_mode_max_tokens": "max",
  "pooling_mode_mean_tokens": "mean",
  "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
  "pooling_mode_weightedmean_tokens": "weightedmean",
  "pooling_mode_lasttoken": "lasttoken",
}
# Prompt names that `SentenceTransformer.encode_document` tries, in order.
_DOCUMENT_PROMPTS = ("document", "passage", "corpus")
SIMILARITIES = ("cosine", "dot")
# transformers' "no limit" model_max_length is 1e30; a real bound is far below.
_NO_BOUND = 1_000_000
# Every file `files` writes (what export.overwrite may replace).
WRITTEN = (MODULES, MODEL_CONFIG, TRANSFORMER_CONFIG, f"{POOLING_DIR}/config.json")


def is_directory(path: epath.Path) -> bool:
  """Whether `path` is a sentence-transformers directory (it has a modules.json)."""
  return (path / MODULES).exists()


def _json(path: epath.Path) -> dict | list:
  try:
    return json.loads(path.read_text())
  except ValueError as error:
    raise ValueError(f"{path} is not JSON: {error}") from None


def _class_name(entry: dict) -> str | None:
  """The class name of a modules.json entry's `type` when it is one of sentence-transformers' own classes."""
  kind = entry.get("type")
  if not isinstance(kind, str) or not kind.startswith("sentence_transformers."):
    return None
  return kind.rsplit(".", 1)[1]


def _module_dir(directory: epath.Path, entry: dict, where: str) -> epath.Path:
  """The directory of a modules.json entry (its `path`, relative to `directory`), which must exist."""
  if not isinstance(entry.get("path"), str):
    raise ValueError(f"{where} has no 'path' (the module's folder in the directory; \"\" for the directory itself).")
  module_dir = directory / entry["path"] if entry["path"] else directory
  if not module_dir.is_dir():
    raise FileNotFoundError(f"{where}: its path {entry['path']!r} is not a folder of {directory}.")
  return module_dir


def _pooling(pooling_dir: epath.Path, where: str) -> tuple[str, bool]:
  """(pooling, include_prompt) of a Pooling module's config.json; refuses a mode bert_jax does not compute."""
  config_file = pooling_dir / "config.json"
  if not config_file.exists():
    raise FileNotFoundError(f"{where}: {config_file} does not exist (the Pooling module's settings).")
  config = _json(config_file)
  if "pooling_mode" in config:
    modes = config["pooling_mode"]
    modes = [modes] if isinstance(modes, str) else list(modes)
  else:
    modes = [mode for flag, mode in _POOLING_FLAGS.items() if config.get(flag)] or ["mean"]
  if len(modes) != 1 or modes[0] not in POOLINGS:
    raise ValueError(
      f"{where} ({config_file}) pools by {modes}; bert_jax computes exactly one of {POOLINGS} "
      "(max, weightedmean, lasttoken, mean_sqrt_len_tokens and concatenated modes are not supported)."
    )
  return modes[0], bool(config.get("include_prompt", True))


def _max_seq_length(transformer_dir: epath.Path, transformer_config: dict) -> int:
  """The longest input the directory records (module docstring), 0 if none."""
  length = transformer_config.get("max_seq_length")
  if length is None and (transformer_dir / "tokenizer_config.json").exists():
    bound = _json(transformer_dir / "tokenizer_config.json").get("model_max_length")
    length = bound if isinstance(bound, int) and bound < _NO_BOUND else None
  if length is None:
    return 0
  if not isinstance(length, int) or length < 1:
    raise ValueError(f"{transformer_dir / TRANSFORMER_CONFIG}: max_seq_length={length!r}; expected a positive int.")
  return length


def _prompts(config: dict, where: epath.Path) -> tuple[str, str]:
  """(query prompt, document prompt) of config_sentence_transformers.json (module docstring)."""
  prompts = config.get("prompts") or {}
  if not isinstance(prompts, dict) or not all(isinstance(text, str) for text in prompts.values()):
    raise ValueError(f"{where}: prompts={prompts!r}; expected a mapping of prompt names to texts.")
  default_name = config.get("default_prompt_name")
  if default_name is not None and default_name not in prompts:
    raise ValueError(f"{where}: default_prompt_name={default_name!r} is not one of its prompts {sorted(prompts)}.")
  default = prompts[default_name] if default_name is not None else ""
  query = prompts.get("query", default)
  document = next((prompts[name] for name in _DOCUMENT_PROMPTS if name in prompts), default)
  return query, document


def read_settings(directory) -> tuple[epath.Path, Settings, bool]:
  """(the Transformer module's directory, the Settings the directory's modules compute, its `do_lower_case`) of the
  sentence-transformers `directory`; refuses, naming the module and what was expected, anything bert_jax does not
  compute (module docstring). Reads metadata only."""
  directory = epath.Path(directory)
  entries = _json(directory / MODULES)
  if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
    raise ValueError(f"{directory / MODULES} is not a list of modules ({{idx, name, path, type}} each).")
  entries = sorted(entries, key=lambda entry: entry.get("idx", 0))
  names = [_class_name(entry) for entry in entries]
  expected = f"{_TRANSFORMER}, {_POOLING}, and optionally {_NORMALIZE}"
  for index, (entry, name) in enumerate(zip(entries, names, strict=True)):
    allowed = (_TRANSFORMER,) if index == 0 else (_POOLING,) if index == 1 else (_NORMALIZE,) if index == 2 else ()
    if name not in allowed:
      raise ValueError(
        f"{directory / MODULES}: module {entry.get('idx', index)} ({entry.get('type')!r}) is not supported; "
        f"bert_jax computes the modules {expected}, in that order."
      )
  if len(entries) < 2:
    raise ValueError(f"{directory / MODULES} lists {names}; bert_jax computes the modules {expected}.")
  where = lambda i: f"{directory / MODULES}: module {entries[i].get('idx', i)} ({entries[i].get('type')!r})"  # noqa: E731
  transformer_dir = _module_dir(directory, entries[0], where(0))
  pooling, include_prompt = _pooling(_module_dir(directory, entries[1], where(1)), where(1))
  transformer_file = transformer_dir / TRANSFORMER_CONFIG
  transformer_config = _json(transformer_file) if transformer_file.exists() else {}
  model_file = directory / MODEL_CONFIG
  model_config = _json(model_file) if model_file.exists() else {}
  similarity = model_config.get("similarity_fn_name") or "cosine"
  if similarity not in SIMILARITIES:
    raise ValueError(
      f"{model_file}: similarity_fn_name={similarity!r} is not supported; bert_jax scores by dot product, which "
      f"computes one of {SIMILARITIES} (cosine on normalised embeddings)."
    )
  query_prompt, document_prompt = _prompts(model_config, model_file)
  if not include_prompt and (query_prompt or document_prompt):
    raise ValueError(
      f"{where(1)} pools without its prompts (include_prompt false); bert_jax pools over every token of the input, "
      "prompt included."
    )
  normalized = len(entries) == 3
  if similarity == "cosine" and not normalized:
    logging.warning(
      "%s scores by cosine similarity without a Normalize module; bert_jax scores by dot product unless "
      "embedding.normalize=True.",
      directory,
    )
  settings = Settings(
    pooling=pooling,
    normalized=normalized,
    query_prompt=query_prompt,
    document_prompt=document_prompt,
    max_seq_length=_max_seq_length(transformer_dir, transformer_config),
  )
  return transformer_dir, settings, bool(transformer_config.get("do_lower_case", False))


def files(settings: Settings, hidden_size: int, max_seq_length: int, do_lower_case: bool) -> dict[str, str]:
  """Relative file name -> JSON text of the sentence-transformers metadata of a model that embeds by `settings`
  (`hidden_size` wide, at most `max_seq_length` tokens), beside its Hugging Face files in the same directory. The
  modules.json comes last: it is what makes the directory a sentence-transformers model (write it last)."""
  modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]
  modules.append({"idx": 1, "name": "1", "path": POOLING_DIR, "type": "sentence_transformers.models.Pooling"})
  if settings.normalized:
    modules.append({"idx": 2, "name": "2", "path": NORMALIZE_DIR, "type": "sentence_transformers.models.Normalize"})
  pooling = {"word_embedding_dimension": hidden_size}
  pooling.update({flag: mode == settings.pooling for flag, mode in _POOLING_FLAGS.items()})
  pooling["include_prompt"] = True
  model_config = {
    "__version__": {"bert_jax": importlib.metadata.version("bert_jax")},
    "model_type": "SentenceTransformer",
    "prompts": {"query": settings.query_prompt, "document": settings.document_prompt},
    "default_prompt_name": None,
    "similarity_fn_name": "cosine" if settings.normalized else "dot",
  }
  text = lambda value: json.dumps(value, indent=2) + "\n"  # noqa: E731
  return {
    TRANSFORMER_CONFIG: text({"max_seq_length": max_seq_length, "do_lower_case": do_lower_case}),
    f"{POOLING_DIR}/config.json": text(pooling),
    MODEL_CONFIG: text(model_config),
    MODULES: text(modules),
  }
