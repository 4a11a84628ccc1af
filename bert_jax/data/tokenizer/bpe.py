"""Byte-level BPE (RoBERTa's and GPT-2's), through Hugging Face's `tokenizers`.

Input: a `vocab.json` with `merges.txt` beside it (what RoBERTa and GPT-2 publish), or a `tokenizer.json` whose model
is BPE over the byte-level pre-tokenizer (RoBERTa's hub repositories ship one; ModernBERT's is its only file). The
pipeline is RoBERTa's: GPT-2's pre-tokenizing regex on the text's bytes (no prefix space, no normalizer), BPE merges,
no unknown token (every byte has a piece). The special tokens go by RoBERTa's names (`<pad> <unk> <s> </s> <mask>`)
or, in a vocabulary without them, BERT's (`[PAD] [UNK] [CLS] [SEP] [MASK]`, ModernBERT's).

**Corpus text never becomes a control token.** "The <mask> token" is encoded as the characters it is, as fairseq's
encoder does; the ids equal `transformers`' `RobertaTokenizer(vocab, merges, split_special_tokens=True)` (by default
RobertaTokenizer turns such text into the `<mask>` id and drops the space before it). `tests/test_tokenizer.py`
checks it on accents, CJK, emoji, runs of spaces, tabs and newlines, contractions and "<mask>" text.

**One file.** A tokenizer's identity is one file's SHA-256 and a checkpoint stores one file, so whatever it is read
from, the tokenizer is stored as the `tokenizer.json` that `tokenizers` writes for this pipeline (vocabulary and
merges, the byte-level pre-tokenizer and decoder; no added tokens, no post-processor): `file_content()`, hashed by
`identity()`. Reading that file back gives the same bytes; so do `vocab.json` + `merges.txt` and a hub
`tokenizer.json` of the same vocabulary. `vocab_merges_files()` gives the pair back for Hugging Face exports.

**Documents as running text.** Corpus preparation encodes each sentence, and a sentence on its own has no "Ġ" (the
space) on its first word; `encode_documents` puts back the space between sentences, so the ids are those of the
document's running text (RoBERTa encodes lines of text, not sentences).
"""

import hashlib
import json
import tempfile

import numpy as np
from etils import epath

from bert_jax.data.tokenizer.base import Tokenizer
from bert_jax.data.tokenizer_names import MERGES, TOKENIZER_JSON, VOCAB  # noqa: F401 (read from here too)

_WORD_START = "\u0120"  # "Ġ": the byte-level symbol of a space, which begins every word but a text's first.


def _read_merges(path: epath.Path) -> list[tuple[str, str]]:
  """`merges.txt`: an optional "#version" line, then one merge ("left right") per line."""
  lines = path.read_text(encoding="utf-8").splitlines()
  first = 1 if lines and lines[0].startswith("#version") else 0
  merges = []
  for number, line in enumerate(lines[first:], start=first + 1):
    if not line:
      continue
    parts = line.split(" ")
    if len(parts) != 2:
      raise ValueError(f"{path} line {number}: {line!r} is not a merge of two pieces ('left right').")
    merges.append((parts[0], parts[1]))
  return merges


def _read_tokenizer_json(path: epath.Path, data: dict) -> tuple[dict[str, int], list[tuple[str, str]]]:
  """The vocabulary (added tokens included) and merges of a byte-level BPE `tokenizer.json`; refuses any other."""
  model, pre_tokenizer = data["model"], data.get("pre_tokenizer") or {}
  found = dict(model=model.get("type"), normalizer=data.get("normalizer"), pre_tokenizer=pre_tokenizer.get("type"))
  found["add_prefix_space"] = pre_tokenizer.get("add_prefix_space")
  expected = dict(model="BPE", normalizer=None, pre_tokenizer="ByteLevel", add_prefix_space=False)
  if found != expected:
    raise ValueError(f"{path} is not a byte-level BPE tokenizer as RoBERTa's: it has {found}; expected {expected}.")
  vocab = dict(model["vocab"])
  for token in data.get("added_tokens", []):  # Usually in the vocabulary already (RoBERTa's specials are).
    vocab.setdefault(token["content"], token["id"])
  merges = [tuple(merge.split(" ")) if isinstance(merge, str) else tuple(merge) for merge in model["merges"]]
  return vocab, merges


def _read(path: str) -> tuple[dict[str, int], list[tuple[str, str]]]:
  path = epath.Path(path)
  try:
    data = json.loads(path.read_text(encoding="utf-8"))
  except json.JSONDecodeError as error:
    raise ValueError(f"{path} is not JSON ({error}); a BPE tokenizer is a vocab.json or a tokenizer.json.") from None
  if isinstance(data, dict) and isinstance(data.get("model"), dict):
    return _read_tokenizer_json(path, data)
  merges_file = path.parent / MERGES
  if not merges_file.exists():
    raise FileNotFoundError(f"{path} is a BPE vocabulary without its merges: {merges_file} does not exist.")
  return data, _read_merges(merges_file)


def _pipeline(path: str, vocab: dict[str, int], merges: list[tuple[str, str]]):
  """The canonical `tokenizers.Tokenizer`, after checking that the vocabulary is a byte-level one."""
  from tokenizers import Tokenizer as HfTokenizer
  from tokenizers import decoders, models, pre_tokenizers

  if not isinstance(vocab, dict) or sorted(vocab.values()) != list(range(len(vocab))):
    raise ValueError(f"{path}: the vocabulary must map each piece to a distinct id, 0 to its size less one.")
  missing = sorted(set(pre_tokenizers.ByteLevel.alphabet()) - set(vocab))
  if missing:
    raise ValueError(
      f"{path} is not a byte-level BPE vocabulary: it lacks {len(missing)} of the 256 byte symbols "
      f"(e.g. {missing[:5]}), so some text would have no ids."
    )
  try:
    tokenizer = HfTokenizer(models.BPE(vocab, merges))
  except Exception as error:  # noqa: BLE001 - tokenizers raises plain Exception for a bad merge.
    raise ValueError(f"{path}: the merges do not fit the vocabulary: {error}") from None
  tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tokenizer.decoder = decoders.ByteLevel()
  return tokenizer


class BytePairTokenizer(Tokenizer):
  kind = "bpe"
  special_names = (("<pad>", "[PAD]"), ("<unk>", "[UNK]"), ("<s>", "[CLS]"), ("</s>", "[SEP]"), ("<mask>", "[MASK]"))
  pair_special_tokens = 4  # <s> a </s></s> b </s>

  def __init__(self, path: str):
    vocab, merges = _read(path)
    self._tokenizer = _pipeline(path, vocab, merges)
    self._content = self._tokenizer.to_str().encode("utf-8")
    pieces = sorted(vocab, key=vocab.get)
    super().__init__(path, pieces, np.array([piece.startswith(_WORD_START) for piece in pieces]))
    self._sha256 = hashlib.sha256(self._content).hexdigest()

  def pair_row(self, a: list[int], b: list[int]) -> tuple[list[int], list[int]]:
    """RoBERTa's fine-tuning row: <s> a </s></s> b </s>, one token type (`RobertaTokenizer`'s)."""
    ids = [self.cls_id, *a, self.sep_id, *([self.sep_id, *b, self.sep_id] if b else [])]
    return ids, [0] * len(ids)

  @property
  def file_name(self) -> str:
    return TOKENIZER_JSON

  def file_content(self) -> bytes:
    return self._content

  def encode(self, text: str) -> list[int]:
    return self._tokenizer.encode(text, add_special_tokens=False).ids

  def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    encoded = [e.ids for e in self._tokenizer.encode_batch(texts, add_special_tokens=False)]  # Rust, in threads.
    return np.fromiter((i for e in encoded for i in e), np.int64), np.array([len(e) for e in encoded], np.int64)

  def encode_documents(self, documents: list[list[str]]) -> tuple[np.ndarray, np.ndarray]:
    """Each sentence but a document's first after a space: the ids of `" ".join(document)`, cut per sentence."""
    texts = [" " * (i > 0) + sentence for document in documents for i, sentence in enumerate(document)]
    return self.encode_batch(texts)

  def decode(self, ids) -> str:
    return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

  def vocab_merges_files(self) -> dict[str, bytes]:
    """`vocab.json` and `merges.txt`, as `tokenizers` writes them (what `RobertaTokenizer` reads): name -> bytes."""
    with tempfile.TemporaryDirectory() as directory:
      self._tokenizer.model.save(directory)
      return {name: (epath.Path(directory) / name).read_bytes() for name in (VOCAB, MERGES)}
