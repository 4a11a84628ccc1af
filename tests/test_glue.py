"""GLUE tasks from their files: the nine TSV layouts, Microsoft's MRPC files, gs://, encoding with both tokenizers,
metrics, prediction files, and every refused file named with its line (from TFDS: tests/test_glue_tfds.py)."""

import logging

import numpy as np
import pytest
from etils import epath

from bert_jax.benchmarks import glue_text
from bert_jax.finetune import glue, glue_files
from bert_jax.finetune.glue import GlueExample

T = "\t"
MNLI_COLUMNS = [
  "index",
  "promptID",
  "pairID",
  "genre",
  "sentence1_binary_parse",
  "sentence2_binary_parse",
  "sentence1_parse",
  "sentence2_parse",
  "sentence1",
  "sentence2",
]
STSB_COLUMNS = ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2"]


def row(*fields) -> str:
  return T.join(str(f) for f in fields)


def mnli_row(index, premise, hypothesis, *labels) -> str:
  return row(index, 1, f"{index}e", "fiction", "( a )", "( b )", "(ROOT a)", "(ROOT b)", premise, hypothesis, *labels)


def stsb_row(index, a, b, *score) -> str:
  return row(index, "main-captions", "MSRvid", "2012test", f"{index:04d}", "none", "none", a, b, *score)


# Each task's files as the GLUE download has them (two examples a file), and the first example expected of each.
FILES = {
  "cola": {
    "train.tsv": [row("gj04", 1, "", 'the man said "yes" .'), row("gj04", 0, "*", "man the said .")],
    "dev.tsv": [row("cj99", 0, "*", "the the dog ."), row("cj99", 1, "", "the dog ran .")],
    "test.tsv": [row("index", "sentence"), row(0, "a cat ran ."), row(1, "cat a ran .")],
  },
  "sst2": {
    "train.tsv": [row("sentence", "label"), row('a "great" film ', 1), row("a terrible film ", 0)],
    "dev.tsv": [row("sentence", "label"), row("bad .", 0), row("good .", 1)],
    "test.tsv": [row("index", "sentence"), row(0, "i love it ."), row(1, "i hate it .")],
  },
  "mrpc": {
    "train.tsv": [
      row("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"),
      row(1, 702876, 702977, "he said yes .", "he says yes ."),
      row(0, 2108705, 2108831, "the dog ran .", "a cat played ."),
    ],
    "dev.tsv": [
      row("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"),
      row(0, 1, 2, "she went .", "he ran ."),
      row(1, 3, 4, "we go .", "we went ."),
    ],
    "test.tsv": [
      row("index", "#1 ID", "#2 ID", "#1 String", "#2 String"),
      row(0, 5, 6, "the city .", "a city ."),
      row(1, 7, 8, "the car .", "a book ."),
    ],
  },
  "stsb": {
    "train.tsv": [
      row(*STSB_COLUMNS, "score"),
      stsb_row(0, "a man is playing .", "a man plays .", "5.000"),
      stsb_row(1, "a dog ran .", "a cat .", "0.500"),
    ],
    "dev.tsv": [row(*STSB_COLUMNS, "score"), stsb_row(0, "a b", "c d", "3.2"), stsb_row(1, "e", "f", "1")],
    "test.tsv": [row(*STSB_COLUMNS), stsb_row(0, "a man .", "a woman ."), stsb_row(1, "one", "two")],
  },
  "qqp": {
    "train.tsv": [
      row("id", "qid1", "qid2", "question1", "question2", "is_duplicate"),
      row(133273, 213221, 213222, "how is the film?", "is the film good?", 1),
      row(402555, 536040, 536041, "who is he?", "where is paris?", 0),
    ],
    "dev.tsv": [
      row("id", "qid1", "qid2", "question1", "question2", "is_duplicate"),
      row(7, 1, 2, "what is it?", "what is this?", 1),
      row(8, 3, 4, "why?", "how?", 0),
    ],
    "test.tsv": [row("id", "question1", "question2"), row(0, "who?", "what?"), row(1, "when?", "where?")],
  },
  "mnli": {
    "train.tsv": [
      row(*MNLI_COLUMNS, "label1", "gold_label"),
      mnli_row(0, "the man ran .", "a man ran .", "entailment", "entailment"),
      mnli_row(1, "the dog .", "no dog .", "contradiction", "contradiction"),
    ],
    "dev_matched.tsv": [
      row(*MNLI_COLUMNS, *(f"label{i}" for i in range(1, 6)), "gold_label"),
      mnli_row(0, "she went .", "she left .", *["neutral"] * 5, "neutral"),
      mnli_row(1, "he ran .", "he did not run .", *["contradiction"] * 5, "contradiction"),
    ],
    "dev_mismatched.tsv": [
      row(*MNLI_COLUMNS, *(f"label{i}" for i in range(1, 6)), "gold_label"),
      mnli_row(0, "a cat .", "an animal .", *["entailment"] * 5, "entailment"),
      mnli_row(1, "a car .", "a book .", *["neutral"] * 5, "neutral"),
    ],
    "test_matched.tsv": [row(*MNLI_COLUMNS), mnli_row(7, "a .", "b ."), mnli_row(9, "c .", "d .")],
    "test_mismatched.tsv": [row(*MNLI_COLUMNS), mnli_row(3, "e .", "f ."), mnli_row(4, "g .", "h .")],
  },
  "qnli": {
    "train.tsv": [
      row("index", "question", "sentence", "label"),
      row(0, "what is paris?", "paris is a city .", "entailment"),
      row(1, "who?", "no one knows where .", "not_entailment"),
    ],
    "dev.tsv": [row("index", "question", "sentence", "label"), row(0, "q?", "s .", "not_entailment")],
    "test.tsv": [row("index", "question", "sentence"), row(0, "why?", "because .")],
  },
  "rte": {
    "train.tsv": [
      row("index", "sentence1", "sentence2", "label"),
      row(0, "john went to paris .", "john was in france .", "entailment"),
      row(1, "mary ran .", "mary played .", "not_entailment"),
    ],
    "dev.tsv": [row("index", "sentence1", "sentence2", "label"), row(0, "a .", "b .", "not_entailment")],
    "test.tsv": [row("index", "sentence1", "sentence2"), row(0, "c .", "d ."), row(1, "e .", "f .")],
  },
  "wnli": {
    "train.tsv": [
      row("index", "sentence1", "sentence2", "label"),
      row(0, "the dog ran to the cat because it was good .", "the dog was good .", 1),
      row(1, "he said it .", "she said it .", 0),
    ],
    "dev.tsv": [row("index", "sentence1", "sentence2", "label"), row(0, "a .", "b .", 0)],
    "test.tsv": [row("index", "sentence1", "sentence2"), row(0, "c .", "d .")],
  },
}
FIRST = {
  ("cola", "train"): GlueExample("0", 'the man said "yes" .', None, "1"),
  ("cola", "test"): GlueExample("0", "a cat ran ."),
  ("sst2", "train"): GlueExample("0", 'a "great" film ', None, "1"),
  ("sst2", "test"): GlueExample("0", "i love it ."),
  ("mrpc", "train"): GlueExample("0", "he said yes .", "he says yes .", "1"),
  ("mrpc", "test"): GlueExample("0", "the city .", "a city ."),
  ("stsb", "train"): GlueExample("0", "a man is playing .", "a man plays .", 5.0),
  ("stsb", "dev"): GlueExample("0", "a b", "c d", 3.2),
  ("stsb", "test"): GlueExample("0", "a man .", "a woman ."),
  ("qqp", "train"): GlueExample("133273", "how is the film?", "is the film good?", "1"),
  ("qqp", "test"): GlueExample("0", "who?", "what?"),
  ("mnli", "train"): GlueExample("0", "the man ran .", "a man ran .", "entailment"),
  ("mnli", "dev_matched"): GlueExample("0", "she went .", "she left .", "neutral"),
  ("mnli", "dev_mismatched"): GlueExample("0", "a cat .", "an animal .", "entailment"),
  ("mnli", "test_matched"): GlueExample("7", "a .", "b ."),
  ("mnli", "test_mismatched"): GlueExample("3", "e .", "f ."),
  ("qnli", "train"): GlueExample("0", "what is paris?", "paris is a city .", "entailment"),
  ("qnli", "test"): GlueExample("0", "why?", "because ."),
  ("rte", "train"): GlueExample("0", "john went to paris .", "john was in france .", "entailment"),
  ("rte", "dev"): GlueExample("0", "a .", "b .", "not_entailment"),
  ("wnli", "train"): GlueExample("0", "the dog ran to the cat because it was good .", "the dog was good .", "1"),
  ("wnli", "test"): GlueExample("0", "c .", "d ."),
}


def write_task(directory, files: dict[str, list[str]]):
  directory.mkdir(parents=True, exist_ok=True)
  for name, lines in files.items():
    (directory / name).write_text("".join(line + "\n" for line in lines))
  return directory


@pytest.fixture
def glue_dir(tmp_path):
  """glue_data/ with every task's directory."""
  for name, files in FILES.items():
    write_task(tmp_path / glue.TASKS[name].glue_dir, files)
  return tmp_path


def task_in(glue_dir, name: str, files: dict | None = None) -> glue.GlueTask:
  directory = glue_dir / glue.TASKS[name].glue_dir
  if files:
    write_task(directory, files)
  return glue.make_task(name, data_dir=str(directory))


@pytest.mark.parametrize("name", sorted(FILES))
def test_reads_every_split_of_every_layout(glue_dir, name):
  task = task_in(glue_dir, name)
  for split in (task.train_split, *task.eval_splits, *task.test_splits):
    examples = task.read(split)
    assert len(examples) == len(FILES[name][f"{split}.tsv"]) - (name != "cola" or split == "test")
    if (name, split) in FIRST:
      assert examples[0] == FIRST[name, split]
    labelled = split not in task.test_splits
    assert all((example.label is not None) == labelled for example in examples)
    assert all((example.text_b is None) == (name in ("cola", "sst2")) for example in examples)


def test_task_attributes_and_registry():
  assert sorted(glue.TASKS) == ["cola", "mnli", "mrpc", "qnli", "qqp", "rte", "sst2", "stsb", "wnli"]
  mains = {name: (task.head, task.main_metric) for name, task in glue.TASKS.items()}
  assert mains["cola"] == ("classification", "matthews_corr")
  assert mains["mrpc"] == mains["qqp"] == ("classification", "f1")
  assert mains["stsb"] == ("regression", "corr")
  assert mains["sst2"] == mains["mnli"] == mains["rte"] == ("classification", "accuracy")
  mnli = glue.make_task("mnli")
  assert mnli.labels == ("contradiction", "entailment", "neutral") and mnli.num_labels == 3
  assert (mnli.eval_splits, mnli.test_splits) == (
    ("dev_matched", "dev_mismatched"),
    ("test_matched", "test_mismatched"),
  )
  assert glue.make_task("qnli").labels == glue.make_task("rte").labels == ("entailment", "not_entailment")
  assert glue.make_task("wnli").labels == ("0", "1") and glue.make_task("STS-B").num_labels == 1
  assert isinstance(glue.make_task("SST-2", data_dir="x"), glue.Sst2)
  with pytest.raises(ValueError, match="Unknown GLUE task 'squad'.*'cola'.*'wnli'"):
    glue.make_task("squad")
  with pytest.raises(ValueError, match="Unknown split 'dev' for mnli.*dev_matched"):
    mnli.read("dev")


def test_submission_file_names():
  names = {(t, s): glue_files.submission_file_name(t, s) for t, task in glue.TASKS.items() for s in task.test_splits}
  assert names == {
    ("cola", "test"): "CoLA.tsv",
    ("sst2", "test"): "SST-2.tsv",
    ("mrpc", "test"): "MRPC.tsv",
    ("stsb", "test"): "STS-B.tsv",
    ("qqp", "test"): "QQP.tsv",
    ("mnli", "test_matched"): "MNLI-m.tsv",
    ("mnli", "test_mismatched"): "MNLI-mm.tsv",
    ("qnli", "test"): "QNLI.tsv",
    ("rte", "test"): "RTE.tsv",
    ("wnli", "test"): "WNLI.tsv",
  }
  assert glue_files.submission_file_name("mnli", "ax") == "AX.tsv"
  with pytest.raises(ValueError, match="No GLUE submission file for task 'rte' split 'dev'"):
    glue_files.submission_file_name("rte", "dev")


def test_mnli_diagnostic_split(glue_dir):
  write_task(glue_dir / "diagnostic", {"diagnostic.tsv": [row("index", "sentence1", "sentence2"), row(0, "a", "b")]})
  task = task_in(glue_dir, "mnli")
  assert task.test_splits == ("test_matched", "test_mismatched", "ax")
  assert task.read("ax") == [GlueExample("0", "a", "b")]


@pytest.mark.parametrize("kind", ["wordpiece", "sentencepiece"])
def test_encode_single_pair_truncation_and_padding(fixture_tokenizers, kind):
  tokenizer = fixture_tokenizers[kind]
  cls, sep, pad = tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id
  long_a = " ".join(["the man went to paris"] * 6)
  examples = [
    GlueExample("0", "the dog ran", None, "1"),
    GlueExample("1", "a cat", "a dog", "0"),
    GlueExample("2", long_a, "yes", "1"),
  ]
  encoded = glue.make_task("cola").encode(examples[:1], tokenizer, 12)
  dog = tokenizer.encode("the dog ran")
  assert encoded.features["input_ids"][0].tolist() == [cls, *dog, sep] + [pad] * (12 - len(dog) - 2)
  assert encoded.features["input_mask"][0].tolist() == [1] * (len(dog) + 2) + [0] * (10 - len(dog))
  assert encoded.features["segment_ids"][0].tolist() == [0] * 12

  encoded = glue.make_task("mrpc").encode(examples, tokenizer, 16)
  features = encoded.features
  assert {k: (v.shape, v.dtype) for k, v in features.items()} == {
    "input_ids": ((3, 16), np.int32),
    "input_mask": ((3, 16), np.int32),
    "segment_ids": ((3, 16), np.int32),
    "label": ((3,), np.int32),
  }
  assert features["label"].tolist() == [1, 0, 1] and encoded.row_example.tolist() == [0, 1, 2]
  assert encoded.examples == examples
  cat, dog = tokenizer.encode("a cat"), tokenizer.encode("a dog")
  used = len(cat) + len(dog) + 3
  assert features["input_ids"][1].tolist() == [cls, *cat, sep, *dog, sep] + [pad] * (16 - used)
  assert features["segment_ids"][1].tolist() == [0] * (len(cat) + 2) + [1] * (len(dog) + 1) + [0] * (16 - used)
  assert features["input_mask"][1].tolist() == [1] * used + [0] * (16 - used)
  # The long first text loses its tail until the pair fits; the short second text stays whole.
  a, yes = tokenizer.encode(long_a), tokenizer.encode("yes")
  assert len(a) > 16
  kept = 16 - 3 - len(yes)
  assert features["input_ids"][2].tolist() == [cls, *a[:kept], sep, *yes, sep]
  assert features["input_mask"][2].tolist() == [1] * 16
  assert features["segment_ids"][2].tolist() == [0] * (kept + 2) + [1] * (len(yes) + 1)


def test_encode_labels_of_each_head(fixture_tokenizers, glue_dir):
  tokenizer = fixture_tokenizers["wordpiece"]
  stsb = task_in(glue_dir, "stsb")
  encoded = stsb.encode(stsb.read("train"), tokenizer, 32)
  assert encoded.features["label"].dtype == np.float32 and encoded.features["label"].tolist() == [5.0, 0.5]
  assert stsb.encode(stsb.read("test"), tokenizer, 32).features["label"].tolist() == [0.0, 0.0]
  mnli = task_in(glue_dir, "mnli")
  assert mnli.encode(mnli.read("dev_matched"), tokenizer, 32).features["label"].tolist() == [2, 0]
  assert mnli.encode(mnli.read("test_matched"), tokenizer, 32).features["label"].tolist() == [0, 0]


def encoded_for(task, labels, tokenizer):
  examples = [GlueExample(str(i), "the dog", "a cat", label) for i, label in enumerate(labels)]
  return task.encode(examples, tokenizer, 8)


def one_hot(predictions, classes):
  return np.eye(classes, dtype=np.float32)[predictions] * 3.0 - 1.0


def test_metrics_against_hand_computed_values(fixture_tokenizers):
  tokenizer = fixture_tokenizers["wordpiece"]
  cola = glue.make_task("cola")
  # tp 2, fn 1, tn 1, fp 0: (2*1 - 0*1) / sqrt(2 * 3 * 1 * 2).
  scores = cola.metrics(encoded_for(cola, ["1", "1", "1", "0"], tokenizer), one_hot([1, 1, 0, 0], 2))
  assert scores == {"matthews_corr": pytest.approx(2 / np.sqrt(12))}
  mrpc = glue.make_task("mrpc")
  # tp 2, fp 1, fn 1: f1 4/6; 3 of 5 right.
  scores = mrpc.metrics(encoded_for(mrpc, ["1", "1", "0", "0", "1"], tokenizer), one_hot([1, 0, 0, 1, 1], 2))
  assert scores == {"f1": pytest.approx(2 / 3), "accuracy": pytest.approx(0.6)}
  qqp = glue.make_task("qqp")
  assert qqp.metrics(encoded_for(qqp, ["0", "0"], tokenizer), one_hot([0, 0], 2)) == {"f1": 0.0, "accuracy": 1.0}
  stsb = glue.make_task("stsb")
  # Deviations (-1.5, -.5, .5, 1.5) and (-1.5, -.5, 1.5, .5): covariance 4 over variance 5; ranks alike.
  scores = stsb.metrics(encoded_for(stsb, [1.0, 2.0, 3.0, 4.0], tokenizer), np.array([1.0, 2.0, 4.0, 3.0]))
  assert scores == pytest.approx({"pearson": 0.8, "spearman": 0.8, "corr": 0.8})
  assert stsb.metrics(encoded_for(stsb, [1.0, 2.0], tokenizer), np.array([[1.0], [3.0]]))["pearson"] == 1.0
  mnli = glue.make_task("mnli")
  encoded = encoded_for(mnli, ["contradiction", "entailment", "neutral", "neutral"], tokenizer)
  assert mnli.metrics(encoded, one_hot([0, 1, 2, 0], 3)) == {"accuracy": 0.75}
  for name in ("sst2", "qnli", "rte", "wnli"):
    task = glue.make_task(name)
    labels = [task.labels[i] for i in (0, 1, 1, 0)]
    assert task.metrics(encoded_for(task, labels, tokenizer), one_hot([0, 1, 0, 0], 2)) == {"accuracy": 0.75}
  with pytest.raises(ValueError, match=r"shape \(4, 2\) for 4 rows of 3 labels"):
    mnli.metrics(encoded, np.zeros((4, 2)))
  with pytest.raises(ValueError, match="need a labelled split"):
    mnli.metrics(encoded_for(mnli, [None, None], tokenizer), np.zeros((2, 3)))


def test_prediction_files(fixture_tokenizers, glue_dir, tmp_path):
  tokenizer = fixture_tokenizers["sentencepiece"]
  mnli = task_in(glue_dir, "mnli")
  encoded = mnli.encode(mnli.read("test_matched"), tokenizer, 16)
  mnli.write_predictions(encoded, np.array([[0.0, 0.1, 3.0], [2.0, 0.0, 0.0]]), str(tmp_path / "MNLI-m.tsv"))
  assert (tmp_path / "MNLI-m.tsv").read_text() == "index\tprediction\n7\tneutral\n9\tcontradiction\n"
  stsb = task_in(glue_dir, "stsb")
  encoded = stsb.encode(stsb.read("test"), tokenizer, 16)
  stsb.write_predictions(encoded, np.array([4.12345, -0.5], np.float32), str(tmp_path / "STS-B.tsv"))
  assert (tmp_path / "STS-B.tsv").read_text() == "index\tprediction\n0\t4.123\n1\t-0.500\n"
  qqp = task_in(glue_dir, "qqp", {"test.tsv": [row("id", "question1", "question2"), row(17, "a?", "b?")]})
  encoded = qqp.encode(qqp.read("test"), tokenizer, 16)
  qqp.write_predictions(encoded, np.array([[0.0, 1.0]]), str(tmp_path / "QQP.tsv"))
  assert (tmp_path / "QQP.tsv").read_text() == "index\tprediction\n17\t1\n"
  rte = task_in(glue_dir, "rte")
  encoded = rte.encode(rte.read("test"), tokenizer, 16)
  rte.write_predictions(encoded, np.array([[0.0, 1.0], [1.0, 0.0]]), str(tmp_path / "RTE.tsv"))
  assert (tmp_path / "RTE.tsv").read_text() == "index\tprediction\n0\tnot_entailment\n1\tentailment\n"


def error_from(task, split):
  with pytest.raises(ValueError) as error:
    task.read(split)
  return str(error.value)


def test_refused_files_name_file_and_line(glue_dir):
  header = row("index", "sentence1", "sentence2", "label")
  rte = task_in(glue_dir, "rte", {"dev.tsv": [row("index", "sentence1", "sentence2", "labels"), row(0, "a", "b", 0)]})
  message = error_from(rte, "dev")
  assert "dev.tsv:1:" in message and "no column named label" in message
  rte = task_in(glue_dir, "rte", {"train.tsv": [header, row(0, "a", "b", "entailment"), row(1, "a", "b", "maybe")]})
  message = error_from(rte, "train")
  assert "train.tsv:3:" in message and "'maybe'" in message and "'not_entailment'" in message
  stsb = task_in(glue_dir, "stsb", {"train.tsv": [row(*STSB_COLUMNS, "score"), stsb_row(0, "a", "b", "high")]})
  message = error_from(stsb, "train")
  assert "train.tsv:2:" in message and "'high' is not a number" in message
  sst2 = task_in(glue_dir, "sst2", {"dev.tsv": [row("sentence", "label")]})
  message = error_from(sst2, "dev")
  assert "dev.tsv:2:" in message and "no examples" in message
  sst2 = task_in(glue_dir, "sst2", {"dev.tsv": []})
  message = error_from(sst2, "dev")
  assert "dev.tsv:1:" in message and "empty file" in message
  mnli = task_in(glue_dir, "mnli", {"train.tsv": FILES["mnli"]["train.tsv"] + [row(2, "a", "b")]})
  message = error_from(mnli, "train")
  assert "train.tsv:4:" in message and "3 tab-separated fields; the header has 12" in message
  cola = task_in(glue_dir, "cola", {"train.tsv": [row("gj04", 1, "", "a ."), row("gj04", 1, "a .")]})
  message = error_from(cola, "train")
  assert "train.tsv:2:" in message and "3 tab-separated fields; the header has 4" in message
  wnli = task_in(glue_dir, "wnli", {"train.tsv": [header, row(0, "a", "b", 2)]})
  message = error_from(wnli, "train")
  assert "train.tsv:2:" in message and "label '2' is not one of ['0', '1']" in message


def test_a_byte_that_is_not_utf8_names_file_and_line(glue_dir):
  rte = task_in(glue_dir, "rte")
  path = glue_dir / glue.TASKS["rte"].glue_dir / "dev.tsv"
  lines = [
    row("index", "sentence1", "sentence2", "label"),
    row(0, "a", "b", "entailment"),
    row(1, "caf\xe9", "b", "entailment"),
  ]
  path.write_bytes("\n".join(lines[:2]).encode() + b"\n" + lines[2].encode("latin-1") + b"\n")
  message = error_from(rte, "dev")
  assert f"{path}:3: byte 0xe9 is not UTF-8" in message


def test_missing_file_names_path_and_layout(tmp_path):
  with pytest.raises(FileNotFoundError) as error:
    glue.make_task("wnli", data_dir=str(tmp_path / "WNLI")).read("dev")
  assert str(tmp_path / "WNLI" / "dev.tsv") in str(error.value) and "glue_data/WNLI/" in str(error.value)
  with pytest.raises(FileNotFoundError, match="msr_paraphrase_train.txt"):
    glue.make_task("mrpc", data_dir=str(tmp_path)).read("train")
  with pytest.raises(ValueError, match="set data_dir"):
    glue.make_task("rte").read("train")


def test_qqp_skips_and_counts_lines_missing_fields(glue_dir, caplog):
  lines = FILES["qqp"]["train.tsv"]
  qqp = task_in(glue_dir, "qqp", {"train.tsv": [*lines[:2], row(5, 6, 7, "how do i"), row(8, 9), *lines[2:]]})
  with caplog.at_level(logging.WARNING):
    examples = qqp.read("train")
  assert [example.index for example in examples] == ["133273", "402555"]
  assert "skipped 2 lines with missing fields (lines 3, 4)" in caplog.text
  qqp = task_in(glue_dir, "qqp", {"train.tsv": [*lines, row(1, 2, 3, "a", "b", 0, "extra")]})
  assert "train.tsv:4: 7 tab-separated fields" in error_from(qqp, "train")


def test_mrpc_from_microsoft_files(tmp_path, caplog):
  header = "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String"
  train = [header, row(1, 702876, 702977, 'he said "yes" .', "he says yes ."), row(0, 1, 2, "a dog .", "a cat .")]
  test = [header, row(1, 3, 4, "we go .", "we went ."), row(0, 5, 6, "she ran .", "he ran .")]
  (tmp_path / glue.MSR_TRAIN).write_bytes(("\r\n".join(train) + "\r\n").encode("utf-8"))
  (tmp_path / glue.MSR_TEST).write_bytes(("\r\n".join(test) + "\r\n").encode("utf-8"))
  mrpc = glue.make_task("mrpc", data_dir=str(tmp_path))
  with caplog.at_level(logging.INFO):
    assert mrpc.read("train") == [
      GlueExample("0", 'he said "yes" .', "he says yes .", "1"),
      GlueExample("1", "a dog .", "a cat .", "0"),
    ]
  assert mrpc.read("dev") == [
    GlueExample("0", "we go .", "we went .", "1"),
    GlueExample("1", "she ran .", "he ran .", "0"),
  ]
  assert mrpc.read("test") == [GlueExample("0", "we go .", "we went ."), GlueExample("1", "she ran .", "he ran .")]


def test_reads_and_writes_gcs(gcs_bucket, fixture_tokenizers):

  directory = epath.Path(gcs_bucket) / "glue_data" / "MRPC"
  header = "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String"
  (directory / glue.MSR_TRAIN).write_bytes("\r\n".join([header, row(1, 1, 2, 'a "b" c', "d"), ""]).encode())
  (directory / glue.MSR_TEST).write_bytes("\r\n".join([header, row(0, 3, 4, "e", "f"), ""]).encode())
  mrpc = glue.make_task("mrpc", data_dir=str(directory))
  assert mrpc.read("train") == [GlueExample("0", 'a "b" c', "d", "1")]
  encoded = mrpc.encode(mrpc.read("test"), fixture_tokenizers["wordpiece"], 8)
  mrpc.write_predictions(encoded, np.array([[0.0, 1.0]]), f"{gcs_bucket}/out/MRPC.tsv")
  assert epath.Path(f"{gcs_bucket}/out/MRPC.tsv").read_text() == "index\tprediction\n0\t1\n"


def test_training_text_for_self_pretraining(glue_dir, tmp_path):
  """The pretraining corpus of docs/benchmarks.md "Does pretraining help?": a pair's sentences on consecutive lines,
  examples grouped into documents, labels dropped, never a dev or test text."""
  paths = glue_text.write_training_text(str(glue_dir), ["rte", "sst2"], str(tmp_path / "text"), 1)
  rte, sst2 = (epath.Path(path).read_text() for path in paths)
  assert rte == "john went to paris .\njohn was in france .\n\nmary ran .\nmary played .\n"
  assert sst2.split("\n\n")[0] == 'a "great" film'
  assert glue_text.training_text(task_in(glue_dir, "rte"), 2)[0].count("\n\n") == 0
  with pytest.raises(ValueError, match="'qqq'; expected one of"):
    glue_text.write_training_text(str(glue_dir), ["qqq"], str(tmp_path / "text"), 1)
