"""Tokenizers: WordPiece against `transformers`' BertTokenizer, SentencePiece trained with BERT's special ids."""

import numpy as np
import pytest
from transformers import BertTokenizer

from bert_jax.data.tokenizer import (
  SENTENCEPIECE_SPECIAL_IDS,
  SPECIAL_TOKENS,
  is_start_piece,
  load_tokenizer,
  train_sentencepiece,
)
from bert_jax.data.tokenizer.wordpiece import basic_tokenize

TEXT = [
  "The quick brown fox jumped over the lazy dog's kennel, didn't it?",
  "Héllo Wörld! Crème brûlée costs €12.50 (about $13.75) at Café Ñandú — naïve, isn't it?",
  "In 1969, Apollo 11's crew—Armstrong, Aldrin & Collins—landed; 3.14159 ≈ π, 1,000,000 > 999_999.",
  "東京タワーは高い。你好，世界！한국어 텍스트와 ひらがな mixed with English words.",
  "Control\x00characters\x07 and\ttabs\r\nnew lines\u200b zero-width\ufffd replacement\u00adsoft hyphen.",
  "Antidisestablishmentarianism and pneumonoultramicroscopicsilicovolcanoconiosis are long; "
  + "a" * 101
  + " is longer than one hundred characters, "
  + "b" * 100
  + " is exactly one hundred.",
  "Émile Zola wrote «J'accuse…!» in L'Aurore; Ελληνικά, русский язык, العربية, עברית.",
  "E-mail: someone@example.com; URL: https://example.org/path?q=1&r=2#frag; C++/C# ~ `code` ^ | \\ .",
]

# Where TensorFlow Text's own normaliser and byte-counted word limit differ from Google's tokenization.py; the
# compiled WordPiece (encode_batch) must still give the reference's ids.
COMPILED_EDGE_CASES = [
  "Full-width Ａｂｃ ＡＢＣ， ligatures ﬁne ﬂow, ß straße, İstanbul, ΟΔΟΣ ΟΔΟΣ. ǅ Ⅻ… ½ ™",
  "é" * 60 + " is 60 characters and 120 bytes; " + "é" * 101 + " is 101 characters.",
  "x\u0300" * 60 + " counts its combining marks as characters (cased).",
  "한" * 40 + " becomes 80 jamo uncased; " + "한국어" * 12 + " becomes 108.",
  "日本語" * 40 + " are CJK words of one character each; " + "a" * 100 + "!" + "b" * 101,
  "\u2028line\u2029para\u00a0nbsp\u3000ideographic \x1c\x1f\x85\x0b\x0c controls 😀 🇫🇷 a\u0301b\u0301",
  "",
  "   ",
]


def _write_vocab(path, lower_case: bool) -> None:
  """A small vocabulary from the text itself: whole words for some, characters and ## pieces for the rest."""
  words = sorted({w for line in TEXT for w in basic_tokenize(line, lower_case)})
  chars = sorted({c for w in words for c in w})
  tokens = list(SPECIAL_TOKENS) + [f"[unused{i}]" for i in range(3)]
  tokens += chars + [f"##{c}" for c in chars]
  tokens += [w for i, w in enumerate(words) if i % 2 == 0 and len(w) > 1]
  tokens += ["##ing", "##s", "##ed", "##tion", "##ism", "##ment", "##ness", "dis", "anti", "##est"]
  unique = list(dict.fromkeys(tokens))
  path.write_text("\n".join(unique) + "\n", encoding="utf-8")


@pytest.mark.parametrize("lower_case", [True, False])
def test_wordpiece_ids_equal_transformers_bert_tokenizer(tmp_path, lower_case):
  vocab = tmp_path / "vocab.txt"
  _write_vocab(vocab, lower_case)
  ours = load_tokenizer("wordpiece", str(vocab), lower_case=lower_case)
  reference = BertTokenizer(str(vocab), do_lower_case=lower_case)
  for line in TEXT:
    expected = reference.encode(line, add_special_tokens=False)
    assert ours.encode(line) == expected, (line, ours.tokenize(line), reference.tokenize(line))
  assert ours.unk_id in ours.encode(TEXT[5])  # The 101-character word.
  assert (ours.pad_id, ours.unk_id, ours.cls_id, ours.sep_id, ours.mask_id) == (0, 1, 2, 3, 4)
  assert ours.word_start[ours.encode("the")[0]] and not ours.word_start[ours.pieces.index("##s")]


@pytest.mark.parametrize("lower_case", [True, False])
def test_compiled_wordpiece_gives_the_reference_ids(tmp_path, lower_case):
  """encode_batch (TensorFlow Text's FastBertTokenizer, with Google's text cleanup) == encode (wordpiece.py, the
  reference), text by text, on the edge cases and on the edge cases of the compiled path."""
  vocab = tmp_path / "vocab.txt"
  _write_vocab(vocab, lower_case)
  tokenizer = load_tokenizer("wordpiece", str(vocab), lower_case=lower_case)
  texts = TEXT + COMPILED_EDGE_CASES
  ids, lengths = tokenizer.encode_batch(texts)
  assert ids.dtype == lengths.dtype == np.int64 and len(lengths) == len(texts)
  for text, row in zip(texts, np.split(ids, np.cumsum(lengths)[:-1]), strict=True):
    assert row.tolist() == tokenizer.encode(text), (text, [tokenizer.pieces[i] for i in row], tokenizer.tokenize(text))
  assert tokenizer.encode_batch([])[1].shape == (0,)


def test_wordpiece_uncased_strips_accents_and_splits_cjk(tmp_path):
  vocab = tmp_path / "vocab.txt"
  _write_vocab(vocab, True)
  tokenizer = load_tokenizer("wordpiece", str(vocab))
  assert basic_tokenize("Crème BRÛLÉE, 東京!", lower_case=True) == ["creme", "brulee", ",", "東", "京", "!"]
  assert basic_tokenize("Crème", lower_case=False) == ["Crème"]
  assert tokenizer.decode(tokenizer.encode("the quick brown fox")) == "the quick brown fox"


def test_sentencepiece_trains_with_bert_special_ids_and_round_trips(tmp_path):
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("\n".join(TEXT * 20), encoding="utf-8")
  path = train_sentencepiece([str(corpus)], str(tmp_path / "sp"), vocab_size=200)
  tokenizer = load_tokenizer("sentencepiece", path)
  assert tokenizer.vocab_size == 200
  for token, index in SENTENCEPIECE_SPECIAL_IDS.items():
    assert tokenizer.pieces[index] == token
  assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id) == (0, 1, 2, 3, 4)
  line = "The quick brown fox jumped over the lazy dog's kennel."
  ids = tokenizer.encode(line)
  assert tokenizer.decode(ids) == line
  assert not np.isin(ids, tokenizer.special_ids[[0, 2, 3, 4]]).any()  # Text never yields a control token.
  assert tokenizer.word_start[ids[0]]
  identity = tokenizer.identity()
  assert identity["kind"] == "sentencepiece" and len(identity["sha256"]) == 64
  ids, lengths = tokenizer.encode_batch(TEXT)
  assert ids.tolist() == [i for text in TEXT for i in tokenizer.encode(text)]
  assert lengths.tolist() == [len(tokenizer.encode(text)) for text in TEXT]


# (piece, whether it begins a word) by ALBERT's `_is_start_piece_sp`: the "\u2581" marker or "<"; one punctuation
# character; a character that is not an English letter or punctuation (a digit, an accent: whole pieces of their own).
START_PIECES = [
  ("\u2581the", True),
  ("\u2581", True),
  ("the", False),
  ("Ing", False),
  (".", True),
  ("s.", False),
  ("99", True),
  ("\u00e9t", True),
  ("'s", True),
  ("<unk>", True),
]


@pytest.mark.parametrize("piece,starts", START_PIECES, ids=[repr(piece) for piece, _ in START_PIECES])
def test_a_sentencepiece_piece_begins_a_word_by_albert_s_rule(piece, starts):
  assert is_start_piece(piece) is starts


def test_a_vocabulary_without_bert_special_tokens_is_refused(tmp_path):
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("[PAD]\n[UNK]\nhello\n", encoding="utf-8")
  with pytest.raises(ValueError, match=r"has no \['\[CLS\]', '\[SEP\]', '\[MASK\]'\]"):
    load_tokenizer("wordpiece", str(vocab))
  with pytest.raises(ValueError, match="Unknown tokenizer kind 'bpe'"):
    load_tokenizer("bpe", str(vocab))
