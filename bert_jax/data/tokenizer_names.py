"""Tokenizer names that configuration checks, run directories and training share, without loading a tokenizer: the
kinds (`tokenizer.kind`), the byte-level BPE file formats (`tokenizer.train_bpe_format`) and their file names, and
the name bert_jax gives a vocabulary it trains."""

KINDS = ("wordpiece", "sentencepiece", "bpe")
# A byte-level BPE's files: RoBERTa's vocab.json with merges.txt beside it, or one tokenizer.json.
VOCAB, MERGES, TOKENIZER_JSON = "vocab.json", "merges.txt", "tokenizer.json"
# Byte-level BPE files: RoBERTa's (vocab.json with merges.txt beside it) or ModernBERT's (one tokenizer.json).
BPE_FORMATS = ("roberta", "modernbert")
# Each kind's file name when bert_jax picks it (the embedded corpus's vocabulary, in <workdir>/tokenizer/).
FILE_NAMES = {"sentencepiece": "spm.model", "wordpiece": "vocab.txt", "roberta": VOCAB, "modernbert": TOKENIZER_JSON}


def trained_file_name(tokenizer_config) -> str:
  """The name bert_jax gives a vocabulary of `tokenizer.kind` (and `tokenizer.train_bpe_format`) that it trains."""
  kind, bpe_format = tokenizer_config.kind, tokenizer_config.train_bpe_format
  name = FILE_NAMES.get(bpe_format if kind == "bpe" else kind)
  if name is None:
    raise ValueError(
      f"tokenizer.kind={kind!r} with tokenizer.train_bpe_format={bpe_format!r}: expected a kind of {KINDS} (and a "
      f"format of {BPE_FORMATS} for 'bpe')."
    )
  return name
