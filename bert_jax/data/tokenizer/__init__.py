"""Tokenizers: WordPiece (Google BERT `vocab.txt`) and SentencePiece, behind one interface.

A tokenizer is part of a run's identity: `identity()` (kind, file, SHA-256 of the file) is recorded with
prepared data and with every checkpoint, and a mismatch is refused. Every tokenizer exposes the ids of BERT's
special tokens and which ids begin a word (for whole-word masking).
"""

import hashlib
import itertools

import numpy as np
from etils import epath

from bert_jax.data.tokenizer import wordpiece

_TRAINING_THREADS = 16
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# The ids a SentencePiece vocabulary trained by bert_jax gives them (WordPiece takes them from vocab.txt).
SENTENCEPIECE_SPECIAL_IDS = {token: index for index, token in enumerate(SPECIAL_TOKENS)}


def file_sha256(path: str) -> str:
  digest = hashlib.sha256()
  with epath.Path(path).open("rb") as f:
    while chunk := f.read(1 << 20):
      digest.update(chunk)
  return digest.hexdigest()


class Tokenizer:
  """Common interface. `encode(text) -> list[int]`, `encode_batch(texts)` (many at once, compiled: corpus
  preparation), `decode(ids) -> str`, special ids, `word_start` mask."""

  kind: str

  def __init__(self, path: str, pieces: list[str], is_word_start: np.ndarray):
    self.path = path
    self.pieces = pieces
    self.vocab_size = len(pieces)
    self.word_start = is_word_start  # [vocab] bool: this id begins a word (whole-word masking).
    index = {piece: i for i, piece in enumerate(pieces)}
    missing = [token for token in SPECIAL_TOKENS if token not in index]
    if missing:
      raise ValueError(f"Tokenizer file {path} has no {missing}; BERT needs {list(SPECIAL_TOKENS)}.")
    self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (index[t] for t in SPECIAL_TOKENS)
    self.special_ids = np.array([index[t] for t in SPECIAL_TOKENS], np.int32)
    self._sha256 = None

  def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Every text's ids, concatenated (int64), and how many each text has: `encode` of each, in one call."""
    encoded = [self.encode(text) for text in texts]
    return np.fromiter(itertools.chain.from_iterable(encoded), np.int64), np.array([len(e) for e in encoded], np.int64)

  def identity(self) -> dict:
    """What makes two tokenizers the same: kind and file content (the path is informative only)."""
    if self._sha256 is None:
      self._sha256 = file_sha256(self.path)
    return {"kind": self.kind, "path": self.path, "sha256": self._sha256}


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

  def __init__(self, model_path: str):
    import sentencepiece as spm

    self._processor = spm.SentencePieceProcessor(model_proto=epath.Path(model_path).read_bytes())
    pieces = [self._processor.id_to_piece(i) for i in range(self._processor.get_piece_size())]
    word_start = np.array([is_start_piece(piece) for piece in pieces])
    word_start[[pieces.index(t) for t in SPECIAL_TOKENS if t in pieces]] = True
    super().__init__(model_path, pieces, word_start)

  def encode(self, text: str) -> list[int]:
    return self._processor.encode(text)

  def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    encoded = self._processor.encode(texts)  # One call into C++.
    return np.fromiter(itertools.chain.from_iterable(encoded), np.int64), np.array([len(e) for e in encoded], np.int64)

  def decode(self, ids) -> str:
    return self._processor.decode([int(i) for i in ids])


def train_sentencepiece(
  input_files: list[str], model_prefix: str, vocab_size: int, max_sentences: int = 2_000_000, seed: int = 0
) -> str:
  """Trains a unigram SentencePiece model with BERT's special tokens at ids 0-4; returns the model path.

  Memory stays bounded on any corpus: at most `max_sentences` lines, sampled uniformly, are loaded. The model is
  a function of the input and `seed` on any machine, when trained once per process (sentencepiece's random
  generator is process-global: a second training in the same process continues its stream).
  """
  import sentencepiece as spm

  spm.set_random_generator_seed(seed)
  spm.SentencePieceTrainer.train(
    input=",".join(input_files),
    model_prefix=model_prefix,
    vocab_size=vocab_size,
    model_type="unigram",
    input_sentence_size=max_sentences,
    shuffle_input_sentence=True,
    character_coverage=0.9995,
    pad_id=0,
    pad_piece="[PAD]",
    unk_id=1,
    unk_piece="[UNK]",
    bos_id=-1,
    eos_id=-1,
    control_symbols=["[CLS]", "[SEP]", "[MASK]"],
    # A fixed thread count: the trained model depends on it, so it must not depend on the machine's cores.
    num_threads=_TRAINING_THREADS,
    minloglevel=2,
  )
  return model_prefix + ".model"


def load_tokenizer(kind: str, path: str, lower_case: bool = True) -> Tokenizer:
  if kind == "wordpiece":
    return WordPieceTokenizer(path, lower_case)
  if kind == "sentencepiece":
    return SentencePieceTokenizer(path)
  raise ValueError(f"Unknown tokenizer kind {kind!r}; expected 'wordpiece' or 'sentencepiece'.")
