"""Record formats of corpus preparation (data/records.py, input_formats.py): JSONL, Parquet and Arrow (a dataset
saved to disk) read record by record in work units that tile each file; the same documents prepared from each format
and from a text file give the same shards, byte for byte; bad records and bad keys refused, naming file:line or the
file and column, before anything is written."""

import json

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from etils import epath

from bert_jax import jobs
from bert_jax.data import prepare, records, vocabulary
from configs import default

VOCAB = "[PAD] [UNK] [CLS] [SEP] [MASK] the a of and to in is was it on for with as by at".split()
VOCAB += [f"word{i}" for i in range(60)] + [f"topic{i}" for i in range(7)] + [".", ",", "document", "line", "second"]


def _sentences(i: int) -> list[str]:
  return [f"The document word{i % 60} is on topic{i % 7}.", f"It was the second line of word{(i * 7) % 60}."]


def _record_text(i: int) -> str:
  """Document i as a record's text: its sentences in one paragraph, every third document in two."""
  first, second = _sentences(i)
  return f"{first}\n\n{second}" if i % 3 == 0 else f"{first} {second}"


@pytest.fixture(scope="module")
def tokenizer_args(tmp_path_factory):
  path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
  path.write_text("\n".join(VOCAB) + "\n")
  return dict(kind="wordpiece", path=str(path), lower_case=True)


def _write_jsonl(path, texts, field="text", extra=()) -> str:
  with open(path, "w", encoding="utf-8") as f:
    for i, text in enumerate(texts):
      f.write(json.dumps({"id": i, field: text}) + "\n")
      if i in extra:
        f.write("\n")  # A blank line: skipped.
  return str(path)


def _write_parquet(path, texts, row_group_size=None, field="text") -> str:
  table = pa.table({"id": list(range(len(texts))), field: texts})
  pq.write_table(table, path, row_group_size=row_group_size)
  return str(path)


def _write_arrow(directory, texts, num_shards=1) -> str:
  datasets.Dataset.from_dict({"id": list(range(len(texts))), "text": texts}).save_to_disk(
    str(directory), num_shards=num_shards
  )
  return str(directory)


def _read(data_config) -> list[str]:
  """Every record's text of `data_config`'s input, unit by unit, as preparation's workers read them."""
  counts = type("Counts", (), dict(text_bytes=0, replaced_bytes=0))()
  texts = []
  for path in records.input_files(data_config):
    size = epath.Path(path).stat().length
    for unit in records.file_units(path, size, data_config):
      texts += records.unit_texts(unit, counts)
  assert counts.text_bytes == sum(len(text.encode()) for text in texts)
  return texts


def test_each_format_reads_its_records_in_order_in_units_that_tile_the_file(tmp_path, data_config):
  texts = [_record_text(i) + " Café ünïcode." * (i % 5) for i in range(300)]
  texts[7] = None  # A null text: an empty record.
  expected = ["" if text is None else text for text in texts]
  jsonl = _write_jsonl(tmp_path / "in.jsonl", texts, extra={3, 4})
  parquet = _write_parquet(tmp_path / "in.parquet", texts, row_group_size=16)
  arrow = _write_arrow(tmp_path / "saved", texts, num_shards=3)
  for pattern, input_format in ((jsonl, "jsonl"), (parquet, "parquet"), (arrow, "arrow")):
    whole = data_config(input_pattern=pattern, input_format=input_format)
    assert _read(whole) == expected, input_format
    cut = data_config(input_pattern=pattern, input_format=input_format, prepare_unit_bytes=1024)
    assert _read(cut) == expected, input_format
  # JSONL units start at line starts: many units, each record in exactly one of them.
  cut.input_format = "jsonl"
  jsonl_units = records.file_units(jsonl, (tmp_path / "in.jsonl").stat().st_size, cut)
  assert len(jsonl_units) > 20
  cut.input_format = "parquet"
  parquet_units = records.file_units(parquet, (tmp_path / "in.parquet").stat().st_size, cut)
  assert len(parquet_units) > 1 and parquet_units[-1]["row_groups"][1] == pq.ParquetFile(parquet).num_row_groups
  # Three data files of the saved dataset, in its order; an .arrow file named directly; Arrow's file format too.
  assert len(records.input_files(data_config(input_pattern=arrow, input_format="arrow"))) == 3
  single = str(tmp_path / "saved" / "data-00001-of-00003.arrow")
  assert records.input_files(data_config(input_pattern=single, input_format="arrow")) == [single]
  with pa.OSFile(str(tmp_path / "file_format.arrow"), "wb") as sink:
    table = pa.table({"text": expected})
    with pa.ipc.new_file(sink, table.schema) as writer:
      writer.write_table(table, max_chunksize=50)
  assert _read(data_config(input_pattern=str(tmp_path / "file_format.arrow"), input_format="arrow")) == expected


def _prepare(data_config, tokenizer_args, output, **keys) -> dict:
  return prepare.prepare(data_config(**keys), tokenizer_args, str(output), 1)


def test_the_same_documents_from_every_format_prepare_into_the_same_shards(tmp_path, tokenizer_args, data_config):
  """A record is a document: JSONL, Parquet and Arrow of the same documents give the shards (and every count of the
  manifest) a text file in BERT's format gives, byte for byte; the manifest records each input and the text field."""
  count = 40
  bert_format = "".join("\n".join(_sentences(i)) + "\n\n" for i in range(count))
  (tmp_path / "in.txt").write_text(bert_format)
  texts = [_record_text(i) for i in range(count)]
  inputs = dict(
    bert=str(tmp_path / "in.txt"),
    jsonl=_write_jsonl(tmp_path / "in.jsonl", texts, extra={5}),
    parquet=_write_parquet(tmp_path / "in.parquet", texts, row_group_size=7),
    arrow=_write_arrow(tmp_path / "saved", texts, num_shards=1),
  )
  manifests, shard_bytes = {}, {}
  for input_format, pattern in inputs.items():
    output = tmp_path / f"out_{input_format}"
    manifests[input_format] = _prepare(
      data_config, tokenizer_args, output, input_pattern=pattern, input_format=input_format
    )
    shard_bytes[input_format] = {path.name: path.read_bytes() for path in sorted(output.glob("*.tfrecord"))}
  assert len(shard_bytes["bert"]) == 2 and manifests["bert"]["documents"] + manifests["bert"]["eval_documents"] == count
  assert "text_field" not in manifests["bert"]["input"]["settings"]  # Text corpora's records stay as they were.
  different = ("input", "text_bytes")
  for input_format in ("jsonl", "parquet", "arrow"):
    assert shard_bytes[input_format] == shard_bytes["bert"], input_format
    manifest = manifests[input_format]
    assert {k: v for k, v in manifest.items() if k not in different} == {
      k: v for k, v in manifests["bert"].items() if k not in different
    }
    assert manifest["input"]["settings"] | dict(input_format="") == dict(
      manifests["bert"]["input"]["settings"], input_format="", text_field="text"
    )
  assert manifests["arrow"]["input"]["files"][0]["path"].endswith("saved/data-00000-of-00001.arrow")
  # A vocabulary is sampled from the same sentences, whatever the format.
  sentences = {
    input_format: list(vocabulary.corpus_texts(data_config(input_pattern=pattern, input_format=input_format), False))
    for input_format, pattern in inputs.items()
  }
  assert sentences["jsonl"] == sentences["parquet"] == sentences["arrow"] == sentences["bert"]
  # The same corpus asked for again is kept.
  assert (
    _prepare(data_config, tokenizer_args, tmp_path / "out_jsonl", input_pattern=inputs["jsonl"], input_format="jsonl")
    == manifests["jsonl"]
  )


def _refused(data_config, tokenizer_args, tmp_path, message: str, **keys) -> None:
  output = tmp_path / "refused"
  with pytest.raises(ValueError, match=message):
    _prepare(data_config, tokenizer_args, output, **keys)
  assert not output.exists()


def test_bad_records_are_refused_naming_the_place_before_anything_is_written(tmp_path, tokenizer_args, data_config):
  texts = [_record_text(i) for i in range(30)]
  good = _write_jsonl(tmp_path / "good.jsonl", texts)
  lines = (tmp_path / "good.jsonl").read_text().splitlines()
  cases = {
    "missing": (
      lines[:20] + ['{"id": 20, "body": "No text field."}'] + lines[20:],
      r"missing.jsonl:21 has no field 'text' \(data.text_field\); it has \['body', 'id'\]",
    ),
    "not_json": (lines[:4] + ["{not json"] + lines[4:], r"not_json.jsonl:5 is not JSON"),
    "number": (
      lines[:2] + ['{"text": 3}'] + lines[2:],
      r"number.jsonl:3: field 'text' \(data.text_field\) holds a int; expected a string",
    ),
    "array": (lines + ["[1, 2]"], r"array.jsonl:31 holds a list; expected a JSON object a line"),
  }
  for name, (content, message) in cases.items():
    # The bad file after a good one: nothing is written for either.
    (tmp_path / name).mkdir()
    (tmp_path / name / "a.jsonl").write_text((tmp_path / "good.jsonl").read_text())
    (tmp_path / name / f"{name}.jsonl").write_text("\n".join(content) + "\n")
    pattern = str(tmp_path / name / "*.jsonl")
    _refused(data_config, tokenizer_args, tmp_path, message, input_pattern=pattern, input_format="jsonl")
  parquet = _write_parquet(tmp_path / "body.parquet", texts, field="body")
  _refused(
    data_config,
    tokenizer_args,
    tmp_path,
    r"body.parquet has no column 'text' \(data.text_field\); its columns: \['id', 'body'\]",
    input_pattern=parquet,
    input_format="parquet",
  )
  _refused(
    data_config,
    tokenizer_args,
    tmp_path,
    r"body.parquet: column 'id' \(data.text_field\) holds int64; expected strings",
    input_pattern=parquet,
    input_format="parquet",
    text_field="id",
  )
  arrow = _write_arrow(tmp_path / "saved", texts)
  _refused(
    data_config,
    tokenizer_args,
    tmp_path,
    r"data-00000-of-00001.arrow has no column 'body' \(data.text_field\); its columns: \['id', 'text'\]",
    input_pattern=arrow,
    input_format="arrow",
    text_field="body",
  )
  datasets.DatasetDict(train=datasets.Dataset.from_dict({"text": texts})).save_to_disk(str(tmp_path / "dict"))
  _refused(
    data_config,
    tokenizer_args,
    tmp_path,
    r"dict is a DatasetDict saved to disk \(splits \['train'\]\); expected one dataset: name a split's directory, "
    r"e.g. .*dict/train",
    input_pattern=str(tmp_path / "dict"),
    input_format="arrow",
  )
  _refused(
    data_config,
    tokenizer_args,
    tmp_path,
    r"dataset_dict.json \(of data.input_pattern\) is neither an .arrow file nor a dataset directory",
    input_pattern=str(tmp_path / "dict" / "*"),
    input_format="arrow",
  )
  (tmp_path / "not_saved").mkdir()
  _refused(
    data_config,
    tokenizer_args,
    tmp_path,
    r"not_saved has no state.json: not a dataset saved by datasets.Dataset.save_to_disk",
    input_pattern=str(tmp_path / "not_saved"),
    input_format="arrow",
  )
  _refused(
    data_config,
    tokenizer_args,
    tmp_path,
    r"data.input_pattern='.*nowhere.jsonl' matches no file",
    input_pattern=str(tmp_path / "nowhere.jsonl"),
    input_format="jsonl",
  )
  assert _prepare(data_config, tokenizer_args, tmp_path / "good", input_pattern=good, input_format="jsonl")["documents"]


@pytest.mark.parametrize(
  "keys, message",
  [
    (
      dict(input_format="csv"),
      r"data.input_format='csv'; expected one of \('bert', 'document', 'jsonl', 'parquet', 'arrow'\)",
    ),
    (dict(input_format="jsonl", text_field=""), r"data.text_field is empty; data.input_format='jsonl' reads"),
    (
      dict(input_format="parquet", tfds_name="wikipedia"),
      r"data.input_format='parquet' reads data.input_pattern's files, and data.tfds_name='wikipedia'",
    ),
  ],
)
def test_bad_format_keys_are_refused_when_the_config_is_checked(keys, message):
  config = default.get_config()
  config.data.update(input_pattern="/corpus/*", **keys)
  with pytest.raises(ValueError, match=message):
    jobs.check(config, "prepare")
