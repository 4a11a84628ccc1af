"""SWAG: reading the official CSV layout, four [CLS] context [SEP] ending [SEP] rows, accuracy, leaderboard CSV."""

import numpy as np
import pytest

from bert_jax.finetune import swag
from bert_jax.finetune.contract import encode_pair

HEADER = ",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label\n"
# Quoted fields hold commas, and one a line break (the row's line is its first).
TRAIN = HEADER + (
  '0,anetv_1,18313,"The man, said yes. He",The man said yes.,He,gold,"went home, then ran.",played.,ran.,was.,2\n'
  '1,lsmdc_2,18419,The dog ran. The cat,The dog ran.,The cat,gen,ran.,"played\n'
  'the film.",was good.,said no.,0\n'
)
VAL = HEADER + "7,anetv_3,1,The man played. She,The man played.,She,gold,ran.,went.,said.,played.,3\n"
TEST = HEADER.replace(",label\n", "\n") + "5,anetv_4,2,A dog ran. It,A dog ran.,It,gold,ran.,went.,was.,played.\n"


@pytest.fixture
def data_dir(tmp_path):
  (tmp_path / "train.csv").write_text(TRAIN)
  (tmp_path / "val.csv").write_text(VAL)
  (tmp_path / "test.csv").write_text(TEST)
  return tmp_path


def test_read_official_layout(data_dir):
  task = swag.Swag(str(data_dir))
  assert (task.name, task.head, task.num_choices, task.main_metric) == ("swag", "choice", 4, "accuracy")
  assert task.eval_splits == ("dev",) and task.test_splits == ("test",)
  train = task.read("train")
  assert train == [
    swag.SwagExample("0", "The man said yes.", "He", ("went home, then ran.", "played.", "ran.", "was."), 2, 2),
    swag.SwagExample("1", "The dog ran.", "The cat", ("ran.", "played\nthe film.", "was good.", "said no."), 0, 3),
  ]
  assert [e.label for e in task.read("dev")] == [3]
  assert task.read("test") == [
    swag.SwagExample("5", "A dog ran.", "It", ("ran.", "went.", "was.", "played."), None, 2),
  ]


def test_columns_found_by_name_and_id_defaults_to_position(tmp_path):
  (tmp_path / "val.csv").write_text(
    "label,ending3,ending2,ending1,ending0,sent2,sent1\n1,d,c,b,a,he,the man\n0,h,g,f,e,she,a woman\n"
  )
  examples = swag.Swag(str(tmp_path)).read("dev")
  assert examples[1] == swag.SwagExample("1", "a woman", "she", ("e", "f", "g", "h"), 0, 3)
  assert examples[0].id == "0" and examples[0].label == 1


@pytest.mark.parametrize("kind", ["wordpiece", "sentencepiece"])
def test_encode_choice_layout(data_dir, fixture_tokenizers, kind):
  tokenizer = fixture_tokenizers[kind]
  task = swag.Swag(str(data_dir))
  examples = task.read("train")
  encoded = task.encode(examples, tokenizer, max_seq_length=24)
  features = encoded.features
  for name in ("input_ids", "input_mask", "segment_ids"):
    assert features[name].shape == (2, 4, 24) and features[name].dtype == np.int32
  np.testing.assert_array_equal(features["label"], np.array([2, 0], np.int32))
  np.testing.assert_array_equal(encoded.row_example, [0, 1])
  for row, example in enumerate(examples):
    for choice, ending in enumerate(example.endings):
      expected = encode_pair(
        tokenizer, tokenizer.encode(example.sent1), tokenizer.encode(f"{example.sent2} {ending}"), 24
      )
      for name, array in zip(("input_ids", "input_mask", "segment_ids"), expected, strict=True):
        np.testing.assert_array_equal(features[name][row, choice], array)
  assert task.encode(task.read("test"), tokenizer, 24).features["label"].tolist() == [0]


def test_encode_wordpiece_pieces_and_truncation(tmp_path, fixture_tokenizers):
  tokenizer = fixture_tokenizers["wordpiece"]
  example = swag.SwagExample("0", "the man played a good film", "he", ("ran", "went home", "was", "said"), 1, 2)
  encoded = swag.Swag(str(tmp_path)).encode([example], tokenizer, max_seq_length=16)
  pieces = [tokenizer.pieces[i] for i in encoded.features["input_ids"][0, 1]]
  assert pieces[:10] == ["[CLS]", "the", "man", "played", "a", "good", "film", "[SEP]", "he", "went"]
  assert pieces[10:] == ["h", "##o", "##m", "##e", "[SEP]", "[PAD]"]
  np.testing.assert_array_equal(encoded.features["segment_ids"][0, 1], [0] * 8 + [1] * 7 + [0])
  np.testing.assert_array_equal(encoded.features["input_mask"][0, 1], [1] * 15 + [0])
  # 6 + 2 tokens do not fit 8 - 3: the longer context loses its last tokens first.
  short = swag.Swag(str(tmp_path)).encode([example], tokenizer, max_seq_length=8).features["input_ids"][0, 0]
  assert [tokenizer.pieces[i] for i in short] == ["[CLS]", "the", "man", "played", "[SEP]", "he", "ran", "[SEP]"]


def test_metrics_accuracy(data_dir, fixture_tokenizers):
  task = swag.Swag(str(data_dir))
  examples = task.read("train") + task.read("dev")  # Labels 2, 0, 3.
  encoded = task.encode(examples, fixture_tokenizers["wordpiece"], max_seq_length=24)
  logits = np.array([[0.1, 0.2, 0.9, 0.0], [0.0, 1.0, -1.0, 0.5], [-2.0, -3.0, -1.0, -0.5]], np.float32)
  assert task.metrics(encoded, logits) == {"accuracy": pytest.approx(2 / 3)}
  with pytest.raises(ValueError, match="shape"):
    task.metrics(encoded, logits[:, :3])
  unlabelled = task.encode(task.read("test"), fixture_tokenizers["wordpiece"], max_seq_length=24)
  with pytest.raises(ValueError, match="labelled"):
    task.metrics(unlabelled, np.zeros((1, 4), np.float32))


def test_write_predictions_leaderboard_csv(data_dir, fixture_tokenizers, tmp_path):
  task = swag.Swag(str(data_dir))
  examples = task.read("test") + task.read("dev")
  encoded = task.encode(examples, fixture_tokenizers["wordpiece"], max_seq_length=24)
  path = tmp_path / "test_predictions.csv"
  task.write_predictions(encoded, np.array([[0, 0, 0, 1], [0, 2, 1, 0]], np.float32), str(path))
  assert path.read_text() == ",pred\n5,3\n7,1\n"


@pytest.mark.parametrize(
  "text, split, line, message",
  [
    ("", "dev", 1, "empty file"),
    (HEADER, "dev", 1, "no example"),
    (HEADER.replace("ending2", "ending_2"), "dev", 1, r"no column \['ending2'\]"),
    (HEADER.replace(",label", ""), "train", 1, r"no column \['label'\]"),
    (TRAIN.replace(",was.,2", ",was.,4"), "train", 2, "label '4' is not one of 0..3"),
    (VAL + "8,v,1,a,a,b,gold,c,d,e,f,\n", "dev", 3, "label '' is not one of 0..3"),
    (TRAIN.replace("said no.,0", "said no.,x"), "train", 3, "label 'x'"),
    (VAL + "8,v,1,a,a,b,gold,c,d,e\n", "dev", 3, "10 fields; the header has 12"),
  ],
)
def test_bad_files_name_file_and_line(tmp_path, text, split, line, message):
  name = swag.SPLIT_FILES[split]
  (tmp_path / name).write_text(text)
  with pytest.raises(ValueError, match=message) as error:
    swag.Swag(str(tmp_path)).read(split)
  assert f"{name}:{line}:" in str(error.value)


def test_missing_file_and_unknown_split(tmp_path):
  task = swag.Swag(str(tmp_path))
  with pytest.raises(FileNotFoundError, match="val.csv"):
    task.read("dev")
  with pytest.raises(ValueError, match="Unknown split"):
    task.read("validation")


def test_reads_and_writes_gcs(gcs_bucket, fixture_tokenizers):
  from etils import epath

  directory = f"{gcs_bucket}/swag"
  (epath.Path(directory) / "test.csv").write_text(TEST)
  task = swag.Swag(directory)
  encoded = task.encode(task.read("test"), fixture_tokenizers["wordpiece"], max_seq_length=24)
  task.write_predictions(encoded, np.array([[0, 1, 0, 0]], np.float32), f"{directory}/test_predictions.csv")
  assert epath.Path(f"{directory}/test_predictions.csv").read_text() == ",pred\n5,1\n"
