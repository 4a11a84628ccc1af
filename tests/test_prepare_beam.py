"""Corpus preparation on Apache Beam (data/prepare_beam.py): the local runner writes the local preparer's corpus byte
for byte, from text files, from Parquet read from gs:// and from a TFDS dataset TFDS itself builds with Beam (a saved
dataset and JSONL read from gs:// as locally); a failed run, run again, and a shard written twice by concurrent workers
change nothing; bad runner settings are refused before any work."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow_datasets as tfds
from etils import epath

from bert_jax import paths
from bert_jax.data import beam_options, prepare, readers, shards, text, vocabulary
from bert_jax.data.manifest import MANIFEST, read_manifest

VOCAB = "[PAD] [UNK] [CLS] [SEP] [MASK] the a of and to in is was it on for with as by at".split()
VOCAB += [f"word{i}" for i in range(60)] + [f"topic{i}" for i in range(7)] + [".", ",", "document", "line", "second"]
# Beam's local runner in this process (no worker processes: monkeypatched faults reach it).
IN_PROCESS = "--direct_running_mode=in_memory"


def _document(i: int) -> str:
  return f"The document word{i % 60} is on topic{i % 7} .\nIt was the second line of word{(i * 7) % 60} .\n\n"


@pytest.fixture(scope="module")
def tokenizer_args(tmp_path_factory):
  path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
  path.write_text("\n".join(VOCAB) + "\n")
  return dict(kind="wordpiece", path=str(path), lower_case=True)


@pytest.fixture
def text_input(tmp_path):
  """Three files in BERT's format, cut into 2, 4 and 6 units of 4,096 bytes: 12 shards."""
  (tmp_path / "in").mkdir()
  for k, documents in enumerate((100, 200, 300)):
    (tmp_path / "in" / f"part{k}.txt").write_text("".join(_document(k * 1000 + i) for i in range(documents)))
  return str(tmp_path / "in" / "*.txt")


def _files(directory, suffix: str = "") -> dict[str, bytes]:
  return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory)) if name.endswith(suffix)}


@pytest.mark.slow
def test_beam_s_local_runner_writes_the_local_preparer_s_corpus_byte_for_byte(
  tmp_path, tokenizer_args, data_config, text_input, gcs_bucket
):
  """Worker processes, as a user's `--config.data.prepare_runner=beam` starts them: every file the same bytes, the
  manifest included, so a run cannot tell the corpora apart. From gs:// to gs:// (the workers read and write the
  bucket): the same shards. No hold-out minimum: moving documents to the evaluation split at the commit reads a
  shard through TensorFlow's gs:// file system, as the training pipeline does, which the GCS emulator cannot serve."""
  settings = dict(input_pattern=text_input, prepare_unit_bytes=4096, eval_min_documents=0)
  local = prepare.prepare(data_config(**settings), tokenizer_args, str(tmp_path / "local"), 2)
  config = data_config(**settings, prepare_runner="beam", beam_options="")
  on_beam = prepare.prepare(config, tokenizer_args, str(tmp_path / "beam"))
  assert len(on_beam["shards"]) == 12 and on_beam["documents"] + on_beam["eval_documents"] == 600
  assert on_beam == local
  assert _files(tmp_path / "beam") == _files(tmp_path / "local")
  paths.copy_tree(tmp_path / "in", f"{gcs_bucket}/beam_in")
  config.update(input_pattern=f"{gcs_bucket}/beam_in/*.txt")
  in_bucket = prepare.prepare(config, tokenizer_args, f"{gcs_bucket}/beam_out")
  assert in_bucket["shards"] == local["shards"] and in_bucket["eval_shards"] == local["eval_shards"]
  for shard in local["shards"]:
    assert (
      epath.Path(f"{gcs_bucket}/beam_out", shard["file"]).read_bytes()
      == (tmp_path / "local" / shard["file"]).read_bytes()
    )
  assert not [path.name for path in epath.Path(f"{gcs_bucket}/beam_out").iterdir() if ".tmp" in path.name]
  # Records (data/records.py): a Parquet file of 12 row groups in several units, read by Beam's workers from gs://,
  # gives the local preparer's corpus from a local copy; the manifests differ only in where the input was.
  table = pa.table({"id": list(range(600)), "text": [_document(i) for i in range(600)]})
  pq.write_table(table, tmp_path / "in.parquet", row_group_size=50)
  epath.Path(tmp_path / "in.parquet").copy(epath.Path(f"{gcs_bucket}/beam_in/in.parquet"))
  records = dict(settings, input_format="parquet", input_pattern=str(tmp_path / "in.parquet"))
  local = prepare.prepare(data_config(**records), tokenizer_args, str(tmp_path / "parquet_local"), 2)
  config = data_config(**records, prepare_runner="beam")
  config.input_pattern = f"{gcs_bucket}/beam_in/in.parquet"
  on_beam = prepare.prepare(config, tokenizer_args, str(tmp_path / "parquet_beam"))
  assert len(local["shards"]) > 1 and local["documents"] + local["eval_documents"] == 600
  assert on_beam["input"]["files"][0]["path"] == f"{gcs_bucket}/beam_in/in.parquet"
  on_beam["input"]["files"][0]["path"] = str(tmp_path / "in.parquet")
  assert on_beam == local
  assert _files(tmp_path / "parquet_beam", ".tfrecord") == _files(tmp_path / "parquet_local", ".tfrecord")
  # A dataset saved to disk (its state.json and data files) and JSONL read from the bucket as from here.
  datasets.Dataset(table).save_to_disk(str(tmp_path / "saved"), num_shards=2)
  paths.copy_tree(tmp_path / "saved", f"{gcs_bucket}/beam_in/saved")
  paths.write_text(f"{gcs_bucket}/beam_in/in.jsonl", "".join(json.dumps(row) + "\n" for row in table.to_pylist()))

  def sentences(pattern: str, input_format: str) -> list[str]:
    return list(vocabulary.corpus_texts(data_config(input_pattern=pattern, input_format=input_format), False))

  expected = sentences(str(tmp_path / "in.parquet"), "parquet")
  assert len(expected) == 1200
  assert sentences(f"{gcs_bucket}/beam_in/saved", "arrow") == expected
  assert sentences(f"{gcs_bucket}/beam_in/in.jsonl", "jsonl") == expected


@pytest.mark.slow  # Starts a Beam pipeline.
def test_a_failed_run_run_again_writes_the_rest_and_the_same_corpus(
  tmp_path, tokenizer_args, data_config, text_input, monkeypatch
):
  """A unit whose worker fails fails the pipeline: no manifest, so nothing reads the shards written; the same
  command again keeps those shards (not rewritten) and writes the others, giving the local preparer's corpus."""
  # No hold-out minimum: it would rewrite shards at the commit (`shards.hold_out_minimum`), to be seen kept here.
  settings = dict(input_pattern=text_input, prepare_unit_bytes=4096, eval_min_documents=0)
  prepare.prepare(data_config(**settings), tokenizer_args, str(tmp_path / "a"))
  read = text.unit_documents

  def failing(unit, counts):
    if unit["path"].endswith("part2.txt") and unit["index"] == 3:
      yield from list(read(unit, counts))[:5]
      raise OSError("worker lost")
    yield from read(unit, counts)

  config = data_config(**settings, prepare_runner="beam", beam_options=IN_PROCESS)
  monkeypatch.setattr(text, "unit_documents", failing)
  with pytest.raises(Exception, match="worker lost"):
    prepare.prepare(config, tokenizer_args, str(tmp_path / "b"))
  assert not (tmp_path / "b" / MANIFEST).exists()
  assert not (tmp_path / "b" / "documents-00009-of-00012.tfrecord").exists()  # part2's fourth unit.
  assert not [name for name in os.listdir(tmp_path / "b") if ".tmp" in name]  # A failed write leaves nothing.
  written = {name: (tmp_path / "b" / name).stat().st_mtime_ns for name in os.listdir(tmp_path / "b")}
  # Those written before the pipeline stopped: a shard, its evaluation shard and its statistics each.
  assert len(written) % 3 == 0 and 0 < len(written) < 3 * 12
  monkeypatch.setattr(text, "unit_documents", read)
  (tmp_path / "b" / "documents-00009-of-00012.tfrecord.tmp-0a1b2c").write_bytes(b"part")  # As a killed worker leaves.
  prepare.prepare(config, tokenizer_args, str(tmp_path / "b"))
  assert all((tmp_path / "b" / name).stat().st_mtime_ns == when for name, when in written.items())
  assert _files(tmp_path / "b") == _files(tmp_path / "a")


def test_a_shard_written_by_two_workers_at_once_is_whole_and_the_same(tmp_path, tokenizer_args, data_config):
  """A runner may run a unit twice at the same time (Dataflow duplicates a slow bundle): each writer stages under a
  name of its own and renames it into place, so the shard is the one either would write, and no staged file stays."""
  (tmp_path / "in.txt").write_text("".join(_document(i) for i in range(400)))
  units, _ = prepare.work_units(data_config(input_pattern=str(tmp_path / "in.txt")), "sha")
  prepare.place(units, str(tmp_path / "out"))
  (tmp_path / "out").mkdir()
  shards.init_worker(tokenizer_args)
  alone = shards.write_shard(dict(units[0], output=str(tmp_path / "alone.tfrecord"), file="alone.tfrecord"))
  shards.init_worker(tokenizer_args, concurrent=True)
  results = []
  writers = [threading.Thread(target=lambda: results.append(shards.write_shard(units[0]))) for _ in range(2)]
  try:
    for writer in writers:
      writer.start()
    for writer in writers:
      writer.join()
  finally:
    shards.init_worker(tokenizer_args)
  assert len(results) == 2 and all(result["bytes"] == alone["bytes"] for result in results)
  assert (tmp_path / "out" / units[0]["file"]).read_bytes() == (tmp_path / "alone.tfrecord").read_bytes()
  assert sorted(os.listdir(tmp_path / "out")) == sorted(
    [units[0]["file"], units[0]["file"] + ".stats.json", shards.eval_file(units[0]["file"])]
  )


@pytest.mark.parametrize(
  "settings, message",
  [
    (dict(prepare_runner="dataflow"), r"data.prepare_runner='dataflow'; expected one of \('local', 'beam'\)"),
    (dict(prepare_runner="beam", beam_options="--runer=DataflowRunner"), r"Beam knows no option --runer"),
    (dict(prepare_runner="beam", beam_options="--runner=NoSuchRunner"), r"runner 'NoSuchRunner', which Beam cannot"),
    (dict(prepare_runner="beam", beam_options="--project='unclosed"), r"is not a list of command-line flags"),
  ],
)
def test_bad_runner_settings_are_named_before_any_work(
  tmp_path, tokenizer_args, data_config, text_input, settings, message
):
  with pytest.raises(ValueError, match=message):
    prepare.prepare(data_config(input_pattern=text_input, **settings), tokenizer_args, str(tmp_path / "out"))
  assert not (tmp_path / "out").exists()


def test_a_runner_that_cannot_start_is_one_line_naming_the_beam_options_and_leaves_nothing(
  tmp_path, tokenizer_args, data_config, text_input
):
  """FlinkRunner without network (its job server jar cannot be fetched) printed 214 lines and 7 tracebacks, never
  naming data.beam_options, and left an empty prepared directory. Here Flink's job server is a jar that does not
  exist, which fails the same way at once, with or without network."""
  flags = f"--runner=FlinkRunner --flink_job_server_jar={tmp_path / 'missing.jar'}"
  config = data_config(input_pattern=text_input, prepare_runner="beam", beam_options=flags)
  with pytest.raises(beam_options.BeamPipelineError) as raised:
    prepare.prepare(config, tokenizer_args, str(tmp_path / "out"))
  message = str(raised.value)
  assert message.startswith(f"The Beam pipeline on FlinkRunner (data.beam_options={flags!r}) failed: "), message
  assert "\n" not in message and "missing.jar" in message, message
  assert not (tmp_path / "out").exists()


class BeamTextCorpus(tfds.core.GeneratorBasedBuilder):
  """A TFDS dataset built with Apache Beam, as Wikipedia's is: `_generate_examples` returns a Beam transform."""

  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({"text": tfds.features.Text()}))

  def _split_generators(self, dl_manager):
    return {"train": self._generate_examples()}

  def _generate_examples(self):
    beam = tfds.core.lazy_imports.apache_beam
    texts = [_document(i).replace("\n", " ") + f"Another one here . Then word{i % 9} ." for i in range(240)]
    return beam.Create(list(enumerate(texts))) | beam.Map(lambda pair: (pair[0], {"text": pair[1]}))


@pytest.mark.slow
def test_a_tfds_dataset_built_with_beam_is_prepared_on_beam_as_locally(tmp_path, tokenizer_args, data_config):
  """TFDS builds the dataset with the pipeline options (`data.beam_options`) before any shard; Beam's workers, which
  do not know the builder's class, read it from the data directory; the corpus is the local preparer's."""
  settings = dict(tfds_name="beam_text_corpus", tfds_data_dir=str(tmp_path / "tfds"), num_shards=4)
  local = prepare.prepare(data_config(**settings), tokenizer_args, str(tmp_path / "local"), 1)
  assert tfds.builder("beam_text_corpus", data_dir=str(tmp_path / "tfds")).info.splits["train"].num_examples == 240
  on_beam = prepare.prepare(data_config(**settings, prepare_runner="beam"), tokenizer_args, str(tmp_path / "beam"))
  assert on_beam == local and on_beam["documents"] + on_beam["eval_documents"] == 240
  assert _files(tmp_path / "beam") == _files(tmp_path / "local")
  assert read_manifest(str(tmp_path / "beam"))["input"]["tfds"]["name"] == "beam_text_corpus/1.0.0"


def test_pipeline_options_default_to_the_local_runner_with_a_worker_per_core():
  from apache_beam.options.pipeline_options import DirectOptions

  options = beam_options.pipeline_options("")
  assert beam_options.runner_name(options) == "DirectRunner"
  assert options.view_as(DirectOptions).direct_running_mode == "multi_processing"
  assert options.view_as(DirectOptions).direct_num_workers == (os.cpu_count() or 1)
  options = beam_options.pipeline_options("--runner=DataflowRunner --project=p --region=r --num_workers=40")
  assert beam_options.runner_name(options) == "DataflowRunner"
  assert options.get_all_options()["num_workers"] == 40


def test_shards_that_do_not_divide_over_the_run_s_readers_are_refused_or_named(
  tmp_path, tokenizer_args, data_config, text_input, caplog
):
  """A TFDS split's shard count is a setting: one that leaves readers unequal shares is refused before TFDS builds
  anything; files are cut by size (12 shards here), so 8 readers is a warning naming the setting that cuts them."""
  config = data_config(tfds_name="no_such_dataset_is_built", num_shards=12, num_readers=8)
  with pytest.raises(
    ValueError,
    match=r"data.num_shards=12: 12 shards over data.num_readers=8 readers: 4 readers "
    r"read 2 unit\(s\) and 4 read 1, so .* 100% more often. Expected a multiple of data.num_readers "
    r"\(e.g. 8 or 16\)",
  ):
    prepare.prepare(config, tokenizer_args, str(tmp_path / "tfds"))
  manifest = prepare.prepare(
    data_config(input_pattern=text_input, prepare_unit_bytes=4096, num_readers=8), tokenizer_args, str(tmp_path / "f")
  )
  assert len(manifest["shards"]) == 12 and "data.prepare_unit_bytes=4096 sets the count" in caplog.text
  assert readers.uneven_share(16, 8) == readers.uneven_share(4, 8) == ""


@pytest.mark.slow  # Starts a Beam pipeline.
def test_a_vocabulary_sampled_on_beam_is_the_one_sampled_here(tmp_path, data_config, text_input):
  """`--mode=prepare` with a missing vocabulary and `data.prepare_runner=beam`: Beam's workers draw the sample, and
  the vocabulary trained on it is the file the local sample gives, byte for byte."""
  from bert_jax.data import vocabulary
  from configs import default

  written = {}
  for runner in ("local", "beam"):
    config = default.get_config()
    config.model.vocab_size = 120
    config.tokenizer.update(kind="wordpiece", train_max_sentences=50)
    data = data_config(input_pattern=text_input, prepare_unit_bytes=4096, prepare_runner=runner)
    data.beam_options = IN_PROCESS
    vocabulary.train_vocabulary(config, data, str(tmp_path / runner / "vocab.txt"))
    written[runner] = (tmp_path / runner / "vocab.txt").read_bytes()
    assert sorted(os.listdir(tmp_path / runner)) == ["vocab.txt"]  # The staged sample is gone.
  assert written["beam"] == written["local"] and len(written["local"].splitlines()) > 5


@pytest.mark.slow  # Two preparations on Beam's local runner, one of them 30 s with a dead worker.
def test_a_worker_killed_mid_run_ends_the_run_with_one_line_and_the_rerun_resumes(tmp_path, tokenizer_args):
  """The out-of-memory killer's case: a Beam worker process SIGKILLed mid-run hung preparation silently for ever (the
  local runner waits for its bundles). The run now ends within the watch's 30 s with one line naming the worker and
  the rerun, exit 1, no manifest; the same command run again completes, and leaves no staged file."""
  (tmp_path / "in").mkdir()
  for k in range(3):
    (tmp_path / "in" / f"part{k}.txt").write_text("".join(_document(k * 100_000 + i) for i in range(12_000)))
  out = tmp_path / "prepared"
  command = [sys.executable, "-m", "bert_jax.main", "--config=configs/tiny.py", f"--workdir={tmp_path / 'run'}"]
  command += ["--mode=prepare", "--config.data.embedded_corpus=", f"--config.data.input_pattern={tmp_path}/in/*.txt"]
  command += ["--config.tokenizer.kind=wordpiece", f"--config.tokenizer.path={tokenizer_args['path']}"]
  command += [f"--config.data.prepared_dir={out}", "--config.data.prepare_runner=beam"]
  command += ["--config.data.prepare_unit_bytes=32768", "--config.data.beam_options=--direct_num_workers=2"]
  environment = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
  environment.pop("XLA_FLAGS", None)
  root = pathlib.Path(__file__).resolve().parents[1]
  log = tmp_path / "log"
  with log.open("w") as stderr:
    process = subprocess.Popen(command, cwd=root, env=environment, stderr=stderr, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while not (out.exists() and any(name.startswith("documents-") for name in os.listdir(out))):
      assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
      time.sleep(0.2)
    worker = min(beam_options._worker_processes())  # The test's descendants: the run's workers.
    os.kill(worker, signal.SIGKILL)
    killed = time.monotonic()
    returncode = process.wait(timeout=180)
  waited = time.monotonic() - killed
  lines = [line for line in log.read_text().splitlines() if line.strip()]
  assert returncode == 1 and waited < 60, (returncode, waited, lines[-5:])
  assert f"A Beam worker process (pid {worker}) died mid-run" in lines[-1], lines[-5:]
  assert "rerun the same command to resume" in lines[-1] and not (out / MANIFEST).exists()
  assert not beam_options._worker_processes()

  rerun = subprocess.run(command, cwd=root, env=environment, capture_output=True, text=True, timeout=300)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  manifest = json.loads((out / MANIFEST).read_text())
  assert manifest["documents"] + manifest["eval_documents"] == 36_000
  assert not [name for name in os.listdir(out) if ".tmp-" in name]
