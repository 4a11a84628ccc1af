"""Tokenizers: WordPiece (Google BERT `vocab.txt`), SentencePiece and byte-level BPE (RoBERTa's, `bpe.py`), behind
one interface.

A tokenizer is part of a run's identity: `identity()` (kind, file, SHA-256 of the one file that stores it: the
tokenizer file, or a byte-level BPE's canonical `tokenizer.json`) is recorded with prepared data and with every
checkpoint, and a mismatch is refused. Every tokenizer exposes the ids of BERT's special tokens (padding, unknown,
[CLS], [SEP], [MASK], under each kind's names: RoBERTa's `<pad> <unk> <s> </s> <mask>`, ALBERT's SentencePiece
`<pad> <unk>`) and which ids begin a word (for whole-word masking). A SentencePiece model read from a Hugging Face
ALBERT directory may ask for ALBERT's text preprocessing (`albert.py`); its flags are part of the identity.
`training.py` trains a vocabulary of each kind.
"""

import itertools
import re

import numpy as np
from etils import epath

from bert_jax.data.tokenizer import albert, wordpiece
from bert_jax.data.tokenizer.base import SPECIAL_TOKENS, Tokenizer, file_sha256  # noqa: F401 (the interface)
from bert_jax.data.tokenizer.training import train_sentencepiece  # noqa: F401 (vocabulary training: training.py)
from bert_jax.data.tokenizer_names import KINDS

# The ids a SentencePiece vocabulary trained by bert_jax gives them (WordPiece takes them from vocab.txt).
SENTENCEPIECE_SPECIAL_IDS = {token: index for index, token in enumerate(SPECIAL_TOKENS)}


class WordPieceTokenizer(Tokenizer):
  kind = "wordpiece"

  def __init__(self, vocab_path: str, lower_case: bool):
    vocab = wordpiece.load_vocab(vocab_path)
    pieces = [""] * (max(vocab.values()) + 1)
    for token, index in vocab.items():
      pieces[index] = token
    word_start = np.array([not piece.startswith("##") for piece in pieces])
    super().__init__(vocab_path, pieces, word_start)
    self._vocab, self.lower_case = vocab, lower_case
    self._fast = None

  def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Compiled (fast_wordpiece.py): the same ids as `encode`, 16x its speed per core."""
    if self._fast is None:
      from bert_jax.data.tokenizer.fast_wordpiece import FastWordPiece

      self._fast = FastWordPiece(self.pieces, self.lower_case, self.encode)
    return self._fast(texts)

  def tokenize(self, text: str) -> list[str]:
    return [
      p
      for word in wordpiece.basic_tokenize(text, self.lower_case)
      for p in wordpiece.wordpiece(word, self._vocab, "[UNK]")
    ]

  def encode(self, text: str) -> list[int]:
    return [self._vocab[piece] for piece in self.tokenize(text)]

  def decode(self, ids) -> str:
    return " ".join(self.pieces[i] for i in ids).replace(" ##", "")

  def identity(self) -> dict:
    return dict(super().identity(), lower_case=self.lower_case)


# ALBERT's punctuation pieces (its `special_pieces`; `"` appears twice where `'` was likely meant: kept as written, and
# "'" starts a word anyway, not being an English letter), and the letters of an English word's pieces.
_ALBERT_PUNCTUATION = frozenset('!"#$%&"()*+,-./:;?@[\\]^_`{|}~')
_ENGLISH_PIECE_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyz") | _ALBERT_PUNCTUATION


def is_start_piece(piece: str) -> bool:
  """Whether a SentencePiece piece begins a word, by ALBERT's rule (google-research/albert create_pretraining_data.py,
  `_is_start_piece_sp`): it starts with "\u2581" or "<", is one punctuation character, or holds a character that is
  neither an English letter nor punctuation (a digit, a foreign letter: such pieces are words of their own)."""
  return (
    piece.startswith(("\u2581", "<"))
    or piece in _ALBERT_PUNCTUATION
    or not all(character.lower() in _ENGLISH_PIECE_CHARACTERS for character in piece)
  )


class SentencePieceTokenizer(Tokenizer):
  kind = "sentencepiece"
  # bert_jax trains with BERT's names; ALBERT's models (`spiece.model`) name padding and unknown `<pad>`, `<unk>`.
  special_names = (("[PAD]", "<pad>"), ("[UNK]", "<unk>"), ("[CLS]",), ("[SEP]",), ("[MASK]",))

  def __init__(self, model_path: str, albert_preprocessing: dict | None = None):
    """`albert_preprocessing`: ALBERT's flags (albert.py), for a model trained on text so preprocessed; None (bert_jax's
    own models): the text is encoded as it is."""
    import sentencepiece as spm

    try:
      self._processor = spm.SentencePieceProcessor(model_proto=epath.Path(model_path).read_bytes())
    except RuntimeError:  # sentencepiece's "INTERNAL: ... ParseFromArray ...", naming no file.
      raise ValueError(f"{model_path} is not a SentencePiece model: its protobuf does not parse (cut short?)") from None
    pieces = [self._processor.id_to_piece(i) for i in range(self._processor.get_piece_size())]
    word_start = np.array([is_start_piece(piece) for piece in pieces])
    super().__init__(model_path, pieces, word_start)
    self.albert_preprocessing = None if albert_preprocessing is None else albert.flags(albert_preprocessing, model_path)

  def encode(self, text: str) -> list[int]:
    if self.albert_preprocessing is not None:
      return albert.encode(self._processor, text, self.albert_preprocessing)
    return self._processor.encode(text)

  def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    if self.albert_preprocessing is not None:
      return super().encode_batch(texts)  # Text by text: ALBERT's preprocessing is Python's.
    encoded = self._processor.encode(texts)  # One call into C++.
    return np.fromiter(itertools.chain.from_iterable(encoded), np.int64), np.array([len(e) for e in encoded], np.int64)

  def decode(self, ids) -> str:
    return self._processor.decode([int(i) for i in ids])

  def identity(self) -> dict:
    identity = super().identity()
    if self.albert_preprocessing is None:  # bert_jax's own models: the identity they always had.
      return identity
    return dict(identity, albert_preprocessing=self.albert_preprocessing)


# The shapes a tokenizer file has (`file_shape`): what each is, for errors, and the kind that reads it.
_SHAPES = {
  "lines": ("a WordPiece vocab.txt (UTF-8 text, one token a line)", "wordpiece"),
  "binary": ("a SentencePiece .model (a binary protobuf)", "sentencepiece"),
  "json": ("a BPE tokenizer.json or vocab.json (JSON)", "bpe"),
  "merges": ("a BPE merges.txt (kind 'bpe' reads the vocab.json beside it)", "bpe"),
}
_SHAPE_OF_KIND = {"wordpiece": "lines", "sentencepiece": "binary", "bpe": "json"}
_HEAD_BYTES = 1 << 16  # Enough of any tokenizer file to tell its shape: a SentencePiece model's first pieces.


def file_shape(path: str) -> str:
  """What the tokenizer file `path` looks like from its first 64 KiB, a key of `_SHAPES`: "binary" if it holds a NUL
  byte (a SentencePiece model's first pieces, scored 0, do; text never does), "json" if it starts as a JSON object,
  "merges" if its first line is a merges.txt's "#version", else "lines"."""
  with epath.Path(path).open("rb") as f:
    head = f.read(_HEAD_BYTES)
  if b"\0" in head:
    return "binary"
  if re.match(rb'\s*\{\s*"', head):
    return "json"
  return "merges" if head.startswith(b"#version") else "lines"


def load_tokenizer(
  kind: str, path: str, lower_case: bool = True, albert_preprocessing: dict | None = None
) -> Tokenizer:
  """`path`: a `vocab.txt` (wordpiece), a `.model` (sentencepiece), or (bpe) a `tokenizer.json` or a `vocab.json`
  with `merges.txt` beside it. `lower_case`: WordPiece only. `albert_preprocessing`: SentencePiece only (albert.py).
  A file of another kind's shape is refused naming both kinds, before it is parsed."""
  if kind not in KINDS:
    raise ValueError(f"Unknown tokenizer kind {kind!r}; expected one of {KINDS}.")
  shape = file_shape(path)
  if shape != _SHAPE_OF_KIND[kind]:
    (looks_like, its_kind), (expected, _) = _SHAPES[shape], _SHAPES[_SHAPE_OF_KIND[kind]]
    fix = f"set tokenizer.kind={its_kind!r}, or name such a file" if its_kind != kind else "name such a file"
    raise ValueError(
      f"Tokenizer file {path} looks like {looks_like}, but the tokenizer kind is {kind!r}, which reads "
      f"{expected}: {fix}."
    )
  if kind == "wordpiece":
    return WordPieceTokenizer(path, lower_case)
  if kind == "sentencepiece":
    return SentencePieceTokenizer(path, albert_preprocessing)
  if kind == "bpe":
    from bert_jax.data.tokenizer.bpe import BytePairTokenizer

    return BytePairTokenizer(path)


def tokenizer_sha256(kind: str, path: str) -> str:
  """The SHA-256 that `load_tokenizer(kind, path).identity()` records: of the file, or, for BPE, of the canonical
  `tokenizer.json` its files make (`bpe.py`)."""
  return load_tokenizer(kind, path).identity()["sha256"] if kind == "bpe" else file_sha256(path)
