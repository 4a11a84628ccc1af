"""End to end: `python -m bert_jax.main` as a user runs it, stopped by SIGTERM and resumed by the same command (a run
that cannot go on, a full disk or a lease taken over: tests/test_main_failures.py)."""

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
import pytest
from etils import epath

from bert_jax import console
from bert_jax.data.tokenizer import file_sha256
from bert_jax.handoff import export, pretrained
from bert_jax.workdir import checkpoints as checkpoints_lib
from tests.helpers import ROOT, final_params, main_command, main_env


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
    main_command(whole), cwd=ROOT, env=main_env(), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
  )
  # The GCS run reads the corpus and tokenizer the local one prepares (TFRecords are written by TensorFlow, whose
  # GCS client cannot reach an emulator); everything it writes goes to gs://.
  _wait_for(whole / "prepared" / "manifest.json", whole_process)
  # A second run on the live workdir (a typo'd relaunch) is refused before it writes anything.
  second = subprocess.Popen(
    main_command(whole), cwd=ROOT, env=main_env(), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL
  )
  interrupted = f"{gcs_bucket}/interrupted"
  command = main_command(interrupted) + [
    "--config.profile.start_step=3",  # A trace of steps 3-4, in the first launch only.
    "--config.profile.num_steps=2",
    "--config.data.embedded_corpus=",
    f"--config.tokenizer.path={whole / 'tokenizer' / 'spm.model'}",
    f"--config.data.prepared_dir={whole / 'prepared'}",
  ]
  with subprocess.Popen(
    command, cwd=ROOT, env=main_env(), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
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
    command + ["--verbose", f"--log_dir={log_dir}"], cwd=ROOT, env=main_env(), capture_output=True, text=True
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
  command = main_command(link) + [
    "--config.num_train_steps=60",
    "--config.checkpoint_every_steps=2",
    "--config.log_every_steps=1",
  ]
  # The disk refuses the checkpoint's data files (EFBIG, as a full disk refuses with ENOSPC) in the background save.
  result = subprocess.run(
    command, cwd=ROOT, env=main_env(), capture_output=True, text=True, preexec_fn=_limit_file_size
  )
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
  jax.tree.map(np.testing.assert_array_equal, final_params(interrupted, 40), final_params(runs["whole"], 40))


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
    main_command(runs["interrupted"]) + ["--mode=export", f"--config.export.dir={bundle}"],
    cwd=ROOT,
    env=main_env(),
    capture_output=True,
    text=True,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  manifest = export.verify_bundle(bundle)
  assert manifest["source"]["step"] == 40 and manifest["history"]["examples_seen"] == 40 * 32
  expected = final_params(runs["whole"], 40)
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
def test_an_unknown_config_key_is_named_before_anything_runs_from_outside_the_clone(tmp_path):
  # From another directory, as a launch script may run it: the config file's `from configs import default` finds
  # the installed package (setup.cfg), then the key is named.
  start = time.perf_counter()
  command = [arg.replace("--config=configs/", f"--config={ROOT}/configs/") for arg in main_command(tmp_path / "w")]
  result = subprocess.run(
    [*command, "--config.model.hiden_size=64"], cwd=tmp_path, env=main_env(), capture_output=True, text=True
  )
  assert result.returncode != 0
  assert "Unknown config key" in result.stderr and "--config.model.hiden_size" in result.stderr, result.stderr[-2000:]
  assert not (tmp_path / "w").exists()
  assert time.perf_counter() - start < 60


def test_importing_bert_jax_touches_no_device():
  code = (
    "import bert_jax, bert_jax.main, bert_jax.train.loop, bert_jax.handoff.hf_format; "
    "from jax._src import xla_bridge; assert not xla_bridge.backends_are_initialized(), 'a backend started'"
  )
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=main_env(), capture_output=True, text=True)
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
  result = subprocess.run(command, cwd=ROOT, env=main_env(), capture_output=True, text=True)
  assert result.returncode == 1 and message in result.stderr, result.stderr[-2000:]
  assert not list(tmp_path.iterdir())
