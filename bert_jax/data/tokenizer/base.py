"""The interface every tokenizer has (`Tokenizer`), BERT's special tokens, and the SHA-256 of a tokenizer's file;
each kind (`__init__.py`: WordPiece, SentencePiece; `bpe.py`: byte-level BPE) subclasses it."""

import itertools

import numpy as np
from etils import epath

from bert_jax.paths import file_sha256

# BERT's special tokens, in the order of `Tokenizer.special_ids`: padding, unknown, [CLS], [SEP], [MASK].
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


class Tokenizer:
  """Common interface. `encode(text) -> list[int]`, `encode_batch(texts)` (many at once, compiled: corpus
  preparation), `encode_documents(documents)` (corpus preparation), `decode(ids) -> str`, special ids,
  `word_start` mask, and the one file that stores it (`file_name`, `file_content()`)."""

  kind: str
  # Each of BERT's special tokens (SPECIAL_TOKENS' order) under the names this kind's vocabularies give it: the
  # first name a vocabulary has is taken.
  special_names: tuple[tuple[str, ...], ...] = tuple((token,) for token in SPECIAL_TOKENS)

  def __init__(self, path: str, pieces: list[str], is_word_start: np.ndarray):
    self.path = path
    self.pieces = pieces
    self.vocab_size = len(pieces)
    index = {piece: i for i, piece in enumerate(pieces)}
    found = [next((name for name in names if name in index), None) for names in self.special_names]
    if None in found:
      missing = [" or ".join(names) for names, token in zip(self.special_names, found, strict=True) if token is None]
      needed = [" or ".join(names) for names in self.special_names]
      raise ValueError(f"Tokenizer file {path} has no {missing}; BERT needs {needed} (a {self.kind} vocabulary).")
    self.special_tokens = tuple(found)  # The vocabulary's names of padding, unknown, [CLS], [SEP], [MASK].
    self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (index[t] for t in found)
    self.special_ids = np.array([index[t] for t in found], np.int32)
    is_word_start[self.special_ids] = True
    self.word_start = is_word_start  # [vocab] bool: this id begins a word (whole-word masking).
    self._sha256 = None

  # Special tokens in a fine-tuning row of two texts (`pair_row`).
  pair_special_tokens = 3

  def pair_row(self, a: list[int], b: list[int]) -> tuple[list[int], list[int]]:
    """A fine-tuning row of token ids `a` (and `b`, empty for one text) and its segment ids: BERT's
    [CLS] a [SEP] b [SEP], segments 0 then 1 (`BertTokenizer`'s)."""
    ids, segments = [self.cls_id, *a, self.sep_id], [0] * (len(a) + 2)
    if b:
      ids, segments = [*ids, *b, self.sep_id], [*segments, *[1] * (len(b) + 1)]
    return ids, segments

  @property
  def file_name(self) -> str:
    """The name of the file that stores this tokenizer (a checkpoint's tokenizer item, an export bundle)."""
    return epath.Path(self.path).name

  def file_content(self) -> bytes:
    """That file's bytes: what `identity()`'s SHA-256 is of."""
    return epath.Path(self.path).read_bytes()

  def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Every text's ids, concatenated (int64), and how many each text has: `encode` of each, in one call."""
    encoded = [self.encode(text) for text in texts]
    return np.fromiter(itertools.chain.from_iterable(encoded), np.int64), np.array([len(e) for e in encoded], np.int64)

  def encode_documents(self, documents: list[list[str]]) -> tuple[np.ndarray, np.ndarray]:
    """Every sentence of every document: ids concatenated (int64), and how many each sentence has. Each sentence on
    its own (`encode_batch`); `bpe.py` encodes them as the document's running text instead."""
    return self.encode_batch([sentence for document in documents for sentence in document])

  def identity(self) -> dict:
    """What makes two tokenizers the same: kind and file content (the path is informative only)."""
    if self._sha256 is None:
      self._sha256 = file_sha256(self.path)
    return {"kind": self.kind, "path": self.path, "sha256": self._sha256}
