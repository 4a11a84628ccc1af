"""Tokenizers: WordPiece against `transformers`' BertTokenizer, SentencePiece trained with BERT's special ids (and
ALBERT's names), byte-level BPE against RobertaTokenizer and stored as one file."""

import hashlib
import json
import pathlib
import re

import numpy as np
import pytest
from transformers import BertTokenizer, RobertaTokenizer, RobertaTokenizerFast

from bert_jax.data.tokenizer import (
  SENTENCEPIECE_SPECIAL_IDS,
  SPECIAL_TOKENS,
  is_start_piece,
  load_tokenizer,
  tokenizer_sha256,
  train_sentencepiece,
)
from bert_jax.data.tokenizer.wordpiece import basic_tokenize
from bert_jax.finetune.contract import encode_pair
from bert_jax.paths import WriteError
from bert_jax.workdir import checkpoints

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
  by_document = tokenizer.encode_documents([texts[:3], texts[3:]])  # The default: each sentence on its own.
  assert all(np.array_equal(a, b) for a, b in zip(by_document, (ids, lengths), strict=True))


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


def test_sentencepiece_training_on_a_full_disk_names_the_file_and_leaves_nothing(tmp_path, monkeypatch):
  """sentencepiece cuts its files short on a full disk without an error (a 24 KiB model of 240 KiB, an empty .vocab,
  then every later load failed on them); where it cannot create a file it raises naming its own file."""
  import sentencepiece as spm

  corpus = tmp_path / "corpus.txt"
  corpus.write_text("\n".join(TEXT * 20), encoding="utf-8")
  train = spm.SentencePieceTrainer.train
  directory = tmp_path / "tokenizer"
  directory.mkdir()

  def cut_short(model_prefix, **kwargs):
    train(model_prefix=model_prefix, **kwargs)
    model = pathlib.Path(f"{model_prefix}.model")
    model.write_bytes(model.read_bytes()[:4096])
    pathlib.Path(f"{model_prefix}.vocab").write_bytes(b"")

  def cannot_create_the_vocab(model_prefix, **kwargs):
    train(model_prefix=model_prefix, **kwargs)
    raise RuntimeError(f'RESOURCE_EXHAUSTED: "{model_prefix}.vocab": No space left on device')

  prefix = str(directory / "sp")
  monkeypatch.setattr(spm.SentencePieceTrainer, "train", cut_short)
  with pytest.raises(
    WriteError,
    match=rf"Cannot write {prefix}.model: sentencepiece cut its files short \(4,096 bytes of model, 0 of 200",
  ):
    train_sentencepiece([str(corpus)], prefix, vocab_size=200)
  assert not list(directory.iterdir())
  monkeypatch.setattr(spm.SentencePieceTrainer, "train", cannot_create_the_vocab)
  with pytest.raises(WriteError, match=rf"^Cannot write {prefix}.vocab: No space left on device.$"):
    train_sentencepiece([str(corpus)], prefix, vocab_size=200)
  assert not list(directory.iterdir())
  monkeypatch.setattr(spm.SentencePieceTrainer, "train", train)
  with pytest.raises(RuntimeError, match="Vocabulary size too high"):  # Not a write: sentencepiece's own error.
    train_sentencepiece([str(corpus)], prefix, vocab_size=100_000)
  assert train_sentencepiece([str(corpus)], prefix, vocab_size=200) == f"{prefix}.model"
  assert sorted(p.name for p in directory.iterdir()) == ["sp.model", "sp.vocab"]


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
  with pytest.raises(ValueError, match="Unknown tokenizer kind 'unigram'"):
    load_tokenizer("unigram", str(vocab))


def test_a_file_of_another_kind_is_refused_naming_the_path_and_both_kinds(fixture_tokenizers, tmp_path):
  """Every plausible mix-up of the three kinds' files, each refused before its parser sees it (a SentencePiece model
  read as a vocab.txt was a bare UnicodeDecodeError); and a vocab.txt that is not UTF-8, or a model cut short."""
  vocab_json, merges = train_bpe(tmp_path / "bpe")
  tokenizer_json = tmp_path / "bpe" / "tokenizer.json"
  tokenizer_json.write_bytes(load_tokenizer("bpe", vocab_json).file_content())
  files = {
    "vocab.txt": fixture_tokenizers["wordpiece"].path,
    "sp.model": fixture_tokenizers["sentencepiece"].path,
    "vocab.json": vocab_json,
    "tokenizer.json": str(tokenizer_json),
    "merges.txt": merges,
  }
  looks_like = {
    "vocab.txt": (r"a WordPiece vocab.txt \(UTF-8 text, one token a line\)", "wordpiece"),
    "sp.model": (r"a SentencePiece .model \(a binary protobuf\)", "sentencepiece"),
    "vocab.json": (r"a BPE tokenizer.json or vocab.json \(JSON\)", "bpe"),
    "tokenizer.json": (r"a BPE tokenizer.json or vocab.json \(JSON\)", "bpe"),
    "merges.txt": (r"a BPE merges.txt \(kind 'bpe' reads the vocab.json beside it\)", "bpe"),
  }
  reads = {"wordpiece": "vocab.txt", "sentencepiece": "sp.model", "bpe": "vocab.json"}
  refused = 0
  for kind in ("wordpiece", "sentencepiece", "bpe"):
    for name, path in files.items():
      shape, its_kind = looks_like[name]
      if name == reads[kind] or (kind == "bpe" and name == "tokenizer.json"):
        assert load_tokenizer(kind, path).kind == kind
        continue
      fix = f"set tokenizer.kind='{its_kind}', or name such a file" if its_kind != kind else "name such a file"
      with pytest.raises(ValueError) as refusal:
        load_tokenizer(kind, path)
      expected = rf"Tokenizer file {path} looks like {shape}, but the tokenizer kind is '{kind}', which reads "
      assert re.fullmatch(expected + rf"{looks_like[reads[kind]][0]}: {fix}\.", str(refusal.value))
      refused += 1
  assert refused == 11
  latin1 = tmp_path / "latin1" / "vocab.txt"
  latin1.parent.mkdir()
  latin1.write_bytes("\n".join([*SPECIAL_TOKENS, "café"]).encode("latin-1"))
  with pytest.raises(
    ValueError, match=rf"{latin1} is not UTF-8 at byte 34 \(b'\\xe9'\); a WordPiece vocab.txt is UTF-8"
  ):
    load_tokenizer("wordpiece", str(latin1))
  cut = tmp_path / "cut.model"
  cut.write_bytes(pathlib.Path(files["sp.model"]).read_bytes()[:1000])
  with pytest.raises(ValueError, match=rf"{cut} is not a SentencePiece model: its protobuf does not parse"):
    load_tokenizer("sentencepiece", str(cut))


def test_sentencepiece_takes_albert_names_for_padding_and_unknown(fixture_tokenizers, tmp_path):
  """ALBERT's `spiece.model` names them `<pad>` and `<unk>` (and has [CLS] [SEP] [MASK]): the same ids."""
  from sentencepiece import sentencepiece_model_pb2

  bert_names = fixture_tokenizers["sentencepiece"]
  proto = sentencepiece_model_pb2.ModelProto.FromString(bert_names.file_content())
  proto.pieces[0].piece, proto.pieces[1].piece = "<pad>", "<unk>"
  (tmp_path / "spiece.model").write_bytes(proto.SerializeToString())
  albert_names = load_tokenizer("sentencepiece", str(tmp_path / "spiece.model"))
  assert albert_names.special_tokens == ("<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]")
  assert albert_names.special_ids.tolist() == bert_names.special_ids.tolist() == [0, 1, 2, 3, 4]
  assert albert_names.word_start[:5].all()
  line = "the man said that the dog was good"
  assert albert_names.encode(line) == bert_names.encode(line)


# Byte-level BPE's own hard cases besides TEXT's: runs of spaces, tabs and newlines, contractions, emoji, special
# token names in text.
BPE_TEXT = [
  *TEXT,
  "  Two leading spaces,   three inside,\ta tab\t\tand\nnew\n\nlines\r\n and two trailing  ",
  "We'll see; they're sure I'm right, you've heard she'd go, it's HE'S, he'll not, and dogs' bones.",
  "Emoji 😀👍🏽 🇫🇷 and a ZWJ family 👩\u200d👩\u200d👧; the <mask> token, <s>tags</s>, <pad> and <unk> are text.",
]
ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


def train_bpe(directory, special_tokens=ROBERTA_SPECIALS) -> tuple[str, str]:
  """A 400-piece byte-level BPE trained as RoBERTa's on BPE_TEXT (specials first: <s>=0, <pad>=1, </s>=2, <unk>=3,
  <mask>=4); returns (vocab.json, merges.txt)."""
  from tokenizers import ByteLevelBPETokenizer

  directory.mkdir(exist_ok=True)
  trainer = ByteLevelBPETokenizer()
  trainer.train_from_iterator(BPE_TEXT * 2, vocab_size=400, special_tokens=special_tokens, show_progress=False)
  vocab, merges = trainer.save_model(str(directory))
  return vocab, merges


def test_byte_level_bpe_ids_equal_roberta_tokenizer_that_splits_special_token_text(tmp_path):
  vocab, merges = train_bpe(tmp_path)
  ours = load_tokenizer("bpe", vocab)
  assert ours.vocab_size == 400
  reference = RobertaTokenizer(vocab, merges, split_special_tokens=True)
  texts = BPE_TEXT + COMPILED_EDGE_CASES
  for line in texts:
    ids = ours.encode(line)
    assert ids == reference.encode(line, add_special_tokens=False), (line, [ours.pieces[i] for i in ids])
    assert ours.decode(ids) == line  # Byte-level: nothing is lost.
  ids, lengths = ours.encode_batch(texts)
  assert ids.dtype == lengths.dtype == np.int64
  assert ids.tolist() == [i for line in texts for i in ours.encode(line)]
  assert lengths.tolist() == [len(ours.encode(line)) for line in texts]

  assert ours.special_tokens == ("<pad>", "<unk>", "<s>", "</s>", "<mask>")
  assert (ours.pad_id, ours.unk_id, ours.cls_id, ours.sep_id, ours.mask_id) == (1, 3, 0, 2, 4)
  # Corpus text never becomes a control token; RobertaTokenizer's default makes "<mask>" in text one.
  assert not np.isin(ours.encode(BPE_TEXT[-1]), ours.special_ids).any()
  assert ours.mask_id in RobertaTokenizer(vocab, merges).encode(BPE_TEXT[-1], add_special_tokens=False)

  # A word starts at a "Ġ" piece (or is a special token); its other pieces continue it.
  words = " Antidisestablishmentarianism and pneumonoultramicroscopicsilicovolcanoconiosis"
  starts = ours.word_start[ours.encode(words)]
  assert starts.sum() == 3 and starts[0] and len(starts) > 6
  assert ours.word_start[ours.special_ids].all()


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_a_fine_tuning_row_of_one_or_two_texts_is_the_reference_tokenizer_s(tmp_path, kind):
  """BERT's [CLS] a [SEP] b [SEP] with segments 0 then 1; RoBERTa's <s> a </s></s> b </s> with one token type;
  both truncated longest first to the same length as `transformers`' tokenizers."""
  if kind == "bpe":
    vocab, merges = train_bpe(tmp_path)
    ours, reference = load_tokenizer("bpe", vocab), RobertaTokenizer(vocab, merges, split_special_tokens=True)
  else:
    vocab = tmp_path / "vocab.txt"
    _write_vocab(vocab, lower_case=True)
    ours, reference = load_tokenizer("wordpiece", str(vocab), lower_case=True), BertTokenizer(str(vocab))
  for a, b, length in [(TEXT[0], TEXT[2], 64), (TEXT[0], TEXT[2], 24), (TEXT[6], None, 16), (TEXT[1], TEXT[7], 19)]:
    input_ids, input_mask, segment_ids = encode_pair(
      ours, ours.encode(a), None if b is None else ours.encode(b), length
    )
    expected = reference(a, b, max_length=length, truncation=True, padding="max_length", return_token_type_ids=True)
    assert input_ids.tolist() == expected["input_ids"], (kind, a, b, length)
    assert input_mask.tolist() == expected["attention_mask"]
    assert segment_ids.tolist() == expected["token_type_ids"]
  assert (input_ids == ours.sep_id).sum() == (3 if kind == "bpe" else 2)  # The last row holds two texts.


def test_byte_level_bpe_encodes_documents_as_their_running_text(tmp_path):
  """Sentence by sentence, RoBERTa's first word of a sentence would lose its "Ġ"; `encode_documents` keeps it."""
  tokenizer = load_tokenizer("bpe", train_bpe(tmp_path)[0])
  documents = [BPE_TEXT[:3], [BPE_TEXT[3]], BPE_TEXT[4:]]
  ids, lengths = tokenizer.encode_documents(documents)
  sentences = iter(np.split(ids, np.cumsum(lengths)[:-1]))
  for document in documents:
    rows = [next(sentences) for _ in document]
    assert np.concatenate(rows).tolist() == tokenizer.encode(" ".join(document))
    assert rows[0].tolist() == tokenizer.encode(document[0])
    for row, sentence in zip(rows[1:], document[1:], strict=True):
      assert tokenizer.pieces[row[0]].startswith("\u0120") and row.tolist() != tokenizer.encode(sentence)


def test_byte_level_bpe_is_stored_as_one_tokenizer_json_and_written_back_as_roberta_files(tmp_path):
  vocab, merges = train_bpe(tmp_path / "trained")
  ours = load_tokenizer("bpe", vocab)
  sha256 = ours.identity()["sha256"]
  item = checkpoints.tokenizer_item(ours)  # What a checkpoint stores.
  assert item["identity"]["filename"] == "tokenizer.json" and hashlib.sha256(item["content"]).hexdigest() == sha256
  assert tokenizer_sha256("bpe", vocab) == sha256
  stored = tmp_path / "stored" / "tokenizer.json"
  stored.parent.mkdir()
  stored.write_bytes(item["content"])
  restored = load_tokenizer("bpe", str(stored))
  assert restored.file_content() == item["content"] and restored.identity()["sha256"] == sha256
  assert all(restored.encode(line) == ours.encode(line) for line in BPE_TEXT)
  # A hub tokenizer.json of the same vocabulary (RobertaTokenizerFast's: added tokens, a post-processor) too.
  hub = tmp_path / "hub.json"
  RobertaTokenizerFast(vocab, merges).backend_tokenizer.save(str(hub))
  assert load_tokenizer("bpe", str(hub)).file_content() == item["content"]

  exported = tmp_path / "exported"  # What a Hugging Face export writes: RobertaTokenizer reads it.
  exported.mkdir()
  for name, content in restored.vocab_merges_files().items():
    (exported / name).write_bytes(content)
  assert json.loads((exported / "vocab.json").read_text()) == json.loads(open(vocab).read())
  reference = RobertaTokenizer(str(exported / "vocab.json"), str(exported / "merges.txt"), split_special_tokens=True)
  assert all(reference.encode(line, add_special_tokens=False) == ours.encode(line) for line in BPE_TEXT)
  assert load_tokenizer("bpe", str(exported / "vocab.json")).identity()["sha256"] == sha256


def test_byte_level_bpe_refuses_what_is_not_roberta_s(tmp_path):
  vocab, merges = train_bpe(tmp_path / "no_mask", ROBERTA_SPECIALS[:-1])
  with pytest.raises(
    ValueError, match=r"has no \['<mask> or \[MASK\]'\]; BERT needs \['<pad> or \[PAD\]', '<unk> or \[UNK\]', "
  ):
    load_tokenizer("bpe", vocab)
  (tmp_path / "no_mask" / "merges.txt").unlink()
  with pytest.raises(FileNotFoundError, match=r"vocab.json is a BPE vocabulary without its merges: .*merges.txt"):
    load_tokenizer("bpe", vocab)
  (tmp_path / "letters").mkdir()
  (tmp_path / "letters" / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate([*ROBERTA_SPECIALS, "a"])}))
  (tmp_path / "letters" / "merges.txt").write_text("#version: 0.2\n")
  with pytest.raises(ValueError, match="not a byte-level BPE vocabulary: it lacks 255 of the 256 byte symbols"):
    load_tokenizer("bpe", str(tmp_path / "letters" / "vocab.json"))
  vocab, merges = train_bpe(tmp_path / "prefix_space")
  tokenizer_json = RobertaTokenizerFast(vocab, merges, add_prefix_space=True).backend_tokenizer.to_str()
  (tmp_path / "prefix_space" / "tokenizer.json").write_text(tokenizer_json)
  with pytest.raises(ValueError, match="not a byte-level BPE tokenizer as RoBERTa's: .*'add_prefix_space': True"):
    load_tokenizer("bpe", str(tmp_path / "prefix_space" / "tokenizer.json"))
