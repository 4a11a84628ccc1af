"""CoNLL-2003 NER: reading column files, first-piece labels, sentences split into rows, conlleval metrics."""

import numpy as np
import pytest

from bert_jax.finetune import metrics as metrics_lib
from bert_jax.finetune import ner

LABEL = {tag: i for i, tag in enumerate(ner.CONLL2003_LABELS)}

TRAIN = """-DOCSTART- -X- -X- O

John NNP B-NP B-PER
loves VBZ B-VP O
Paris NNP B-NP B-LOC
. . O O

-DOCSTART- -X- -X- O

Zola NNP B-NP B-PER
went VBD B-VP O
to TO B-PP O
new NNP B-NP B-LOC
york NNP I-NP I-LOC


"""

VALID = "Mary B-PER\nwent O\n\u200b O\n\nthe O\nunited B-ORG\nstates I-ORG\n"


@pytest.fixture
def data_dir(tmp_path):
  (tmp_path / "train.txt").write_text(TRAIN)
  (tmp_path / "valid.txt").write_text(VALID)
  (tmp_path / "test.txt").write_text("Zola B-PER\nloves O\nParis B-LOC\n")
  return tmp_path


def test_read_skips_docstart_and_reads_four_and_two_columns(data_dir):
  task = ner.Conll2003(str(data_dir))
  assert (task.name, task.head, task.main_metric, task.num_labels) == ("conll2003", "token", "f1", 9)
  assert task.eval_splits == ("dev", "test") and task.test_splits == ()
  train = task.read("train")
  assert train == [
    ner.Sentence(("John", "loves", "Paris", "."), ("B-PER", "O", "B-LOC", "O"), 3),
    ner.Sentence(("Zola", "went", "to", "new", "york"), ("B-PER", "O", "O", "B-LOC", "I-LOC"), 10),
  ]
  dev = task.read("dev")
  assert dev == [
    ner.Sentence(("Mary", "went", "\u200b"), ("B-PER", "O", "O"), 1),
    ner.Sentence(("the", "united", "states"), ("O", "B-ORG", "I-ORG"), 5),
  ]
  assert task.read("test")[0].words == ("Zola", "loves", "Paris")


def test_encode_wordpiece_labels_first_pieces(data_dir, fixture_tokenizers):
  tokenizer = fixture_tokenizers["wordpiece"]
  task = ner.Conll2003(str(data_dir))
  sentence = ner.Sentence(("Zola", "loves", "Paris"), ("B-PER", "O", "B-LOC"), 1)
  encoded = task.encode([sentence], tokenizer, max_seq_length=12)
  pieces = [tokenizer.pieces[i] for i in encoded.features["input_ids"][0]]
  # "Zola" is four pieces and "loves" two: their continuation pieces carry no label.
  assert pieces == ["[CLS]", "z", "##o", "##l", "##a", "love", "##s", "paris", "[SEP]", "[PAD]", "[PAD]", "[PAD]"]
  np.testing.assert_array_equal(encoded.features["label_weights"][0], [0, 1, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0])
  np.testing.assert_array_equal(encoded.features["labels"][0], [0, 1, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0])
  np.testing.assert_array_equal(encoded.extra[0], [-1, 0, -1, -1, -1, 1, -1, 2, -1, -1, -1, -1])
  np.testing.assert_array_equal(encoded.features["input_mask"][0], [1] * 9 + [0] * 3)
  np.testing.assert_array_equal(encoded.features["segment_ids"][0], [0] * 12)
  assert encoded.features["labels"].dtype == np.int32 and encoded.features["label_weights"].dtype == np.float32


def test_encode_splits_a_long_sentence_into_rows_of_whole_words(data_dir, fixture_tokenizers):
  tokenizer = fixture_tokenizers["wordpiece"]
  task = ner.Conll2003(str(data_dir))
  sentences = [
    ner.Sentence(("John",), ("B-PER",), 1),
    ner.Sentence(("Zola", "loves", "Paris"), ("B-PER", "O", "B-LOC"), 3),
  ]
  # 4 + 2 + 1 pieces do not fit 8 - 2: "Zola loves" is one row, "Paris" the next.
  encoded = task.encode(sentences, tokenizer, max_seq_length=8)
  assert encoded.num_rows == 3
  np.testing.assert_array_equal(encoded.row_example, [0, 1, 1])
  pieces = [[tokenizer.pieces[i] for i in row if i != tokenizer.pad_id] for row in encoded.features["input_ids"]]
  assert pieces == [
    ["[CLS]", "john", "[SEP]"],
    ["[CLS]", "z", "##o", "##l", "##a", "love", "##s", "[SEP]"],
    ["[CLS]", "paris", "[SEP]"],
  ]
  np.testing.assert_array_equal(encoded.extra[2, :3], [-1, 2, -1])
  np.testing.assert_array_equal(encoded.features["labels"][2, :3], [0, LABEL["B-LOC"], 0])


@pytest.mark.parametrize("kind", ["wordpiece", "sentencepiece"])
@pytest.mark.parametrize("max_seq_length", [4, 6, 64])
def test_encode_gives_every_word_one_labelled_first_piece(data_dir, fixture_tokenizers, kind, max_seq_length):
  tokenizer = fixture_tokenizers[kind]
  task = ner.Conll2003(str(data_dir))
  sentences = task.read("train") + task.read("dev")
  encoded = task.encode(sentences, tokenizer, max_seq_length)
  features = encoded.features
  assert features["input_ids"].shape == (encoded.num_rows, max_seq_length)
  for row, example in enumerate(encoded.row_example):
    length = int(features["input_mask"][row].sum())
    ids = features["input_ids"][row]
    assert ids[0] == tokenizer.cls_id and ids[length - 1] == tokenizer.sep_id
    first = np.flatnonzero(features["label_weights"][row])
    assert set(first) == set(np.flatnonzero(encoded.extra[row] >= 0)) and 0 < first.min() and first.max() < length - 1
    tags = sentences[example].tags
    assert [task.labels[features["labels"][row, p]] for p in first] == [tags[w] for w in encoded.extra[row, first]]
    assert not features["labels"][row][features["label_weights"][row] == 0].any()
  # Every word of every sentence is predicted exactly once, in order.
  words = [(e, w) for row, e in enumerate(encoded.row_example) for w in encoded.extra[row] if w >= 0]
  assert words == [(e, w) for e, s in enumerate(sentences) for w in range(len(s.words))]
  if max_seq_length == 64:
    assert encoded.num_rows == len(sentences)
  # A word the tokenizer drops ("\u200b") is [UNK], labelled.
  row = int(np.flatnonzero(encoded.row_example == 2)[-1])
  position = int(np.flatnonzero(encoded.extra[row] == 2)[0])
  assert features["input_ids"][row, position] == tokenizer.unk_id


def test_word_windows():
  assert ner.word_windows([1, 2, 3], 6) == [(0, 3)]
  assert ner.word_windows([4, 2, 1], 6) == [(0, 2), (2, 3)]
  assert ner.word_windows([7, 1, 1], 6) == [(0, 1), (1, 3)]  # A word longer than a row goes alone (clipped).
  assert ner.word_windows([], 6) == [(0, 0)]


def _logits(task, encoded, tags: list[list[str]]) -> np.ndarray:
  """Logits whose argmax is `tags` at first pieces and a wrong tag ("I-MISC") everywhere else."""
  logits = np.zeros((*encoded.extra.shape, task.num_labels), np.float32)
  logits[..., LABEL["I-MISC"]] = 1.0
  for row, example in enumerate(encoded.row_example):
    for position in np.flatnonzero(encoded.extra[row] >= 0):
      logits[row, position, LABEL[tags[example][encoded.extra[row, position]]]] = 5.0
  return logits


GOLD = [
  ner.Sentence(("John", "loves", "Paris", "."), ("B-PER", "O", "B-LOC", "O"), 1),
  ner.Sentence(("Mary", "went", "to", "new", "york"), ("B-PER", "O", "O", "B-LOC", "I-LOC"), 6),
]
PREDICTED = [["B-PER", "O", "B-ORG", "O"], ["B-PER", "O", "O", "B-LOC", "I-LOC"]]


@pytest.mark.parametrize("kind", ["wordpiece", "sentencepiece"])
def test_metrics_against_hand_computed(data_dir, fixture_tokenizers, kind):
  task = ner.Conll2003(str(data_dir))
  encoded = task.encode(GOLD, fixture_tokenizers[kind], max_seq_length=6)  # Split sentences too.
  assert encoded.num_rows > len(GOLD)
  logits = _logits(task, encoded, PREDICTED)
  assert task.predicted_tags(encoded, logits) == PREDICTED
  scores = task.metrics(encoded, logits)
  # Gold entities: John/PER, Paris/LOC, Mary/PER, new york/LOC; predicted: Paris as ORG, the rest right.
  assert scores["precision"] == pytest.approx(3 / 4)
  assert scores["recall"] == pytest.approx(3 / 4)
  assert scores["f1"] == pytest.approx(3 / 4)
  assert scores["accuracy"] == pytest.approx(8 / 9)
  assert scores["f1_PER"] == pytest.approx(1.0)
  assert scores["precision_LOC"] == pytest.approx(1.0) and scores["recall_LOC"] == pytest.approx(1 / 2)
  assert scores["f1_LOC"] == pytest.approx(2 / 3)
  assert scores.get("f1_ORG", 0.0) == 0.0
  assert all(isinstance(value, float) for value in scores.values())
  with pytest.raises(ValueError, match="shape"):
    task.metrics(encoded, logits[..., :5])


def test_iob1_and_bio_schemes(data_dir, fixture_tokenizers, monkeypatch):
  # IOB1 tags, as in the original CoNLL-2003 files: two adjacent persons, B- marking the second.
  sentences = [ner.Sentence(("John", "Mary", "Paris"), ("I-PER", "B-PER", "I-LOC"), 1)]
  seen = []
  conlleval = metrics_lib.conlleval
  monkeypatch.setattr(
    metrics_lib, "conlleval", lambda true, pred, scheme: seen.append(scheme) or conlleval(true, pred, scheme=scheme)
  )
  for scheme in ("IOB1", "BIO"):
    task = ner.Conll2003(str(data_dir), scheme=scheme)
    encoded = task.encode(sentences, fixture_tokenizers["wordpiece"], max_seq_length=16)
    assert task.metrics(encoded, _logits(task, encoded, [["I-PER", "B-PER", "I-LOC"]]))["f1"] == pytest.approx(1.0)
    # One guessed person "John Mary" for two gold ones: 1 of 2 guessed right, 1 of 3 gold found.
    scores = task.metrics(encoded, _logits(task, encoded, [["I-PER", "I-PER", "I-LOC"]]))
    assert (scores["precision"], scores["recall"]) == (pytest.approx(1 / 2), pytest.approx(1 / 3))
    assert scores["f1"] == pytest.approx(0.4)
  # conlleval reads both schemes with one set of rules, so the scores agree; the task still names its scheme.
  assert seen == ["IOB1", "IOB1", "BIO", "BIO"]


def test_custom_labels_and_scheme_checked(tmp_path):
  (tmp_path / "train.txt").write_text("John B-PERSON\nloves O\n")
  task = ner.Conll2003(str(tmp_path), labels=("O", "B-PERSON", "I-PERSON"), scheme="IOB1")
  assert task.num_labels == 3 and task.read("train")[0].tags == ("B-PERSON", "O")
  with pytest.raises(ValueError, match="IOB2"):
    ner.Conll2003(str(tmp_path), scheme="IOB2")
  with pytest.raises(ValueError, match="repeats"):
    ner.Conll2003(str(tmp_path), labels=("O", "O"))
  with pytest.raises(ValueError, match="PER"):
    ner.Conll2003(str(tmp_path), labels=("O", "PER"))


def test_write_predictions_in_conlleval_format(data_dir, fixture_tokenizers, tmp_path):
  task = ner.Conll2003(str(data_dir))
  encoded = task.encode(GOLD, fixture_tokenizers["wordpiece"], max_seq_length=6)
  path = tmp_path / "out" / "dev_predictions.txt"
  path.parent.mkdir()
  task.write_predictions(encoded, _logits(task, encoded, PREDICTED), str(path))
  assert path.read_text() == (
    "John B-PER B-PER\nloves O O\nParis B-LOC B-ORG\n. O O\n\n"
    "Mary B-PER B-PER\nwent O O\nto O O\nnew B-LOC B-LOC\nyork I-LOC I-LOC\n\n"
  )


@pytest.mark.parametrize(
  "text, line, message",
  [
    ("John B-PER\nloves O\nParis B-CITY\n", 3, "unknown tag 'B-CITY'"),
    ("-DOCSTART- O\n\nJohn B-PER\nloves\n", 4, "single column"),
    ("", 1, "without a sentence"),
    ("-DOCSTART- -X- -X- O\n\n\n", 3, "without a sentence"),
  ],
)
def test_bad_files_name_file_and_line(tmp_path, text, line, message):
  (tmp_path / "valid.txt").write_text(text)
  with pytest.raises(ValueError, match=message) as error:
    ner.Conll2003(str(tmp_path)).read("dev")
  assert f"valid.txt:{line}:" in str(error.value)


def test_unknown_tag_message_lists_the_tag_set(tmp_path):
  (tmp_path / "train.txt").write_text("John B-CITY\n")
  with pytest.raises(ValueError, match=r"train\.txt:1: .*'B-LOC'.*'O'"):
    ner.Conll2003(str(tmp_path)).read("train")


def test_missing_file_and_unknown_split(tmp_path):
  task = ner.Conll2003(str(tmp_path))
  with pytest.raises(FileNotFoundError, match="test.txt"):
    task.read("test")
  with pytest.raises(ValueError, match="Unknown split"):
    task.read("validation")


def test_reads_and_writes_gcs(gcs_bucket, fixture_tokenizers):
  from etils import epath

  directory = f"{gcs_bucket}/conll2003"
  (epath.Path(directory) / "valid.txt").write_text(VALID)
  task = ner.Conll2003(directory)
  sentences = task.read("dev")
  encoded = task.encode(sentences, fixture_tokenizers["wordpiece"], max_seq_length=16)
  task.write_predictions(encoded, _logits(task, encoded, [list(s.tags) for s in sentences]), f"{directory}/out.txt")
  assert epath.Path(f"{directory}/out.txt").read_text().startswith("Mary B-PER B-PER\nwent O O\n")


WIKITEXT = "\n".join(
  [
    " ",
    " = Lobsters = ",
    " ",
    " The European lobster lives near London . It was named by Carl Linnaeus in 1758 . ",
    " = = Range = = ",
    " Lobsters live from Norway to Morocco , the text says . Norway is cold ; a <unk> lives there . ",
    " ",
    " = Crabs = ",
    " Crabs are not lobsters . The Bank of England sells 1 @.@ 5 crabs . ",
    " London has crabs too ! I like them . ",
  ]
)


def test_wikitext_names_become_a_conll_task_with_its_own_tag_set(tmp_path):
  """benchmarks/wikitext_names: casing marks names (a sentence's first word by the corpus's habit), the words are
  lowercased, a sentence with <unk> is dropped, and finetune.tags reads the files; a tag set's error names the key."""
  from bert_jax.benchmarks import wikitext_names
  from bert_jax.finetune import tasks
  from configs import default

  (tmp_path / "wiki").mkdir()
  for name in ("valid", "test"):
    (tmp_path / "wiki" / f"wiki.{name}.tokens").write_text(WIKITEXT)
  counts = wikitext_names.make(str(tmp_path / "wiki"), str(tmp_path / "names"))
  assert counts["dropped_with_unk"] == 2 and counts["train.txt"] == dict(sentences=7, words=49, mentions=8)
  assert counts["valid.txt"]["sentences"] == 3 and counts["test.txt"]["sentences"] == 4  # By article.
  with pytest.raises(FileExistsError, match="names"):
    wikitext_names.make(str(tmp_path / "wiki"), str(tmp_path / "names"))
  finetune = default.get_config().finetune
  finetune.update(task="conll2003", data_dir=str(tmp_path / "names"), tags=wikitext_names.TAGS)
  sentences = tasks.make_task(finetune).read("train")
  tagged = [" ".join(f"{w}/{t[0]}" for w, t in zip(s.words, s.tags, strict=True)) for s in sentences]
  assert tagged == [
    "the/O european/B lobster/O lives/O near/O london/B ./O",
    "it/O was/O named/O by/O carl/B linnaeus/I in/O 1758/O ./O",
    "lobsters/O live/O from/O norway/B to/O morocco/B ,/O the/O text/O says/O ./O",
    "crabs/O are/O not/O lobsters/O ./O",
    "the/O bank/B of/O england/B sells/O 1.5/O crabs/O ./O",
    "london/B has/O crabs/O too/O !/O",
    "i/O like/O them/O ./O",
  ]
  finetune.tags = "O,NAME"
  with pytest.raises(ValueError, match=r"finetune.tags='O,NAME'.*\['NAME'\]"):
    tasks.make_task(finetune)


def test_part_of_speech_from_conll2003s_second_column_is_scored_per_word(data_dir, fixture_tokenizers):
  """tag_scheme "word" with tag_column 1: CoNLL-2003's part-of-speech column, any tag strings; precision, recall and
  F1 all equal the word accuracy, per tag too. Without its tag set, or with a column a line lacks, it is refused."""
  from bert_jax.finetune import tasks
  from configs import default

  finetune = default.get_config().finetune
  finetune.update(task="conll2003", data_dir=str(data_dir), tag_scheme="word", tag_column=1)
  with pytest.raises(ValueError, match="set finetune.tags"):
    tasks.make_task(finetune)
  finetune.tags = "NNP VBZ . VBD TO , :"  # Space-separated: the set holds a ",".
  task = tasks.make_task(finetune)
  assert task.labels == ("NNP", "VBZ", ".", "VBD", "TO", ",", ":")
  train = task.read("train")
  assert train[0].tags == ("NNP", "VBZ", "NNP", ".") and train[1].tags == ("NNP", "VBD", "TO", "NNP", "NNP")
  encoded = task.encode(train, fixture_tokenizers["wordpiece"], max_seq_length=8)
  tag_ids = {tag: i for i, tag in enumerate(task.labels)}
  wrong = [["NNP", "VBZ", "NNP", "VBZ"], ["NNP", "VBD", "TO", "NNP", "NNP"]]  # The first sentence's "." missed.
  logits = np.zeros((*encoded.extra.shape, task.num_labels), np.float32)
  for row, example in enumerate(encoded.row_example):
    for position in np.flatnonzero(encoded.extra[row] >= 0):
      logits[row, position, tag_ids[wrong[example][encoded.extra[row, position]]]] = 1.0
  scores = task.metrics(encoded, logits)
  assert scores["f1"] == scores["precision"] == scores["recall"] == pytest.approx(8 / 9) == scores["accuracy"]
  assert scores["f1_."] == 0.0 and scores["recall_NNP"] == 1.0 and scores["precision_VBZ"] == pytest.approx(1 / 2)
  finetune.tag_column = 3  # The dev file has two columns.
  with pytest.raises(ValueError, match=r"valid\.txt:1: no tag column 3"):
    tasks.make_task(finetune).read("dev")
