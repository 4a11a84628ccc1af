"""Vocabulary training (data/tokenizer/training.py): a trained WordPiece tokenizes as transformers' BertTokenizer with
its vocab.txt, a trained byte-level BPE as transformers' RoBERTa and ModernBERT tokenizers with its files; special
tokens where each family has them; byte-identical files from the same input and seed in any process; the sample;
--mode=prepare with a missing tokenizer.path."""

import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import time
import tracemalloc

import pytest
from transformers import BertTokenizer, PreTrainedTokenizerFast, RobertaTokenizer, RobertaTokenizerFast

from bert_jax import jobs, paths
from bert_jax.data import prepare, tokenizer_names, vocabulary
from bert_jax.data.manifest import read_manifest
from bert_jax.data.tokenizer import load_tokenizer, training
from configs import tiny
from tests.test_tokenizer import BPE_TEXT, COMPILED_EDGE_CASES, TEXT

ROOT = pathlib.Path(__file__).resolve().parents[1]
STEMS = "play walk talk jump read write run sing teach build open close call help work look move live love".split()
SUFFIXES = ["", "s", "ed", "ing", "er", "ers", "able", "ment", "ness", "ly"]
OTHER = (
  "the a of to in and is was it he she they we not this that with for on at by from as Café naïve Zoë Crème "
  'brûlée Ñandú résumé Straße Ελληνικά русский 東京 世界 你好 ひらがな 한국어 1969 3.14 2,000 (yes) "quoted" e-mail '
  "C++ -- !? ;"
).split()


def _sentence(rng: random.Random) -> str:
  words = [rng.choice(STEMS) + rng.choice(SUFFIXES) if rng.random() < 0.5 else rng.choice(OTHER) for _ in range(12)]
  words[0] = words[0].capitalize()
  return " ".join(words) + rng.choice([".", "!", "?"])


def _corpus(seed: int, sentences: int) -> list[str]:
  rng = random.Random(seed)
  return [_sentence(rng) for _ in range(sentences)]


# Text the vocabulary was not trained on: new sentences, words and characters (Arabic, Hebrew, emoji: [UNK] for a
# WordPiece vocabulary, bytes for a BPE), over-long words, control characters and accents.
HELD_OUT = [*_corpus(1, 50), "Unplayable rewritings, unhelpfully reopened.", *TEXT, *COMPILED_EDGE_CASES]


@pytest.fixture(scope="module")
def texts():
  return _corpus(0, 1500)


@pytest.mark.parametrize("lower_case", [True, False])
def test_a_trained_wordpiece_vocabulary_tokenizes_as_bert_tokenizer_does(tmp_path, texts, lower_case):
  path = training.train_wordpiece(texts, str(tmp_path / "vocab.txt"), 600, lower_case)
  lines = (tmp_path / "vocab.txt").read_text(encoding="utf-8").split("\n")
  assert lines[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and lines[-1] == "" and len(lines) - 1 <= 600
  assert any(line.startswith("##") and len(line) > 3 for line in lines)  # Merged continuations.
  ours = load_tokenizer("wordpiece", path, lower_case=lower_case)
  assert (ours.pad_id, ours.unk_id, ours.cls_id, ours.sep_id, ours.mask_id) == (0, 1, 2, 3, 4)
  reference = BertTokenizer(vocab_file=path, do_lower_case=lower_case)
  for line in HELD_OUT:
    assert ours.encode(line) == reference.encode(line, add_special_tokens=False), (line, ours.tokenize(line))
  assert ours.unk_id in ours.encode("العربية") and ours.unk_id not in ours.encode("Replaying walkers.")
  assert ("creme" in lines) == lower_case and ("Crème" in lines) != lower_case
  ids, lengths = ours.encode_batch(HELD_OUT)  # Compiled (what preparation runs): the same ids.
  assert ids.tolist() == [i for line in HELD_OUT for i in ours.encode(line)]


@pytest.mark.parametrize("bpe_format", ["roberta", "modernbert"])
def test_a_trained_byte_level_bpe_tokenizes_as_its_transformers_tokenizer_does(tmp_path, texts, bpe_format):
  name = tokenizer_names.FILE_NAMES[bpe_format]
  path = training.train_byte_level_bpe(texts, str(tmp_path / name), 500, bpe_format)
  assert sorted(p.name for p in tmp_path.iterdir()) == (["merges.txt", name] if bpe_format == "roberta" else [name])
  ours = load_tokenizer("bpe", path)
  assert ours.vocab_size == 500
  if bpe_format == "roberta":  # roberta-base's layout: <s> <pad> </s> <unk> first, <mask> last.
    vocab = json.loads((tmp_path / name).read_text(encoding="utf-8"))
    assert sorted(vocab, key=vocab.get)[:4] == ["<s>", "<pad>", "</s>", "<unk>"] and len(vocab) == 500
    assert vocab["<mask>"] == 499
    assert (ours.cls_id, ours.pad_id, ours.sep_id, ours.unk_id, ours.mask_id) == (0, 1, 2, 3, 499)
    merges = str(tmp_path / "merges.txt")
    references = [RobertaTokenizer(path, merges, split_special_tokens=True), RobertaTokenizerFast(path, merges)]
  else:  # ModernBERT's: BERT's names after the pieces, [UNK] [CLS] [SEP] [PAD] [MASK].
    assert ours.special_tokens == ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
    assert (ours.unk_id, ours.cls_id, ours.sep_id, ours.pad_id, ours.mask_id) == (495, 496, 497, 498, 499)
    specials = dict(unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", mask_token="[MASK]")
    references = [PreTrainedTokenizerFast(tokenizer_file=path, **specials)]  # As ModernBERT's tokenizer is read.
    for line in HELD_OUT[:3]:  # Its post-processor: [CLS] x [SEP].
      assert references[0](line)["input_ids"] == [ours.cls_id, *ours.encode(line), ours.sep_id]
  for reference in references:
    for line in [*HELD_OUT, *BPE_TEXT[-3:-1]]:  # Not the special tokens' names in text (BPE_TEXT's last: bpe.py).
      ids = ours.encode(line)
      assert ids == reference.encode(line, add_special_tokens=False), (type(reference).__name__, line)
      assert ours.decode(ids) == line  # Byte-level: nothing is lost.
  documents = [texts[:3], texts[3:5]]  # Preparation encodes a document as its running text.
  ids, _ = ours.encode_documents(documents)
  assert ids.tolist() == [
    i for document in documents for i in references[0].encode(" ".join(document), add_special_tokens=False)
  ]


_TRAIN_ALL = """
import hashlib, pathlib, sys
from bert_jax.data.tokenizer import training
directory, texts = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]).read_text(encoding="utf-8").split("\\n")
sample = training.sample_texts(texts, 1000, int(sys.argv[3]))
training.train_wordpiece(sample, str(directory / "vocab.txt"), 700, True)
(directory / "roberta").mkdir()
training.train_byte_level_bpe(sample, str(directory / "roberta" / "vocab.json"), 700, "roberta")
training.train_byte_level_bpe(sample, str(directory / "tokenizer.json"), 700, "modernbert")
for path in sorted(p for p in directory.rglob("*") if p.is_file()):
  print(path.relative_to(directory), hashlib.sha256(path.read_bytes()).hexdigest())
"""


def test_the_same_input_and_seed_give_byte_identical_files_in_any_process(tmp_path, texts):
  """Each in a process of its own: `tokenizers`' WordPiece trainer gives continuations their ids in hash-map order,
  which changes from process to process (and with it the merges); training.py fixes the alphabet first."""
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("\n".join(texts), encoding="utf-8")

  def train(name: str, seed: int) -> str:
    (tmp_path / name).mkdir()
    command = [sys.executable, "-c", _TRAIN_ALL, str(tmp_path / name), str(corpus), str(seed)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=True)
    return result.stdout

  first = train("first", 0)
  assert first.split()[::2] == ["roberta/merges.txt", "roberta/vocab.json", "tokenizer.json", "vocab.txt"]
  assert train("second", 0) == first
  other_seed = dict(zip(*[iter(train("other_seed", 1).split())] * 2, strict=True))  # Another sample of 1000 of 1500.
  assert all(other_seed[name] != digest for name, digest in zip(*[iter(first.split())] * 2, strict=True))


def test_the_sample_is_bounded_and_a_function_of_the_texts_and_the_seed():
  texts = [f"sentence {i} of the corpus" for i in range(5000)] + ["a repeated line"] * 50
  sample = training.sample_texts(texts, 400, seed=0)
  assert len(sample) == 400 and set(sample) <= set(texts)
  shuffled = random.Random(1).sample(texts, len(texts))
  assert training.sample_texts(shuffled, 400, seed=0) == sample  # Not a function of the order ...
  parts = [training.sample_texts(texts[i::3], 400, seed=0) for i in range(3)]
  assert training.sample_texts([t for part in parts for t in part], 400, seed=0) == sample  # ... so parts merge.
  assert training.sample_texts(texts, 400, seed=1) != sample
  # The copies of a text share a hash: all of them, none, or as many as end the sample (at its highest hash).
  copies = [index for index, text in enumerate(sample) if text == "a repeated line"]
  assert copies == list(range(len(sample) - len(copies), len(sample))) or len(copies) in (0, 50)
  assert sorted(training.sample_texts(texts[:10], 400, seed=0)) == sorted(texts[:10])
  assert not set(training.sample_texts(texts, 2000, seed=0)) - set(texts)
  # Memory holds the sample, not the input: 100,000 texts of 100 bytes (10 MB) streamed through a sample of 1,000.
  tracemalloc.start()
  try:
    sample = training.sample_texts((f"{i:0100d}" for i in range(100_000)), 1000, seed=0)
    peak = tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()
  assert len(sample) == 1000 and peak < 1_000_000, peak


def test_the_sample_holds_the_sentences_preparation_reads(tmp_path, data_config):
  """BERT's format and the document format, through preparation's work units (one file cut into several reads the
  same sentences); a byte-level BPE's texts as its `encode_documents` encodes them."""
  (tmp_path / "bert.txt").write_text("First sentence.\nSecond one.\n\n\nOther document.\n", encoding="utf-8")
  (tmp_path / "book.txt").write_text("A book. It has sentences!\nWrapped lines.\n\nNew paragraph.\n", encoding="utf-8")
  bert = data_config(input_pattern=str(tmp_path / "bert.txt"))
  assert list(vocabulary.corpus_texts(bert, running_text=False)) == [
    "First sentence.",
    "Second one.",
    "Other document.",
  ]
  assert list(vocabulary.corpus_texts(bert, running_text=True)) == [
    "First sentence.",
    " Second one.",
    "Other document.",
  ]
  book = data_config(input_pattern=str(tmp_path / "book.txt"), input_format="document")
  expected = ["A book.", "It has sentences!", "Wrapped lines.", "New paragraph."]
  assert list(vocabulary.corpus_texts(book, running_text=False)) == expected
  lines = _corpus(2, 200)
  (tmp_path / "large.txt").write_text("\n\n".join("\n".join(lines[i : i + 5]) for i in range(0, 200, 5)) + "\n")
  whole = list(vocabulary.corpus_texts(data_config(input_pattern=str(tmp_path / "large.txt")), running_text=False))
  cut = data_config(input_pattern=str(tmp_path / "large.txt"), prepare_unit_bytes=1024)
  assert whole == lines and list(vocabulary.corpus_texts(cut, running_text=False)) == lines


def _prepare_config(tmp_path, kind: str, path: str):
  config = tiny.get_config()
  config.tokenizer.update(kind=kind, path=path)
  config.data.update(embedded_corpus="", input_pattern=str(tmp_path / "in" / "*.txt"))
  config.data.update(prepared_dir=str(tmp_path / "prepared"))
  (tmp_path / "in").mkdir(exist_ok=True)
  for index in range(2):
    documents = ["\n".join(_corpus(10 * index + d, 8)) for d in range(10)]
    (tmp_path / "in" / f"{index}.txt").write_text("\n\n".join(documents) + "\n", encoding="utf-8")
  return config


def test_prepare_trains_a_missing_wordpiece_vocabulary_then_prepares_with_it(tmp_path):
  vocab = tmp_path / "vocabulary" / "vocab.txt"  # Its directory is missing too.
  config = _prepare_config(tmp_path, "wordpiece", str(vocab))
  assert prepare.prepare_for_run(config, str(tmp_path / "run")) == (str(vocab), str(tmp_path / "prepared"))
  tokenizer = load_tokenizer("wordpiece", str(vocab), lower_case=True)
  assert tokenizer.special_ids.tolist() == [0, 1, 2, 3, 4] and tokenizer.vocab_size <= config.model.vocab_size
  assert sorted(p.name for p in vocab.parent.iterdir()) == ["vocab.txt"]  # Nothing staged is left.
  manifest = read_manifest(str(tmp_path / "prepared"), tokenizer)
  assert manifest["tokenizer"] == tokenizer.identity() and manifest["documents"] + manifest["eval_documents"] == 20
  reference = BertTokenizer(vocab_file=str(vocab), do_lower_case=True)
  assert tokenizer.encode(HELD_OUT[0]) == reference.encode(HELD_OUT[0], add_special_tokens=False)
  digest = paths.file_sha256(vocab)
  prepare.prepare_for_run(config, str(tmp_path / "run"))  # There now: kept, and so is the corpus.
  assert paths.file_sha256(vocab) == digest


def test_the_embedded_corpus_trains_the_configured_kind_into_the_workdir(tmp_path):
  """tokenizer.path empty: <workdir>/tokenizer/ holds the vocabulary under its kind's name (ModernBERT's BPE here)."""
  config = tiny.get_config()
  config.tokenizer.update(kind="bpe", train_bpe_format="modernbert")
  tokenizer_path, prepared = prepare.prepare_for_run(config, str(tmp_path))
  assert tokenizer_path == str(tmp_path / "tokenizer" / "tokenizer.json")
  tokenizer = load_tokenizer("bpe", tokenizer_path)
  assert tokenizer.vocab_size == config.model.vocab_size and tokenizer.special_tokens[2:] == (
    "[CLS]",
    "[SEP]",
    "[MASK]",
  )
  assert read_manifest(prepared, tokenizer)["tokenizer"] == tokenizer.identity()


@pytest.mark.parametrize(
  "key,value,message",
  [
    ("tokenizer.train_bpe_format", "gpt2", r"tokenizer.train_bpe_format='gpt2'; expected one of \('roberta', 'mod"),
    ("tokenizer.kind", "unigram", r"tokenizer.kind='unigram'; expected one of \('wordpiece', 'sentencepiece', 'bpe'\)"),
    ("tokenizer.train_max_sentences", 0, r"tokenizer.train_max_sentences=0 must be at least 1."),
  ],
)
def test_a_bad_training_setting_is_named_before_any_input_is_read(tmp_path, key, value, message):
  config = _prepare_config(tmp_path, "bpe", str(tmp_path / "vocabulary" / "vocab.json"))
  config.data.input_pattern = str(tmp_path / "nowhere" / "*.txt")  # Read first, this would be refused instead.
  section, name = key.split(".")
  config[section][name] = value
  with pytest.raises(ValueError, match=rf"^{message}"):
    jobs.check(config, "prepare")  # What main runs first ...
  with pytest.raises(ValueError, match=rf"^{message}"):
    jobs.run(config, str(tmp_path / "run"), "prepare")  # ... and what a run from Python goes through.
  assert not (tmp_path / "vocabulary").exists() and not (tmp_path / "run").exists()


def test_a_vocabulary_too_small_for_its_alphabet_is_refused_naming_model_vocab_size(tmp_path, texts):
  config = _prepare_config(tmp_path, "bpe", str(tmp_path / "vocabulary" / "vocab.json"))
  config.model.vocab_size = 260
  config.data.input_pattern = str(tmp_path / "nowhere" / "*.txt")
  with pytest.raises(ValueError, match=r"model.vocab_size=260 is too small to train a byte-level BPE .* at least 261"):
    prepare.prepare_for_run(config, str(tmp_path / "run"))
  with pytest.raises(ValueError, match=r"model.vocab_size=100 is too small for a WordPiece vocabulary of this corpus"):
    training.train_wordpiece(texts, str(tmp_path / "vocab.txt"), 100, True)
  assert not (tmp_path / "vocab.txt").exists()


def test_a_vocabulary_that_cannot_be_written_whole_leaves_nothing(tmp_path, texts, monkeypatch):
  from etils import epath

  def half_then_full(self, data):
    open(self, "wb").write(data[: len(data) // 2])
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(epath.Path, "write_bytes", half_then_full)
  with pytest.raises(paths.WriteError, match=rf"^Cannot write {tmp_path}/vocab.txt: No space left on device.$"):
    training.train_wordpiece(texts, str(tmp_path / "vocab.txt"), 600, True)
  assert not list(tmp_path.iterdir())


def test_a_tfds_dataset_is_sampled_as_preparation_reads_it(data_config, monkeypatch):
  import tensorflow_datasets as tfds

  from bert_jax.data import text

  config = data_config(tfds_name="imdb_reviews", tfds_split="train", tfds_feature="text")
  with tfds.testing.mock_data(num_examples=6):
    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", lambda self, **kw: None)
    sampled = list(vocabulary.corpus_texts(config, running_text=False))
    examples = tfds.as_numpy(tfds.load("imdb_reviews", split="train", download=False))
    documents = text.text_documents(example["text"].decode("utf-8", errors="replace") for example in examples)
  assert sampled == [sentence for document in documents for sentence in document] and sampled


def test_a_sentencepiece_vocabulary_is_trained_only_into_a_model_file(tmp_path):
  config = _prepare_config(tmp_path, "sentencepiece", str(tmp_path / "vocabulary" / "spm"))
  with pytest.raises(ValueError, match=r"tokenizer.path='.*/vocabulary/spm' does not end in .model: a SentencePiece"):
    prepare.prepare_for_run(config, str(tmp_path / "run"))
  assert not (tmp_path / "vocabulary").exists()


@pytest.mark.slow
def test_ctrl_c_stops_a_vocabulary_training_at_once_with_one_line_and_no_file(tmp_path):
  """SentencePiece's trainer held on to Ctrl-C until it finished (seconds to minutes) and the run then ended in a
  traceback: the wait is now what the signal interrupts. `--mode=prepare` ends within seconds of the signal, exit 130,
  one line naming the vocabulary, and nothing at its path."""
  rng = random.Random(0)
  letters = "abcdefghijklmnopqrstuvwxyz"
  lines = [" ".join("".join(rng.choices(letters, k=rng.randint(2, 9))) for _ in range(12)) for _ in range(8000)]
  (tmp_path / "in").mkdir()
  (tmp_path / "in" / "words.txt").write_text("\n".join(lines) + "\n")  # About 15 s of training here.
  model = tmp_path / "vocab" / "spm.model"
  flags = ["--config=configs/tiny.py", f"--workdir={tmp_path / 'run'}", "--mode=prepare"]
  flags += [
    "--config.tokenizer.kind=sentencepiece",
    f"--config.tokenizer.path={model}",
    "--config.data.embedded_corpus=",
  ]
  flags += [f"--config.data.input_pattern={tmp_path / 'in' / '*.txt'}", "--config.model.vocab_size=8000"]
  flags += [f"--config.data.prepared_dir={tmp_path / 'prepared'}"]
  environment = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
  environment.pop("XLA_FLAGS", None)
  log = tmp_path / "log"
  with log.open("w") as stderr:
    process = subprocess.Popen(
      [sys.executable, "-m", "bert_jax.main", *flags], cwd=ROOT, env=environment, stderr=stderr, text=True
    )
    deadline = time.monotonic() + 120
    while "Training a 8000-piece SentencePiece vocabulary" not in log.read_text():
      assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
      time.sleep(0.1)
    time.sleep(1)
    process.send_signal(signal.SIGINT)
    sent = time.monotonic()
    returncode = process.wait(timeout=120)
  waited = time.monotonic() - sent
  lines = log.read_text().splitlines()
  assert returncode == 130 and waited < 4, (returncode, waited, lines[-10:])
  assert (
    lines[-1] == f"Interrupted while training the vocabulary {model}: nothing was written there. Rerun to train it."
  )
  assert not model.exists() and sorted(p.name for p in model.parent.iterdir()) == []
