"""The nine GLUE tasks (CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE, WNLI) as `Task`s: reading the GLUE
download's TSV files or the TFDS `glue/*` datasets, encoding single sentences and pairs, GLUE's metrics, and the
prediction files the GLUE server takes (`glue_files.submission_file_name` names them).

Files, as `glue_data/<TASK>/` of the GLUE download: `train.tsv`, `dev.tsv`, `test.tsv` (MNLI: `dev_matched.tsv`,
`dev_mismatched.tsv`, `test_matched.tsv`, `test_mismatched.tsv`). They are tab-separated without quoting (a
sentence may hold `"`). Columns are found by their header name (`sentence`, `sentence1`, `question1`, `label`,
`gold_label`, `is_duplicate`, `score`, `index`, ...), not by position, so that the reshuffled variants in
circulation read too. CoLA's train and dev files are the exception: no header, four columns (source, label, the
original annotation mark, sentence), as Google BERT's `ColaProcessor` reads them. Test files are unlabelled; their
`index` (QQP: `id`) column is what the prediction file repeats.

MRPC also reads Microsoft's own files when `train.tsv` is absent: `msr_paraphrase_train.txt` for train and
`msr_paraphrase_test.txt` for dev and test. GLUE carves its dev split out of Microsoft's train file with
`dev_ids.tsv` and uses Microsoft's test file, in order, as its test split; without `dev_ids.tsv`, dev here is
Microsoft's (labelled) test file, so train is GLUE's train + dev and dev scores are not comparable to GLUE's.
"""

import csv
import dataclasses
import math

import numpy as np
from absl import logging
from etils import epath

from bert_jax import paths
from bert_jax.finetune import glue_files
from bert_jax.finetune import metrics as metrics_lib
from bert_jax.finetune.contract import Encoded, Task, encode_pair

INDEX_COLUMNS = ("index", "id")  # The column a test file's predictions are keyed by (QQP's is `id`).
BINARY_LABELS = ("0", "1")
NLI_LABELS = ("entailment", "not_entailment")
# Google BERT's MnliProcessor order: the class ids of checkpoints fine-tuned with run_classifier.py.
MNLI_LABELS = ("contradiction", "entailment", "neutral")
# Our split names -> TFDS's (TFDS names dev "validation").
TFDS_SPLITS = {
  "train": "train",
  "dev": "validation",
  "test": "test",
  "dev_matched": "validation_matched",
  "dev_mismatched": "validation_mismatched",
  "test_matched": "test_matched",
  "test_mismatched": "test_mismatched",
}
MSR_TRAIN, MSR_TEST = "msr_paraphrase_train.txt", "msr_paraphrase_test.txt"
DIAGNOSTIC = "diagnostic.tsv"


@dataclasses.dataclass(frozen=True)
class GlueExample:
  """One example: its id (the file's `index`/`id` column, else its position in the split; TFDS's `idx`), one or
  two texts, and its label (a label name; a float score for STS-B; None when unlabelled)."""

  index: str
  text_a: str
  text_b: str | None = None
  label: str | float | None = None


@dataclasses.dataclass(frozen=True)
class Columns:
  """Where a split file's fields are: header names to look for (the first present wins) per field, and the header
  of a file that has none (its lines are then all examples)."""

  text_a: tuple[str, ...]
  text_b: tuple[str, ...] = ()
  label: tuple[str, ...] = ()
  header: tuple[str, ...] | None = None


class GlueTask(Task):
  """What the nine tasks share. A subclass names its columns (TSV and TFDS), labels and metrics.

  `data_dir`: the task's directory of the GLUE download (e.g. `glue_data/MRPC`), local or gs://. `tfds_name`
  (e.g. "glue/mrpc"), when set, reads the splits with tensorflow_datasets instead, from `tfds_data_dir`.
  """

  head = "classification"
  labels = BINARY_LABELS
  main_metric = "accuracy"
  eval_splits = ("dev",)
  test_splits = ("test",)
  glue_dir: str  # The task's directory name in the GLUE download.
  columns: Columns  # Of train and dev; test files have the same texts, no label.
  tfds_text: tuple[str, ...]  # TFDS feature names of text_a (and text_b).
  tolerate_short_lines = False  # Skip (and count) lines with fewer fields than the header instead of refusing.

  def __init__(self, data_dir: str = "", tfds_name: str = "", tfds_data_dir: str = ""):
    self.data_dir, self.tfds_name, self.tfds_data_dir = data_dir, tfds_name, tfds_data_dir

  @property
  def splits(self) -> tuple[str, ...]:
    return (self.train_split, *self.eval_splits, *self.test_splits)

  def read(self, split: str) -> list[GlueExample]:
    if split not in self.splits:
      raise ValueError(f"Unknown split {split!r} for {self.name}; expected one of {list(self.splits)}.")
    if self.tfds_name:
      return self._read_tfds(split)
    if not self.data_dir:
      raise ValueError(f"{self.name}: set data_dir (the GLUE download's {self.glue_dir} directory) or tfds_name.")
    path = self.split_path(split)
    if not path.exists():
      raise FileNotFoundError(f"{path} does not exist; {self.name} expects {self.expected_layout()}")
    return self._read_tsv(path, self._columns(split), labelled=split not in self.test_splits)

  def split_path(self, split: str) -> epath.Path:
    return epath.Path(self.data_dir) / f"{split}.tsv"

  def tfds_dataset(self) -> tuple[str, str | None] | None:
    return (self.tfds_name, self.tfds_data_dir or None) if self.tfds_name else None

  def expected_layout(self) -> str:
    files = ", ".join(f"{split}.tsv" for split in (self.train_split, *self.eval_splits, *type(self).test_splits))
    names = [*self.columns.text_a[:1], *self.columns.text_b[:1], *self.columns.label[:1]]
    return (
      f"the GLUE download's {self.glue_dir} directory (glue_data/{self.glue_dir}/): {files}, tab-separated with a "
      f"header naming {', '.join(names)} (test files: index and the texts)."
    )

  def _columns(self, split: str) -> Columns:
    return self.columns

  # --------------------------------------------------------------------------------------------------------------
  # TSV files.

  def _read_tsv(self, path: epath.Path, columns: Columns, labelled: bool) -> list[GlueExample]:
    """The examples of one GLUE TSV file. Raises ValueError naming the file and line that is wrong."""
    examples, short_lines = [], []
    with glue_files.open_text(path) as f:
      reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
      try:
        header = list(columns.header) if columns.header else [name.strip() for name in next(reader, [])]
        if not header:
          raise ValueError(f"{path}:1: empty file; {self.name} expects {self.expected_layout()}")
        make_example = self._example_maker(path, header, columns, labelled)
        for fields in reader:
          if not fields:  # A blank line (e.g. a second newline at the end of the file).
            continue
          if len(fields) == len(header):
            examples.append(make_example(fields, reader.line_num, str(len(examples))))
          elif self.tolerate_short_lines and len(fields) < len(header):
            short_lines.append(reader.line_num)
          else:
            raise ValueError(
              f"{path}:{reader.line_num}: {len(fields)} tab-separated fields; the header has {len(header)} ({header})."
            )
      except csv.Error as error:
        raise ValueError(f"{path}:{reader.line_num}: {error}") from error
      except UnicodeDecodeError as error:  # Decoded a chunk at a time: find the line itself.
        line, byte = glue_files.undecodable_line(path)
        raise ValueError(
          f"{path}:{line}: byte {byte:#04x} is not UTF-8 ({error.reason}); GLUE files are UTF-8: re-encode the file."
        ) from None
      if not examples:
        raise ValueError(f"{path}:{reader.line_num + 1}: no examples; {self.name} expects {self.expected_layout()}")
    glue_files.log_short_lines(path, short_lines)
    return examples

  def _example_maker(self, path, header: list[str], columns: Columns, labelled: bool):
    """A function (fields, line, default index) -> GlueExample for the file with `header`; raises naming the file
    when a column is missing."""
    find = glue_files.column_finder(path, header, self.expected_layout())
    text_a = find(columns.text_a)
    text_b = find(columns.text_b) if columns.text_b else None
    label = find(columns.label) if labelled else None
    index = next((header.index(name) for name in INDEX_COLUMNS if name in header), None)

    def make(fields: list[str], line: int, default_index: str) -> GlueExample:
      return GlueExample(
        index=fields[index] if index is not None else default_index,
        text_a=fields[text_a],
        text_b=None if text_b is None else fields[text_b],
        label=None if label is None else self._parse_label(fields[label], path, line),
      )

    return make

  def _parse_label(self, value: str, path, line: int) -> str | float:
    value = value.strip()
    if value not in self.labels:
      raise ValueError(f"{path}:{line}: label {value!r} is not one of {list(self.labels)}.")
    return value

  # --------------------------------------------------------------------------------------------------------------
  # TFDS.

  def _read_tfds(self, split: str) -> list[GlueExample]:
    """The split from tensorflow_datasets, in the GLUE file's order (TFDS stores examples shuffled; `idx` is the
    position in the file). Labels of -1 (TFDS's test splits) read as unlabelled."""
    import tensorflow_datasets as tfds

    name, tfds_split = self.tfds_name, TFDS_SPLITS[split]
    dataset, info = tfds.load(name, split=tfds_split, data_dir=self.tfds_data_dir or None, with_info=True)
    missing = [feature for feature in (*self.tfds_text, "label", "idx") if feature not in info.features]
    if missing:
      raise ValueError(f"TFDS dataset {name} has no feature {missing} (it has {list(info.features)}).")
    to_label = self._tfds_label_reader(info.features["label"], name)
    labelled = split not in self.test_splits
    examples = []
    for row in tfds.as_numpy(dataset):
      texts = [row[feature].decode("utf-8") for feature in self.tfds_text]
      examples.append(
        GlueExample(
          index=str(int(row["idx"])),
          text_a=texts[0],
          text_b=texts[1] if len(texts) > 1 else None,
          label=to_label(row["label"]) if labelled else None,
        )
      )
    if not examples:
      raise ValueError(f"TFDS dataset {name} split {tfds_split} has no examples.")
    return sorted(examples, key=lambda example: int(example.index))

  def _tfds_label_reader(self, feature, name: str):
    """A function from a TFDS label to ours. TFDS stores the files' 0/1 labels as class ids (whatever it names the
    classes) and named labels (MNLI, QNLI, RTE) by name, in its own order."""
    names = list(feature.names)
    if self.labels == BINARY_LABELS and len(names) == 2:
      ours = list(BINARY_LABELS)
    elif set(names) == set(self.labels):
      ours = names
    else:
      raise ValueError(f"TFDS dataset {name} has labels {names}; {self.name} expects {list(self.labels)}.")
    return lambda value: None if int(value) < 0 else ours[int(value)]

  # --------------------------------------------------------------------------------------------------------------
  # Encoding, metrics, predictions.

  def encode(self, examples: list[GlueExample], tokenizer, max_seq_length: int) -> Encoded:
    """input_ids, input_mask, segment_ids [rows, seq] int32 ([CLS] a [SEP] (b [SEP]), truncated as Google BERT
    does) and label [rows] (class ids int32, STS-B scores float32; 0 where unlabelled); one row per example."""
    shape = (len(examples), max_seq_length)
    input_ids, input_mask, segment_ids = (np.zeros(shape, np.int32) for _ in range(3))
    for i, example in enumerate(examples):
      text_b = None if example.text_b is None else tokenizer.encode(example.text_b)
      row = encode_pair(tokenizer, tokenizer.encode(example.text_a), text_b, max_seq_length)
      input_ids[i], input_mask[i], segment_ids[i] = row
    features = {
      "input_ids": input_ids,
      "input_mask": input_mask,
      "segment_ids": segment_ids,
      "label": self._label_array([example.label for example in examples]),
    }
    return Encoded(features, list(examples), np.arange(len(examples), dtype=np.int32))

  def _label_array(self, labels: list) -> np.ndarray:
    return np.array([0 if label is None else self.labels.index(label) for label in labels], np.int32)

  def metrics(self, encoded: Encoded, logits: np.ndarray) -> dict[str, float]:
    """The task's GLUE metrics of the argmax of `logits` [rows, num_labels] (STS-B: scores [rows])."""
    if any(example.label is None for example in encoded.examples):
      raise ValueError(f"{self.name} metrics need a labelled split; these examples have no label (a test split?).")
    labels = self._label_array([encoded.examples[i].label for i in encoded.row_example])
    return self._score(labels, self._predictions(encoded, logits))

  def _score(self, labels: np.ndarray, predictions: np.ndarray) -> dict[str, float]:
    return {"accuracy": metrics_lib.accuracy(labels, predictions)}

  def _predictions(self, encoded: Encoded, logits: np.ndarray) -> np.ndarray:
    """[rows] predicted class ids."""
    logits = np.asarray(logits)
    if logits.shape != (encoded.num_rows, self.num_labels):
      raise ValueError(f"Logits of shape {logits.shape} for {encoded.num_rows} rows of {self.num_labels} labels.")
    return logits.argmax(-1)

  def _prediction_text(self, prediction) -> str:
    return self.labels[int(prediction)]

  def prediction_file(self, split: str) -> str:
    """A test split's file under the name the GLUE server expects (`submission_file_name`: MNLI-m.tsv, ...)."""
    if split in self.test_splits:
      return glue_files.submission_file_name(self.name, split)
    return super().prediction_file(split)

  def write_predictions(self, encoded: Encoded, logits: np.ndarray, path: str) -> None:
    """The GLUE server's file for a test split: header `index\\tprediction`, then per example the index from its
    file and the predicted label (STS-B: the score with 3 decimals)."""
    predictions = self._predictions(encoded, logits)
    lines = ["index\tprediction"]
    for row, prediction in zip(encoded.row_example, predictions, strict=True):
      lines.append(f"{encoded.examples[row].index}\t{self._prediction_text(prediction)}")
    paths.write_text(path, "\n".join(lines) + "\n")


class Cola(GlueTask):
  """CoLA: is the sentence grammatical ("1") or not ("0"). Matthews correlation."""

  name = "cola"
  glue_dir = "CoLA"
  main_metric = "matthews_corr"
  columns = Columns(text_a=("sentence",), label=("label",), header=("source", "label", "mark", "sentence"))
  tfds_text = ("sentence",)

  def _columns(self, split: str) -> Columns:
    # Only the test file has a header (index, sentence).
    return Columns(text_a=("sentence",)) if split in self.test_splits else self.columns

  def expected_layout(self) -> str:
    return (
      "the GLUE download's CoLA directory (glue_data/CoLA/): train.tsv and dev.tsv without a header, 4 "
      "tab-separated columns (source, label 0/1, original mark, sentence); test.tsv with the header index, sentence."
    )

  def _score(self, labels, predictions):
    return {"matthews_corr": metrics_lib.matthews_corrcoef(labels, predictions)}


class Sst2(GlueTask):
  """SST-2: sentence sentiment, negative ("0") or positive ("1"). Accuracy."""

  name = "sst2"
  glue_dir = "SST-2"
  columns = Columns(text_a=("sentence",), label=("label",))
  tfds_text = ("sentence",)


class _F1Task(GlueTask):
  """A paraphrase task scored by F1 of class "1" (the main metric) and accuracy."""

  main_metric = "f1"

  def _score(self, labels, predictions):
    positive = self.labels.index("1")
    return {
      "f1": metrics_lib.f1_binary(labels, predictions, positive=positive),
      "accuracy": metrics_lib.accuracy(labels, predictions),
    }


class Mrpc(_F1Task):
  """MRPC: are the two sentences paraphrases ("1") or not ("0"). F1 and accuracy. Reads Microsoft's own files
  when train.tsv is absent (see the module docstring)."""

  name = "mrpc"
  glue_dir = "MRPC"
  columns = Columns(text_a=("#1 String",), text_b=("#2 String",), label=("Quality",))
  tfds_text = ("sentence1", "sentence2")

  def _microsoft_files(self) -> bool:
    directory = epath.Path(self.data_dir)
    return not (directory / "train.tsv").exists() and (directory / MSR_TRAIN).exists()

  def split_path(self, split: str) -> epath.Path:
    if not self._microsoft_files():
      return super().split_path(split)
    name = MSR_TRAIN if split == "train" else MSR_TEST
    logging.info(
      "MRPC: no train.tsv in %s; reading Microsoft's %s for %s (train: %s; dev and test: %s; without GLUE's "
      "dev_ids.tsv, dev is Microsoft's test set).",
      self.data_dir,
      name,
      split,
      MSR_TRAIN,
      MSR_TEST,
    )
    return epath.Path(self.data_dir) / name

  def expected_layout(self) -> str:
    return (
      f"{super().expected_layout()} Or Microsoft's {MSR_TRAIN} and {MSR_TEST} (header Quality, #1 ID, #2 ID, "
      "#1 String, #2 String)."
    )


class Stsb(GlueTask):
  """STS-B: similarity of two sentences, a score in [0, 5]. Pearson and Spearman correlation, and their mean."""

  name = "stsb"
  glue_dir = "STS-B"
  head = "regression"
  labels = ()
  main_metric = "corr"
  columns = Columns(text_a=("sentence1",), text_b=("sentence2",), label=("score",))
  tfds_text = ("sentence1", "sentence2")

  def _parse_label(self, value: str, path, line: int) -> float:
    try:
      score = float(value)
    except ValueError:
      score = math.nan
    if not math.isfinite(score):
      raise ValueError(f"{path}:{line}: score {value!r} is not a number.")
    return score

  def _tfds_label_reader(self, feature, name: str):
    return lambda value: None if float(value) < 0 else float(value)  # TFDS marks test scores -1.

  def _label_array(self, labels: list) -> np.ndarray:
    return np.array([0.0 if label is None else label for label in labels], np.float32)

  def _predictions(self, encoded: Encoded, logits: np.ndarray) -> np.ndarray:
    """[rows] predicted scores, from [rows] (or [rows, 1]) regression outputs."""
    logits = np.asarray(logits)
    if logits.shape not in ((encoded.num_rows,), (encoded.num_rows, 1)):
      raise ValueError(f"Regression outputs of shape {logits.shape} for {encoded.num_rows} rows.")
    return logits.reshape(-1).astype(np.float32)

  def _prediction_text(self, prediction) -> str:
    return f"{float(prediction):.3f}"  # Unclipped: the GLUE server takes any score.

  def _score(self, labels, predictions):
    return metrics_lib.pearson_spearman(labels, predictions)


class Qqp(_F1Task):
  """QQP: are the two questions duplicates ("1") or not ("0"). F1 and accuracy. The real train.tsv has a few lines
  missing fields (questions broken over lines): they are skipped and counted, as Hugging Face's reader does."""

  name = "qqp"
  glue_dir = "QQP"
  columns = Columns(text_a=("question1",), text_b=("question2",), label=("is_duplicate",))
  tfds_text = ("question1", "question2")
  tolerate_short_lines = True


class Mnli(GlueTask):
  """MNLI: does the premise entail, contradict or neither the hypothesis. Accuracy on the matched and mismatched
  dev sets (matched picks the best checkpoint). When GLUE's diagnostic set is found (`diagnostic.tsv` in
  `<data_dir>/../diagnostic/` or `<data_dir>/`), it is the extra test split `ax`."""

  name = "mnli"
  glue_dir = "MNLI"
  labels = MNLI_LABELS
  eval_splits = ("dev_matched", "dev_mismatched")
  test_splits = ("test_matched", "test_mismatched")
  columns = Columns(text_a=("sentence1",), text_b=("sentence2",), label=("gold_label",))
  tfds_text = ("premise", "hypothesis")

  def __init__(self, data_dir: str = "", tfds_name: str = "", tfds_data_dir: str = ""):
    super().__init__(data_dir, tfds_name, tfds_data_dir)
    if self.diagnostic_path() is not None:
      self.test_splits = (*type(self).test_splits, "ax")

  def diagnostic_path(self) -> epath.Path | None:
    """GLUE's diagnostic set (glue_data/diagnostic/diagnostic.tsv) next to or in data_dir, if there is one."""
    if not self.data_dir or self.tfds_name:
      return None
    directory = epath.Path(self.data_dir)
    candidates = (directory.parent / "diagnostic" / DIAGNOSTIC, directory / DIAGNOSTIC)
    return next((path for path in candidates if path.exists()), None)

  def split_path(self, split: str) -> epath.Path:
    return self.diagnostic_path() if split == "ax" else super().split_path(split)


class Qnli(GlueTask):
  """QNLI: does the sentence answer the question. Accuracy."""

  name = "qnli"
  glue_dir = "QNLI"
  labels = NLI_LABELS
  columns = Columns(text_a=("question",), text_b=("sentence",), label=("label",))
  tfds_text = ("question", "sentence")


class Rte(GlueTask):
  """RTE: does the first sentence entail the second. Accuracy."""

  name = "rte"
  glue_dir = "RTE"
  labels = NLI_LABELS
  columns = Columns(text_a=("sentence1",), text_b=("sentence2",), label=("label",))
  tfds_text = ("sentence1", "sentence2")


class Wnli(GlueTask):
  """WNLI: does the sentence with the pronoun replaced follow ("1") or not ("0"). Accuracy."""

  name = "wnli"
  glue_dir = "WNLI"
  columns = Columns(text_a=("sentence1",), text_b=("sentence2",), label=("label",))
  tfds_text = ("sentence1", "sentence2")


TASKS: dict[str, type] = {task.name: task for task in (Cola, Sst2, Mrpc, Stsb, Qqp, Mnli, Qnli, Rte, Wnli)}


def make_task(name: str, data_dir: str = "", tfds_name: str = "", tfds_data_dir: str = "") -> GlueTask:
  """The GLUE task `name` (e.g. "mrpc"; "SST-2" and "STS-B" spellings too) reading `data_dir` or TFDS."""
  key = name.lower().replace("-", "")
  if key not in TASKS:
    raise ValueError(f"Unknown GLUE task {name!r}; expected one of {sorted(TASKS)}.")
  return TASKS[key](data_dir=data_dir, tfds_name=tfds_name, tfds_data_dir=tfds_data_dir)
