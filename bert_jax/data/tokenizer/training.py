"""Vocabulary training, for `--mode=prepare` when `tokenizer.path` does not exist yet (`train_vocabulary`): WordPiece
(Google BERT's `vocab.txt`), byte-level BPE (RoBERTa's `vocab.json` + `merges.txt`, or ModernBERT's `tokenizer.json`)
and SentencePiece (a unigram `.model`).

WordPiece and BPE are trained with Hugging Face's `tokenizers` on a sample of what preparation tokenizes
(`corpus_texts`: the input read by `text.py`'s readers in preparation's work units, each sentence as the kind's
`encode_documents` encodes it): at most `tokenizer.train_max_sentences` texts, drawn by `sample_texts`. The sample
is the texts of lowest BLAKE2b hash keyed by the seed, so it is a function of the input (the multiset of its texts)
and the seed alone, whatever order they are read in, and memory holds the sample alone; samples of parts of a
corpus, merged by the same rule, give the sample of the whole (a distributed reader can draw it part by part).
SentencePiece trains on the files themselves (its own sampler over their lines, `input_sentence_size`).

Special tokens go where each family has them: WordPiece `[PAD] [UNK] [CLS] [SEP] [MASK]` at ids 0 to 4 (as a
trained SentencePiece model has them; Google's `vocab.txt` puts `[PAD]` at 0 and the others at 100 to 103);
RoBERTa `<s> <pad> </s> <unk>` at 0 to 3 and `<mask>` last (roberta-base's layout); ModernBERT `[UNK] [CLS] [SEP]
[PAD] [MASK]` after the pieces, in ModernBERT's order, with its `[CLS] x [SEP]` post-processor.

**Deterministic**: the same input, settings and seed give byte-identical files in any process.
`tokenizers`' WordPiece trainer gives each `##` continuation of a character its id in hash-map order (a new order
in every process; tokenizers issue #1794), and the merges break ties by id, so the vocabulary would change from run
to run; here the alphabet and its continuations are fixed before training (`_alphabet`), in code-point order.
Each file appears whole or not at all (staged beside it, renamed into place; on gs:// one upload), else
paths.WriteError.
"""

import collections
import hashlib
import heapq
import json
import os
import re
import shutil
import string
import tempfile
from collections.abc import Iterable

from absl import logging
from etils import epath

from bert_jax import paths
from bert_jax.data.tokenizer import wordpiece
from bert_jax.data.tokenizer.base import SPECIAL_TOKENS
from bert_jax.data.tokenizer_names import BPE_FORMATS, MERGES

ROBERTA_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # Ids 0 to 3; "<mask>" is the last id.
MODERNBERT_SPECIALS = ("[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]")  # After the pieces, in this order.
BYTES = 256  # A byte-level BPE's alphabet: a symbol for each byte.
# WordPiece: characters of the alphabet (the most frequent; the rest of the corpus's characters become [UNK]), and
# the fewest times a pair must occur to be merged (tokenizers' BertWordPieceTokenizer's defaults); BPE: likewise.
_WORDPIECE_ALPHABET = 1000
_MIN_FREQUENCY = 2
_TRAINING_THREADS = 16  # SentencePiece's (its model depends on the count).


def sample_key(seed_key: bytes, item: str) -> int:
  """The key `sample_texts` orders texts by: their 128-bit BLAKE2b hash keyed by the seed."""
  return int.from_bytes(hashlib.blake2b(item.encode("utf-8"), digest_size=16, key=seed_key).digest(), "big")


def sample_texts(texts: Iterable[str], max_texts: int, seed: int) -> list[str]:
  """At most `max_texts` of `texts`: those of the lowest 128-bit BLAKE2b hash keyed by `seed`, in that order.

  A function of the multiset of `texts` and `seed`, not of their order: samples of parts of a corpus, chained and
  sampled again, are the sample of the whole. The copies of a text share a hash: all of them are in the sample,
  none, or (at its highest hash) as many as fill it. Memory holds `max_texts` texts (a heap of the lowest hashes
  seen so far)."""
  seed_key = str(seed).encode()
  heap = []  # (-hash, text): the largest hash kept is heap[0].
  for item in texts:
    key = sample_key(seed_key, item)
    if len(heap) < max_texts:
      heapq.heappush(heap, (-key, item))
    elif -key > heap[0][0]:
      heapq.heapreplace(heap, (-key, item))
  return [item for _, item in sorted(heap, reverse=True)]


def _write_whole(path: str, content: bytes) -> None:
  """Writes `content` to `path` whole or not at all (`paths.staged_file`), else paths.WriteError naming `path`."""
  with paths.writing(path), paths.staged_file(path) as local:
    epath.Path(local).write_bytes(content)


def _never_continues(character: str) -> bool:
  """Whether `tokenizers`' BERT normaliser and pre-tokenizer make `character` a word of its own wherever it is: ASCII
  punctuation, and CJK ideographs in the blocks both it and Google's tokenization.py isolate (its table leaves out
  U+2B820-U+2B91F). Other punctuation is left to keep its `##` form (Unicode versions differ on a few)."""
  point = ord(character)
  return character in string.punctuation or (wordpiece._is_cjk(point) and not 0x2B820 <= point <= 0x2B91F)


def _alphabet(normalizer, texts: list[str]) -> list[str]:
  """The `_WORDPIECE_ALPHABET` characters of `texts` most frequent after `normalizer` (ties by code point), in
  code-point order. What `tokenizers`' `limit_alphabet` keeps, but for its ties, which it breaks in hash-map order."""
  counts = collections.Counter()
  for start in range(0, len(texts), 10_000):
    counts.update(normalizer.normalize_str("\n".join(texts[start : start + 10_000])))
  frequent = sorted((c for c in counts if not c.isspace()), key=lambda c: (-counts[c], c))
  return sorted(frequent[:_WORDPIECE_ALPHABET])


def train_wordpiece(texts: list[str], path: str, vocab_size: int, lower_case: bool) -> str:
  """Trains BERT's WordPiece on `texts` (tokenizers' WordPiece trainer with BERT's normaliser and pre-tokenizer:
  lower-cased and accents stripped with `lower_case`) into `path`, a Google BERT `vocab.txt` of at most `vocab_size`
  lines: `[PAD] [UNK] [CLS] [SEP] [MASK]` at ids 0 to 4, then the `##` continuation of each alphabet character that
  can continue a word, the alphabet, and the merged pieces in the order they were learnt. Returns `path`."""
  from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

  normalizer = normalizers.BertNormalizer(
    clean_text=True, handle_chinese_chars=True, strip_accents=lower_case, lowercase=lower_case
  )
  alphabet = _alphabet(normalizer, texts)
  # Every continuation a word can need, named before training: the trainer would otherwise create each one when it
  # first meets it, in hash-map order (see the module's docstring).
  continuations = [f"##{c}" for c in alphabet if not _never_continues(c)]
  fixed = len(SPECIAL_TOKENS) + len(continuations) + len(alphabet)
  if fixed > vocab_size:
    raise ValueError(
      f"model.vocab_size={vocab_size} is too small for a WordPiece vocabulary of this corpus: its {len(alphabet)} "
      f"characters, {len(continuations)} of their ## continuations and {len(SPECIAL_TOKENS)} special tokens need "
      f"{fixed} ids before any word."
    )
  tokenizer = Tokenizer(
    models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=wordpiece.MAX_INPUT_CHARS_PER_WORD)
  )
  tokenizer.normalizer = normalizer
  tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  trainer = trainers.WordPieceTrainer(
    vocab_size=vocab_size,
    min_frequency=_MIN_FREQUENCY,
    show_progress=False,
    special_tokens=[*SPECIAL_TOKENS, *continuations],
    initial_alphabet=alphabet,
    limit_alphabet=len(alphabet),  # The characters given, and no other.
    continuing_subword_prefix="##",
  )
  tokenizer.train_from_iterator(texts, trainer, length=len(texts))
  vocab = tokenizer.get_vocab()
  tokens = sorted(vocab, key=vocab.get)
  assert [vocab[token] for token in tokens] == list(range(len(tokens))), "the trainer's ids are not 0 to n - 1"
  content = "\n".join(tokens) + "\n"
  # One token a line, as both readers split lines (str.splitlines, and transformers' readlines): no token may hold
  # a line break of either (the normaliser removes control characters and turns whitespace into spaces).
  if content.splitlines() != tokens or any(token != token.strip() for token in tokens):
    raise ValueError(f"A trained WordPiece token holds a line break or whitespace; {path} would not read back.")
  _write_whole(path, content.encode("utf-8"))
  return path


def train_byte_level_bpe(texts: list[str], path: str, vocab_size: int, bpe_format: str) -> str:
  """Trains a byte-level BPE as RoBERTa's and ModernBERT's are (GPT-2's pre-tokenizing regex on the text's bytes, no
  prefix space, no normaliser: what `bpe.py` reads) on `texts`, with at most `vocab_size` ids. `bpe_format`:
  "roberta", `path` a `vocab.json` (`<s> <pad> </s> <unk>` at ids 0 to 3, `<mask>` the last id) with `merges.txt`
  written beside it first; "modernbert", `path` a `tokenizer.json` (`[UNK] [CLS] [SEP] [PAD] [MASK]` added after
  the pieces, and a post-processor that puts `[CLS] x [SEP]` around a text, as ModernBERT's file has). Returns
  `path`."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

  if bpe_format not in BPE_FORMATS:
    raise ValueError(f"tokenizer.train_bpe_format={bpe_format!r}; expected one of {BPE_FORMATS}.")
  roberta = bpe_format == "roberta"
  tokenizer = Tokenizer(models.BPE())
  tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tokenizer.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=vocab_size - (1 if roberta else len(MODERNBERT_SPECIALS)),
    min_frequency=_MIN_FREQUENCY,
    show_progress=False,
    special_tokens=list(ROBERTA_SPECIALS) if roberta else [],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
  )
  tokenizer.train_from_iterator(texts, trainer, length=len(texts))
  if not roberta:
    tokenizer.add_special_tokens(list(MODERNBERT_SPECIALS))
    tokenizer.post_processor = processors.TemplateProcessing(
      single="[CLS] $A [SEP]",
      pair="[CLS] $A [SEP] $B [SEP]",
      special_tokens=[(token, tokenizer.token_to_id(token)) for token in ("[CLS]", "[SEP]")],
    )
    _write_whole(path, tokenizer.to_str().encode("utf-8"))
    return path
  vocab = tokenizer.get_vocab()
  vocab["<mask>"] = len(vocab)
  merges = [
    tuple(merge.split(" ")) if isinstance(merge, str) else tuple(merge)  # "a b" in older tokenizers, then [a, b].
    for merge in json.loads(tokenizer.to_str())["model"]["merges"]
  ]
  with tempfile.TemporaryDirectory() as directory:  # As `tokenizers` writes RoBERTa's files (bpe.py reads them).
    vocab_file, merges_file = models.BPE(vocab, merges).save(directory)
    vocab_json, merges_txt = epath.Path(vocab_file).read_bytes(), epath.Path(merges_file).read_bytes()
  merges_path = epath.Path(path).parent / MERGES
  if merges_path.exists():
    logging.warning("Replacing %s, beside the missing %s, with the trained merges.", merges_path, path)
  _write_whole(str(merges_path), merges_txt)  # First: `path` is what says "trained".
  _write_whole(path, vocab_json)
  return path


def train_sentencepiece(
  input_files: list[str], model_prefix: str, vocab_size: int, max_sentences: int = 2_000_000, seed: int = 0
) -> str:
  """Trains a unigram SentencePiece model with BERT's special tokens at ids 0-4; returns the model path.

  Memory stays bounded on any corpus: at most `max_sentences` lines, sampled uniformly, are loaded. The model is
  a function of the input and `seed` on any machine, when trained once per process (sentencepiece's random
  generator is process-global: a second training in the same process continues its stream). The model and its
  `.vocab` appear whole or not at all: on a full disk sentencepiece cuts its files short without a word, so they are
  written beside (`<prefix>.tmp.*`) and renamed into place once they hold every piece; else paths.WriteError.
  """
  import sentencepiece as spm

  staged = f"{model_prefix}.tmp"
  spm.set_random_generator_seed(seed)
  try:
    try:
      spm.SentencePieceTrainer.train(
        input=",".join(input_files),
        model_prefix=staged,
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
    except RuntimeError as error:  # A file it cannot create: `RESOURCE_EXHAUSTED: "<file>": No space left on device`.
      written = re.fullmatch(r'\w+: "(.+)": (.+)', str(error).strip())
      if not written or not written[1].startswith(staged):
        raise
      raise paths.WriteError(f"Cannot write {model_prefix}{written[1][len(staged) :]}: {written[2]}.") from error
    _check_whole(staged, model_prefix, vocab_size)
    for suffix in (".model", ".vocab"):
      os.replace(staged + suffix, model_prefix + suffix)
  finally:
    for suffix in (".model", ".vocab"):
      if os.path.exists(staged + suffix):
        os.remove(staged + suffix)
  return model_prefix + ".model"


def _check_whole(staged: str, model_prefix: str, vocab_size: int) -> None:
  """Raises paths.WriteError unless `staged`'s model and vocabulary hold `vocab_size` pieces each.

  The model is read as a protobuf of unknown fields (protobuf's own `Empty` message), not through sentencepiece's
  generated `sentencepiece_model_pb2`: sentencepiece 0.2.3 generated it for protobuf 7, and Apache Beam (the `beam`
  extra) holds protobuf below 7. ModelProto's field 1 is a piece; field 3, the normalizer, is written after them."""
  from google.protobuf import empty_pb2, unknown_fields
  from google.protobuf.message import DecodeError

  model = epath.Path(f"{staged}.model").read_bytes()
  try:
    fields = [field.field_number for field in unknown_fields.UnknownFieldSet(empty_pb2.Empty.FromString(model))]
    pieces = fields.count(1) if 3 in fields else None
  except DecodeError:
    pieces = None
  lines = len(epath.Path(f"{staged}.vocab").read_bytes().splitlines())
  if pieces != vocab_size or lines != vocab_size:
    free = shutil.disk_usage(os.path.dirname(os.path.abspath(staged))).free
    raise paths.WriteError(
      f"Cannot write {model_prefix}.model: sentencepiece cut its files short ({len(model):,} bytes of model, "
      f"{lines} of {vocab_size} vocabulary lines) without an error; {free:,} bytes are free on that disk."
    )
