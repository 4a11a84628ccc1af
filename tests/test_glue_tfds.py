"""GLUE tasks read from TensorFlow Datasets (`finetune.tfds_name`; TFDS mocked): every split in the files' order,
TFDS's label ids as GLUE's labels, and the dataset known to a resume by what TFDS records of it."""

from bert_jax.finetune import glue
from bert_jax.finetune.glue import GlueExample


def mock_tfds(rows_by_split: dict[str, dict], requested: list):
  """tfds.testing.mock_data serving `rows_by_split` {TFDS split: feature columns}; records the splits asked."""
  import tensorflow as tf
  import tensorflow_datasets as tfds

  def as_dataset(builder, split, **kwargs):
    requested.append(f"{builder.name}/{builder.builder_config.name}:{split}")
    return tf.data.Dataset.from_tensor_slices(rows_by_split[split])

  return tfds.testing.mock_data(as_dataset_fn=as_dataset)


def tfds_rows(text_features: tuple[str, str], texts: list[tuple[str, str]], labels: list[int], idx: list[int]):
  import tensorflow as tf

  columns = {name: [pair[i].encode() for pair in texts] for i, name in enumerate(text_features)}
  return {**columns, "label": tf.constant(labels, tf.int64), "idx": tf.constant(idx, tf.int32)}


def test_tfds_mrpc_and_mnli_splits(tmp_path):
  requested = []
  mrpc_rows = {
    "train": tfds_rows(("sentence1", "sentence2"), [("b1", "b2"), ("a1", "a2")], [0, 1], [9, 3]),
    "validation": tfds_rows(("sentence1", "sentence2"), [("c1", "c2")], [1], [0]),
    "test": tfds_rows(("sentence1", "sentence2"), [("d1", "d2")], [-1], [0]),
  }
  with mock_tfds(mrpc_rows, requested):
    mrpc = glue.make_task("mrpc", tfds_name="glue/mrpc", tfds_data_dir=str(tmp_path))
    # In the files' order (idx), whatever order TFDS stored them in.
    assert mrpc.read("train") == [GlueExample("3", "a1", "a2", "1"), GlueExample("9", "b1", "b2", "0")]
    assert mrpc.read("dev") == [GlueExample("0", "c1", "c2", "1")]
    assert mrpc.read("test") == [GlueExample("0", "d1", "d2", None)]
    # A resume knows the dataset by what TFDS records of it (name, version, sources, splits), not by its files.
    assert mrpc.content()["tfds"].startswith("glue/mrpc/") and len(mrpc.content()["sha256"]) == 64
  assert requested == ["glue/mrpc:train", "glue/mrpc:validation", "glue/mrpc:test"]

  requested.clear()
  # TFDS's MNLI classes are entailment, neutral, contradiction (ids 0, 1, 2).
  pairs = [("p1", "h1"), ("p2", "h2"), ("p3", "h3")]
  mnli_rows = {
    split: tfds_rows(("premise", "hypothesis"), pairs, labels, [0, 1, 2])
    for split, labels in [
      ("train", [0, 1, 2]),
      ("validation_matched", [2, 2, 0]),
      ("validation_mismatched", [1, 0, 1]),
      ("test_matched", [-1, -1, -1]),
      ("test_mismatched", [-1, -1, -1]),
    ]
  }
  with mock_tfds(mnli_rows, requested):
    mnli = glue.make_task("mnli", tfds_name="glue/mnli")
    assert [e.label for e in mnli.read("train")] == ["entailment", "neutral", "contradiction"]
    assert [e.label for e in mnli.read("dev_matched")] == ["contradiction", "contradiction", "entailment"]
    assert [e.label for e in mnli.read("dev_mismatched")] == ["neutral", "entailment", "neutral"]
    assert mnli.read("test_matched")[0] == GlueExample("0", "p1", "h1", None)
    assert [e.label for e in mnli.read("test_mismatched")] == [None] * 3
  assert requested == [
    "glue/mnli:train",
    "glue/mnli:validation_matched",
    "glue/mnli:validation_mismatched",
    "glue/mnli:test_matched",
    "glue/mnli:test_mismatched",
  ]
