"""A tokenizer in a Hugging Face directory, both ways: the files from which transformers builds a tokenizer that gives
bert_jax's ids (`files`), and the preprocessing a directory asks for of its SentencePiece model
(`sentencepiece_preprocessing`).

Written (`AutoTokenizer.from_pretrained(directory)`, fast or slow, then gives [CLS] + bert_jax's ids + [SEP]):

  WordPiece                             BertTokenizer, `do_lower_case` as bert_jax's       vocab.txt
  byte-level BPE                        RobertaTokenizer                                   vocab.json, merges.txt
  SentencePiece, raw text (bert_jax's)  DebertaV2Tokenizer, `do_lower_case` and            spm.model
                                        `split_by_punct` false
  SentencePiece, ALBERT's preprocessing AlbertTokenizer, `do_lower_case`, `remove_space`,  spiece.model
                                        `keep_accents` as bert_jax's

each with `tokenizer_config.json` (the class, its flags, the special tokens under the vocabulary's names: a byte-level
BPE's with BERT's names, as ModernBERT's, is RobertaTokenizer's too, its <s> and </s> named [CLS] and [SEP]) and
`special_tokens_map.json`, whatever the model's family. A raw SentencePiece model is DebertaV2Tokenizer's even in an
ALBERT directory: that class is SentencePiece's own encoding, slow and fast, with [CLS] x [SEP]; AlbertTokenizer
always rewrites "``" and "''" as '"', and its two forms also differ from each other (the slow one splits a piece "1,"
in two, the fast one ends a text that ends in spaces with a "▁"). Text that spells a special token ("[MASK]") is
that token to transformers, and characters to bert_jax.

Read: a SentencePiece model gets ALBERT's preprocessing (data/tokenizer/albert.py) when its directory's
`tokenizer_config.json` names AlbertTokenizer, or names no class in an ALBERT directory (flags it leaves out take
AlbertTokenizer's defaults), and when an ALBERT directory has ALBERT's `spiece.model` and no tokenizer_config.json
(transformers then builds AlbertTokenizer with its defaults: lower case, no accents). It is read raw when the file
names DebertaV2Tokenizer without lower-casing or punctuation splitting, or names no class outside ALBERT, and when
there is none beside any other model file (bert_jax's `tokenizer.model`: its Hugging Face exports wrote none before).
Any other class, or DebertaV2Tokenizer's other flags, would encode otherwise and is refused, naming the file.
"""

import json

from etils import epath

from bert_jax.data.tokenizer import Tokenizer, albert

CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
# Every file `files` may write.
FILES = (CONFIG, SPECIAL_TOKENS_MAP, "vocab.txt", "vocab.json", "merges.txt", "spm.model", "spiece.model")
# transformers' names of BERT's special tokens, in `Tokenizer.special_tokens`' order.
_SPECIAL_KEYS = ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token")
_ALBERT = ("AlbertTokenizer", "AlbertTokenizerFast")
_RAW = ("DebertaV2Tokenizer", "DebertaV2TokenizerFast")
_RAW_FLAGS = {"do_lower_case": False, "split_by_punct": False}


def files(tokenizer: Tokenizer) -> dict[str, bytes]:
  """File name -> content of `tokenizer` in a Hugging Face directory (the module docstring's table)."""
  if tokenizer.kind == "bpe":
    # RobertaTokenizer's <s> and </s> are [CLS] and [SEP]: named, so that a vocabulary with BERT's names (ModernBERT's)
    # does not get them as tokens of their own, which transformers would find in text.
    _, _, cls, sep, _ = tokenizer.special_tokens
    model_files = tokenizer.vocab_merges_files()
    settings = {"tokenizer_class": "RobertaTokenizer", "bos_token": cls, "eos_token": sep}
  elif tokenizer.kind == "wordpiece":
    model_files = {"vocab.txt": tokenizer.file_content()}
    settings = {"tokenizer_class": "BertTokenizer", "do_lower_case": tokenizer.lower_case}
  elif tokenizer.albert_preprocessing is None:
    model_files, settings = {"spm.model": tokenizer.file_content()}, {"tokenizer_class": _RAW[0], **_RAW_FLAGS}
  else:
    model_files = {"spiece.model": tokenizer.file_content()}
    settings = {"tokenizer_class": _ALBERT[0], **tokenizer.albert_preprocessing}
  special = dict(zip(_SPECIAL_KEYS, tokenizer.special_tokens, strict=True))
  return {
    **model_files,
    CONFIG: json.dumps({**settings, **special}, indent=2).encode(),
    SPECIAL_TOKENS_MAP: json.dumps(special, indent=2).encode(),
  }


def sentencepiece_preprocessing(model_file: epath.Path, model_type: str) -> dict | None:
  """ALBERT's preprocessing flags for the SentencePiece `model_file` of a Hugging Face directory of `model_type`, or
  None for raw text (the module docstring's rules). Raises ValueError naming `tokenizer_config.json` for a class or
  flags bert_jax does not encode as."""
  config_file = model_file.parent / CONFIG
  if not config_file.exists():
    return dict(albert.DEFAULTS) if model_type == "albert" and model_file.name == "spiece.model" else None
  try:
    settings = json.loads(config_file.read_text())
  except ValueError as error:
    raise ValueError(f"{config_file} is not JSON: {error}") from None
  if not isinstance(settings, dict):
    raise ValueError(f"{config_file} holds {type(settings).__name__}, not a JSON object of tokenizer settings.")
  name = settings.get("tokenizer_class")
  if name in _ALBERT or name is None and model_type == "albert":
    return albert.flags(settings, str(config_file))
  if name is None:
    return None
  flags = {flag: settings.get(flag, False) for flag in _RAW_FLAGS}
  if name in _RAW and flags == _RAW_FLAGS:
    return None
  raise ValueError(
    f"{config_file}: tokenizer_class {name!r}{f' with {flags}' if name in _RAW else ''} encodes a SentencePiece "
    f"model otherwise than bert_jax can; bert_jax reads it as {_ALBERT[0]} (with ALBERT's preprocessing flags) or as "
    f"{_RAW[0]} with {_RAW_FLAGS} does."
  )
