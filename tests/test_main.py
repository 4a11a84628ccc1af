"""End to end: `python -m bert_jax.main` as a user runs it, stopped by SIGTERM and resumed by the same command."""

import errno
import itertools
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from etils import epath

from bert_jax import console, jobs
from bert_jax.data.tokenizer import file_sha256
from bert_jax.handoff import export, pretrained
from bert_jax.workdir import checkpoints as checkpoints_lib
from bert_jax.workdir import reading

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHRINK = [
  "--config.num_train_steps=40",
  "--config.log_every_steps=5",
  "--config.checkpoint_every_steps=1000",
  "--config.eval_every_steps=1000",
  "--config.eval_steps=1",
  "--config.warmup_steps=4",
]


def _command(workdir) -> list[str]:
  return [sys.executable, "-m", "bert_jax.main", "--config=configs/tiny.py", f"--workdir={workdir}", *SHRINK]


# XLA's CPU backend compiling as in pytest's processes (tests/conftest.py), for a subprocess whose compiles are the
# cost and whose speed and memory figures are not what its test checks.
FAST_COMPILES = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"


def _env() -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
  env.pop("XLA_FLAGS", None)  # One device, as on a laptop.
  return env


def _final_params(workdir, step: int) -> dict:
  restored = ocp.StandardCheckpointer().restore(epath.Path(workdir) / "checkpoints" / str(step) / "params")
  return jax.tree.map(np.asarray, restored)


def _wait_for(path: pathlib.Path, process: subprocess.Popen, seconds: float = 120) -> None:
  deadline = time.monotonic() + seconds
  while not path.exists():
    assert process.poll() is None and time.monotonic() < deadline, f"{path} never appeared"
    time.sleep(0.2)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, gcs_bucket) -> dict:
  """The quick start as a user runs it on a fresh local workdir, and beside it the same run with its workdir on
  (emulated) GCS, stopped by SIGTERM at step 10 and resumed by the same command."""
  whole = tmp_path_factory.mktemp("main") / "whole"
  whole_process = subprocess.Popen(
    _command(whole), cwd=ROOT, env=_env(), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
  )
  # The GCS run reads the corpus and tokenizer the local one prepares (TFRecords are written by TensorFlow, whose
  # GCS client cannot reach an emulator); everything it writes goes to gs://.
  _wait_for(whole / "prepared" / "manifest.json", whole_process)
  # A second run on the live workdir (a typo'd relaunch) is refused before it writes anything.
  second = subprocess.Popen(_command(whole), cwd=ROOT, env=_env(), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
  interrupted = f"{gcs_bucket}/interrupted"
  command = _command(interrupted) + [
    "--config.profile.start_step=3",  # A trace of steps 3-4, in the first launch only.
    "--config.profile.num_steps=2",
    "--config.data.embedded_corpus=",
    f"--config.tokenizer.path={whole / 'tokenizer' / 'spm.model'}",
    f"--config.data.prepared_dir={whole / 'prepared'}",
  ]
  with subprocess.Popen(
    command, cwd=ROOT, env=_env(), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
  ) as process:
    lines = []
    for line in process.stderr:
      lines.append(line)
      if "step 10/40" in line:
        process.send_signal(signal.SIGTERM)
        break
    lines += process.stderr.readlines()
    assert process.wait(timeout=120) == 0, "".join(lines)[-3000:]
  second_log = second.communicate(timeout=300)[1].decode()
  _, log = whole_process.communicate(timeout=300)
  assert whole_process.returncode == 0, log[-3000:]
  stopped = [line for line in lines if "Stopped at step" in line]
  assert stopped, "".join(lines)[-3000:]
  stopped_step = int(stopped[0].split("Stopped at step ")[1].split()[0])
  checkpoints = sorted(p.name for p in (epath.Path(interrupted) / "checkpoints").iterdir())
  # Resumed with everything the libraries print, and absl's full log in files.
  log_dir = tmp_path_factory.mktemp("logs")
  resumed = subprocess.run(
    command + ["--verbose", f"--log_dir={log_dir}"], cwd=ROOT, env=_env(), capture_output=True, text=True
  )
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  return dict(
    whole=whole,
    log=log,
    interrupted_log="".join(lines),
    interrupted=interrupted,
    stopped_step=stopped_step,
    checkpoints=checkpoints,
    resumed=resumed,
    log_dir=log_dir,
    second=(second.returncode, second_log, whole_process.pid),
  )


@pytest.mark.slow
def test_a_second_run_on_a_live_workdir_is_refused_naming_the_holder(runs):
  returncode, log, holder = runs["second"]
  assert returncode == 1, log[-3000:]
  assert "The workdir is in use" in log and f"pid {holder}" in log, log[-3000:]
  assert "Traceback" not in log
  assert sorted(os.listdir(runs["whole"] / "checkpoints")) == ["40"]  # The first run finished undisturbed.
  assert not (runs["whole"] / "LEASE").exists()  # Given back when it ended.


# A run of seconds: configs/tiny.py on synthetic batches at conftest.py's small_config sizes, a save every step.
SMALL_RUN_STEPS = 10
SMALL_RUN = [
  "--config.data.source=synthetic",
  "--config.model.vocab_size=101",
  "--config.model.hidden_size=32",
  "--config.model.num_heads=4",
  "--config.model.intermediate_size=48",
  "--config.data.max_seq_length=32",
  "--config.data.max_predictions_per_seq=5",
  "--config.batch_size=8",
  f"--config.num_train_steps={SMALL_RUN_STEPS}",
  "--config.warmup_steps=2",
  "--config.log_every_steps=1",
  "--config.checkpoint_every_steps=1",
  f"--config.keep_checkpoints={SMALL_RUN_STEPS}",
  "--config.eval_every_steps=1000",
  "--config.eval_steps=1",
]


def _in_flight(directory: pathlib.Path) -> str | None:
  """A step's temporary directory in `directory` whose items are still being written (an item's own temporary is
  still inside it: the save has not reached its commit, where the lease is checked), or None."""
  suffix = ocp.path.atomicity.TMP_DIR_SUFFIX
  try:
    for name in os.listdir(directory):
      if suffix in name and any(suffix in item for item in os.listdir(directory / name)):
        return name
  except FileNotFoundError:  # Not created yet, or committed (renamed) while it was listed.
    pass
  return None


@pytest.mark.slow
def test_a_run_stopped_mid_save_and_taken_over_commits_nothing_when_woken_and_exits_with_one_line(tmp_path):
  """A run frozen (SIGSTOP) mid-save past its `lease_timeout_seconds`; a second run on the workdir takes the lease
  over and saves the step the first had in flight; the first is woken (SIGCONT). The first commits nothing and
  exits 1 with one line; every step committed after the takeover is the second run's (its config records its own
  lease timeout), each whole and verified; the second finishes."""
  workdir, env = tmp_path / "run", dict(_env(), XLA_FLAGS=FAST_COMPILES)
  directory = workdir / "checkpoints"
  logs = {name: tmp_path / f"{name}.log" for name in ("first", "second")}  # Files: a pipe nobody reads fills up.

  def launch(name: str, lease_timeout: float) -> subprocess.Popen:
    command = [*_command(workdir), *SMALL_RUN, f"--config.lease_timeout_seconds={lease_timeout}"]
    with open(logs[name], "w") as log:
      return subprocess.Popen(command, cwd=ROOT, env=env, stderr=log, stdout=subprocess.DEVNULL)

  first = launch("first", 2.0)
  while True:  # Stopped during a save after one was committed, before that save's commit.
    assert first.poll() is None, logs["first"].read_text()[-3000:]
    if checkpoints_lib.committed_steps(directory) and _in_flight(directory):
      first.send_signal(signal.SIGSTOP)
      time.sleep(0.05)
      in_flight = _in_flight(directory)
      if in_flight:
        break
      first.send_signal(signal.SIGCONT)
    time.sleep(0.005)
  committed = checkpoints_lib.committed_steps(directory)
  step = int(in_flight.split(".")[0])
  assert step == committed[-1] + 1, (in_flight, committed)
  time.sleep(3.2)  # Past both runs' lease timeouts: the first's heartbeat stopped with it.
  second = launch("second", 3.0)
  while f"step {step}/{SMALL_RUN_STEPS} |" not in logs["second"].read_text():  # It saves step `step` next.
    assert second.poll() is None, logs["second"].read_text()[-3000:]
    time.sleep(0.05)
  first.send_signal(signal.SIGCONT)
  assert first.wait(timeout=120) == 1
  assert second.wait(timeout=300) == 0, logs["second"].read_text()[-3000:]

  first_log, second_log = logs["first"].read_text(), logs["second"].read_text()
  last = first_log.strip().splitlines()[-1]
  line = rf"ERROR The lease of {workdir} was taken over by run \w+ \(generation 2, .+\) at [\d\-T:]+ while this run "
  assert re.search(line + r"was stopped; this run writes nothing more and exits\.$", last), first_log[-3000:]
  assert first_log.count("The lease of ") == 1 and "Traceback" not in first_log, first_log[-3000:]
  assert "Taking over the lease" in second_log and "(stale)" in second_log
  assert f"Resumed from step {committed[-1]}" in second_log
  assert f"Training finished at step {SMALL_RUN_STEPS}" in second_log
  steps = checkpoints_lib.committed_steps(directory)
  assert steps == list(range(1, SMALL_RUN_STEPS + 1)), os.listdir(directory)
  reader = checkpoints_lib.read_only_manager(str(workdir))
  one_device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  for saved in steps:  # Every item there and matching the step's checksums; the runs told apart by their configs.
    assert reading.items(reader, saved) == {"params", "optimizer", "data", "config", "history", "checksums"}
    assert reading.read_data_position(reader, saved)["step"] == saved
    assert reading.read_history(reader, saved)["train"]["step"] == saved
    assert reading.read_config(reader, saved)["lease_timeout_seconds"] == (2.0 if saved <= committed[-1] else 3.0)
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), _final_params(workdir, saved))
    reading.restore_params(reader, saved, abstract, jax.tree.map(lambda _: one_device, abstract))
  assert not (workdir / "LEASE").exists()  # The second gave it back; the first never wrote it again.


def _limit_file_size():
  import resource

  # Above the input pipeline's state (~1.16 MB, written by the main thread before the background save). Orbax's
  # OCDBT data files hold the parameters and optimizer state (~5.6 MB) in 2 to 4 files, split by the writes'
  # timing; the largest file of a save measured 1.35 to 2.24 MB, so most saves have one over this, and fail.
  limit = 1_400_000
  resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


@pytest.mark.slow
def test_a_moved_workdir_resumes_and_a_failed_save_stops_the_run_with_one_line(runs, tmp_path):
  moved = tmp_path / "moved"
  shutil.copytree(runs["whole"], moved)
  link = tmp_path / "link"
  link.symlink_to(moved)  # Moved, copied, and reached through a symlink.
  command = _command(link) + [
    "--config.num_train_steps=60",
    "--config.checkpoint_every_steps=2",
    "--config.log_every_steps=1",
  ]
  # The disk refuses the checkpoint's data files (EFBIG, as a full disk refuses with ENOSPC) in the background save.
  result = subprocess.run(command, cwd=ROOT, env=_env(), capture_output=True, text=True, preexec_fn=_limit_file_size)
  log = result.stderr
  assert result.returncode == 1, log[-3000:]
  assert "Resumed from step 40" in log and "Restored the input pipeline's state" in log, log[-3000:]
  last = log.strip().splitlines()[-1]  # The one line that says what failed, last, with no traceback around it.
  assert "Saving checkpoint step " in last and str(link / "checkpoints") in last and "File too large" in last, last
  assert "Traceback" not in log, log[-5000:]
  failed = int(last.split("Saving checkpoint step ")[1].split()[0])
  steps = [int(line.split("step ")[1].split("/")[0]) for line in log.splitlines() if "/60 | loss" in line]
  # The first save that fails (which one depends on how its files were split) stops the run before the next save,
  # which a save before step 58 always has.
  assert failed in range(42, 58, 2) and max(steps) <= failed + 2, (failed, steps)
  # The failed step's temporary is never read; the steps saved before it stay.
  assert checkpoints_lib.committed_steps(moved / "checkpoints") == list(range(40, failed, 2))


@pytest.mark.slow
def test_sigterm_checkpoints_and_the_same_command_resumes_exactly(runs):
  log = runs["log"]
  assert "step 40/40 | loss" in log and "tok/s" in log and "ETA" in log
  assert "eval at step 40" in log
  # Real text through the real pipeline: the model learns.
  steps = [line.split("| ") for line in log.splitlines() if "/40 | loss" in line]  # The progress lines.
  mlm_loss = [float(fields[2].split()[1]) for fields in steps]
  mlm_accuracy = [float(fields[3].split()[1]) for fields in steps]
  assert mlm_loss[-1] < mlm_loss[0] - 0.5 and mlm_accuracy[-1] > mlm_accuracy[0], (mlm_loss, mlm_accuracy)
  # The unigram baseline of the held-out split, in the header and beside the MLM metrics of every line.
  assert log.count("  baseline  unigram MLM loss ") == 1 and all(" (unigram " in "|".join(fields) for fields in steps)
  assert os.listdir(runs["whole"] / "tensorboard" / "train")

  stopped_step = runs["stopped_step"]
  assert 10 <= stopped_step < 40
  assert runs["checkpoints"] == [str(stopped_step)]  # One committed step on GCS, nothing else.
  resumed = runs["resumed"].stderr
  assert f"Resumed from step {stopped_step}" in resumed
  assert "Restored the input pipeline's state" in resumed  # Not a replay: the state went to gs:// and back.
  interrupted = epath.Path(runs["interrupted"])
  assert list((interrupted / "tensorboard" / "train").iterdir())  # Event files reach gs:// too.
  jax.tree.map(np.testing.assert_array_equal, _final_params(interrupted, 40), _final_params(runs["whole"], 40))


def _block(log: str, title: str) -> str:
  """The rows of the block `title` (the indented lines after its timed line)."""
  after = log.split(f" {title}\n", 1)[1].splitlines()
  return "\n".join(itertools.takewhile(lambda line: line.startswith("  "), after))


@pytest.mark.slow
def test_the_console_shows_a_header_progress_lines_and_a_summary_and_leaves_library_noise_out(runs):
  """The quick start's console as a user sees it: bert_jax's own lines (time, message), a header before the first
  step and a summary after the last, and none of the known start-up and per-checkpoint lines of TensorFlow, XLA,
  JAX and Orbax. `--verbose` shows those again, and `--log_dir` keeps absl's full log in a file."""
  log, whole = runs["log"], runs["whole"]
  lines = log.splitlines()
  assert all(re.match(r"\d\d:\d\d:\d\d \S", line) or line.startswith("         ") for line in lines), log
  assert not any(console.native_noise(line) for line in lines), log
  noises = (
    "Sharding callback duration",
    "Unable to initialize backend",
    "Orbax",
    "absl::InitializeLog",
    "Type handler",
  )
  for noise in noises:
    assert noise not in log, noise
  header = _block(log, "Pretraining")
  for row in (
    "model     BERT L2 H128 A2",
    "devices   1 x cpu",
    "data      python_docs (embedded), ",
    "masking   15% of tokens (10 of a full 64-token sequence), token by token; 80% [MASK], 10% random, 10% unchanged",
    f"workdir   {whole}",
    "start     step 0: a new run from seed 0",
  ):
    assert row in header, (row, header)
  assert log.index(" Pretraining\n") < log.index(" step 5/40 | ")
  summary = _block(log, "Training finished at step 40")
  assert f"checkpoint   {whole / 'checkpoints' / '40'}" in summary and f"--logdir {whole / 'tensorboard'}" in summary
  assert re.search(r"steps +40 this launch \(from step 0\), [\d,]+ tokens in 39 timed steps", summary), summary
  assert re.search(r"eval +step 40 \| mlm_loss [\d.]+ \(unigram [\d.]+\) \| mlm_acc", summary), summary
  # The stopped launch ends with its own summary; the verbose resumed one shows the libraries' lines again.
  assert f" Stopped at step {runs['stopped_step']}\n" in runs["interrupted_log"]
  verbose = runs["resumed"].stderr
  assert "Sharding callback duration" in verbose and any(map(console.native_noise, verbose.splitlines()))
  assert re.search(r"^I\d{4} [\d:.]+ +\d+ loop.py:\d+\] Pretraining$", verbose, re.M), verbose[-3000:]
  (log_file,) = runs["log_dir"].iterdir()
  assert re.search(
    rf"^I\d{{4}} .*\] Pretraining\n.*start +Resumed from step {runs['stopped_step']} ",
    log_file.read_text(),
    re.M | re.S,
  )


@pytest.mark.slow
def test_a_profile_of_the_asked_steps_lands_in_the_tensorboard_directory_on_gcs(runs):
  """--config.profile.start_step/num_steps: one jax.profiler trace (XSpace, what TensorBoard's Profile tab reads)
  under <workdir>/tensorboard/plugins/profile/, copied to gs:// from a local directory; it holds the train step's
  XLA operations. The resumed launch, past step 3, traces nothing."""
  from tensorflow.tsl.profiler.protobuf import xplane_pb2

  traces = list((epath.Path(runs["interrupted"]) / "tensorboard" / "plugins" / "profile").glob("*/*.xplane.pb"))
  assert len(traces) == 1, traces
  space = xplane_pb2.XSpace.FromString(traces[0].read_bytes())
  names = {event.name for plane in space.planes for event in plane.event_metadata.values()}
  assert any(name.startswith("PjitFunction") for name in names) and any("fusion" in name for name in names), names
  assert "Profile of steps 3-4 written to " in runs["interrupted_log"]
  assert "Profile of steps" not in runs["resumed"].stderr


@pytest.mark.slow
def test_a_run_on_gcs_exports_a_bundle_and_hugging_face_files_to_gcs_that_load_back(runs, gcs_bucket):
  bundle = f"{gcs_bucket}/bert-tiny-v1"
  result = subprocess.run(
    _command(runs["interrupted"]) + ["--mode=export", f"--config.export.dir={bundle}"],
    cwd=ROOT,
    env=_env(),
    capture_output=True,
    text=True,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  manifest = export.verify_bundle(bundle)
  assert manifest["source"]["step"] == 40 and manifest["history"]["examples_seen"] == 40 * 32
  expected = _final_params(runs["whole"], 40)
  for source in (bundle, runs["interrupted"]):
    loaded = pretrained.load(source)
    assert loaded.tokenizer.identity()["sha256"] == file_sha256(str(runs["whole"] / "tokenizer" / "spm.model"))
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(loaded.params), expected)

  hugging_face = f"{gcs_bucket}/bert-tiny-hf"
  export.export(bundle, hugging_face, "huggingface")
  with pytest.raises(FileExistsError, match="bert-tiny-hf exists"):
    export.export(bundle, hugging_face, "huggingface")
  export.export(runs["interrupted"], hugging_face, "huggingface", overwrite=True)
  names = sorted(p.name for p in epath.Path(hugging_face).iterdir())
  assert names == ["config.json", "model.safetensors", "special_tokens_map.json", "spm.model", "tokenizer_config.json"]
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(pretrained.load(hugging_face).params), expected)


@pytest.mark.slow
def test_an_unknown_config_key_is_named_before_anything_runs(tmp_path):
  start = time.perf_counter()
  result = subprocess.run(
    [*_command(tmp_path), "--config.model.hiden_size=64"], cwd=ROOT, env=_env(), capture_output=True, text=True
  )
  assert result.returncode != 0
  assert "Unknown config key" in result.stderr and "--config.model.hiden_size" in result.stderr
  assert not (tmp_path / "checkpoints").exists()
  assert time.perf_counter() - start < 60


def test_importing_bert_jax_touches_no_device():
  code = (
    "import bert_jax, bert_jax.main, bert_jax.train.loop, bert_jax.handoff.hf_format; "
    "from jax._src import xla_bridge; assert not xla_bridge.backends_are_initialized(), 'a backend started'"
  )
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(), capture_output=True, text=True)
  assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.parametrize(
  "mode, config, message",
  [
    ("pretrain", "configs/glue.py", "--mode=pretrain, but the config sets finetune.task='mrpc': use --mode=finetune"),
    ("finetune", "configs/tiny.py", "--mode=finetune needs finetune.task"),
  ],
)
@pytest.mark.slow
def test_a_mode_the_config_contradicts_is_named_before_anything_runs(tmp_path, mode, config, message):
  command = [sys.executable, "-m", "bert_jax.main", f"--config={config}", f"--workdir={tmp_path}", f"--mode={mode}"]
  result = subprocess.run(command, cwd=ROOT, env=_env(), capture_output=True, text=True)
  assert result.returncode == 1 and message in result.stderr, result.stderr[-2000:]
  assert not list(tmp_path.iterdir())


def _full_disk(*args):
  """What a write on a full disk raises, with no path (a write to an open file)."""
  raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class _FullFile:
  """An open file on a full disk: each write fails."""

  def __init__(self, fd):
    self._fd = fd

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    os.close(self._fd)

  write = staticmethod(_full_disk)


def _fill_the_disk(where: str, workdir: pathlib.Path, monkeypatch) -> pathlib.Path:
  """Makes the start of a run meet a full disk at `where`; returns the path the run should name."""
  gpath = type(epath.Path(workdir))
  if where in ("lease", "lease taken over"):  # The new LEASE's temporary file is on the full disk.
    from bert_jax.workdir import lease

    if where == "lease taken over":  # An empty LEASE (a run that met a full disk before this fix) is taken over.
      workdir.mkdir()
      (workdir / "LEASE").write_bytes(b"")

    def opened(path, mode="r"):
      return _FullFile(os.open(path, os.O_WRONLY | os.O_CREAT)) if path.endswith(".tmp") else open(path, mode)

    monkeypatch.setattr(lease, "open", opened, raising=False)
    return workdir / "LEASE"
  if where == "checkpoints":
    mkdir = gpath.mkdir
    monkeypatch.setattr(
      gpath, "mkdir", lambda path, *a, **k: _full_disk() if path.name == where else mkdir(path, *a, **k)
    )
    return workdir / "checkpoints"
  if where == "tensorboard":
    from bert_jax.tensorflow_cpu import tf

    def create_file_writer(logdir, *args, **kwargs):
      message = f"{logdir}/events.out.tfevents.1.v2; No space left on device\n\tCreating writable file [Op:Create]"
      raise tf.errors.ResourceExhaustedError(None, None, message)

    monkeypatch.setattr(tf.summary, "create_file_writer", create_file_writer)
    return workdir / "tensorboard" / "train" / "events.out.tfevents.1.v2"
  assert where == "corpus"
  monkeypatch.setattr(gpath, "write_text", _full_disk)
  return workdir / "corpus" / "python_docs.txt"


@pytest.mark.parametrize("where", ["corpus", "lease", "lease taken over", "checkpoints", "tensorboard"])
def test_a_full_disk_at_the_start_of_a_run_ends_with_one_line_naming_the_path(
  small_config, tmp_path, monkeypatch, caplog, where
):
  """Each write before the first step (the embedded corpus, the lease, the checkpoint directory, TensorBoard's
  files) on a full disk: exit 1 with one line naming the path and the cause (was a bare `OSError: [Errno 28] No
  space left on device` after a 38-line traceback), no LEASE or partial file left behind."""
  from bert_jax import main as main_module

  if where == "corpus":
    small_config.data.source = "pretraining"  # configs/tiny.py's embedded corpus, prepared in the workdir.
  workdir = tmp_path / "run"
  named = _fill_the_disk(where, workdir, monkeypatch)

  def exit_now(code):
    raise SystemExit(code)

  monkeypatch.setattr(os, "_exit", exit_now)
  checked = jobs.check(small_config, "pretrain")
  with pytest.raises(SystemExit) as exited:
    main_module._train(small_config, str(workdir), checked)
  assert exited.value.code == 1
  errors = [record.getMessage() for record in caplog.records if record.levelname == "ERROR"]
  assert errors == [f"Cannot write {named}: No space left on device."]
  left = [path for path in workdir.rglob("*") if path.is_file()]  # No LEASE of this run's, nothing cut short.
  assert left == ([workdir / "LEASE"] if where == "lease taken over" else [])
