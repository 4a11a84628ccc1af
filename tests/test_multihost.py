"""Two hosts, for real: two `python -m bert_jax.main` processes with 4 CPU devices each, joined by
`jax.distributed.initialize` on localhost, against one process with 8 devices on the same data."""

import glob
import os
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
import tensorflow as tf

from bert_jax import config_checks, jobs, sharding
from bert_jax.data import prepare, sources
from bert_jax.data.corpus import Corpus
from bert_jax.train import loop, pretraining
from bert_jax.workdir import checkpoints, reading
from configs import tiny
from tests.helpers import FAST_COMPILES, ROOT

pytestmark = pytest.mark.slow  # Several hosts: processes joined by jax.distributed on localhost.

HOSTS, WORDS_PER_SHARD = 2, 22


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, data_config):
  """A 4-shard corpus with a 94-piece WordPiece vocabulary; shard s uses only words s*22 .. s*22+21."""
  root = tmp_path_factory.mktemp("multihost_corpus")
  words = [f"w{i}" for i in range(4 * WORDS_PER_SHARD)]
  (root / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *words]) + "\n")
  rng = np.random.default_rng(0)
  for shard in range(4):
    own = words[shard * WORDS_PER_SHARD : (shard + 1) * WORDS_PER_SHARD]
    documents = [
      "\n".join(" ".join(rng.choice(own, rng.integers(4, 12))) + " ." for _ in range(rng.integers(5, 20)))
      for _ in range(20)
    ]
    (root / f"part-{shard}.txt").write_text("\n\n".join(documents) + "\n")
  tokenizer = dict(kind="wordpiece", path=str(root / "vocab.txt"))
  prepare.prepare(data_config(input_pattern=str(root / "part-*.txt")), tokenizer, str(root / "prepared"), 1)
  return root


def _overrides(corpus) -> dict:
  return {
    "model.vocab_size": 101,
    "model.hidden_size": 32,
    "model.num_layers": 2,
    "model.num_heads": 4,
    "model.intermediate_size": 48,
    "model.max_position_embeddings": 40,
    "tokenizer.kind": "wordpiece",
    "tokenizer.path": str(corpus / "vocab.txt"),
    "data.embedded_corpus": "",
    "data.prepared_dir": str(corpus / "prepared"),
    "data.max_seq_length": 32,
    "data.max_predictions_per_seq": 5,
    "data.shuffle_buffer": 100,
    "batch_size": 16,
    "num_train_steps": 10_000,  # Until preempted.
    "warmup_steps": 1,
    "log_every_steps": 1,
    "checkpoint_every_steps": 10_000,
    "eval_steps": 0,
  }


def _config(corpus):
  config = tiny.get_config()
  config.update_from_flattened_dict(_overrides(corpus))
  return config


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


# Process 1 as `python -m bert_jax.main`, held back before it decides whether the workdir has a checkpoint until
# process 0 has created `checkpoints/` (or 60 s pass): the interleaving that crashed a first launch on a fresh workdir.
_DELAYED_MAIN = """
import os, runpy, sys, time
from bert_jax.train import pretraining_start
workdir = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--workdir="))
resolve = pretraining_start.find_origin
def delayed(*args):
  deadline = time.monotonic() + 60
  while not os.path.isdir(os.path.join(workdir, "checkpoints")) and time.monotonic() < deadline:
    time.sleep(0.05)
  print("delayed until checkpoints/ existed:", os.path.isdir(os.path.join(workdir, "checkpoints")), file=sys.stderr)
  return resolve(*args)
pretraining_start.find_origin = delayed
runpy.run_module("bert_jax.main", run_name="__main__", alter_sys=True)
"""


# Process 1 as `python -m bert_jax.main`, noting each time it runs the preparer's shard writer, and failing in the
# batch of step 3 (a Python exception on one host).
_FAILING_MAIN = """
import runpy, sys
from bert_jax.data import prepare
from bert_jax.train import pretraining
write_shards = prepare.write
def noted(*args, **kwargs):
  print("process 1 ran the preparer", file=sys.stderr, flush=True)
  return write_shards(*args, **kwargs)
prepare.write = noted
batch = pretraining.PretrainingJob.batch
def failing(self, step):
  if step == 3:
    raise ValueError("injected failure in the batch of step 3")
  return batch(self, step)
pretraining.PretrainingJob.batch = failing
runpy.run_module("bert_jax.main", run_name="__main__", alter_sys=True)
"""


def _start_two_hosts(corpus, workdir, second=None, overrides=None) -> list[subprocess.Popen]:
  """Processes 0 and 1 of a job on `workdir`; process 1 runs the script `second` if given (else bert_jax.main);
  `overrides` (flattened config keys) replace the corpus's."""
  flags = [f"--config.{key}={value}" for key, value in (overrides or _overrides(corpus)).items()]
  address = f"localhost:{_free_port()}"
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count=4 {FAST_COMPILES}")
  return [
    _spawn(
      [
        *(["-c", second] if second and index == 1 else ["-m", "bert_jax.main"]),
        "--config=configs/tiny.py",
        f"--workdir={workdir}",
        *flags,
        f"--config.distributed.coordinator_address={address}",
        f"--config.distributed.num_processes={HOSTS}",
        f"--config.distributed.process_id={index}",
      ],
      env,
    )
    for index in range(HOSTS)
  ]


def _spawn(arguments: list[str], env: dict) -> subprocess.Popen:
  """`python arguments...` in the repository root, its output captured as text."""
  return subprocess.Popen(
    [sys.executable, *arguments], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
  )


def _finish(process: subprocess.Popen) -> subprocess.CompletedProcess:
  stdout, stderr = process.communicate(timeout=180)
  return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _logged_losses(workdir, wait: bool = False) -> list[float]:
  files = glob.glob(os.path.join(workdir, "tensorboard", "train", "events.*"))
  if wait and not files:
    return []
  assert len(files) == 1, files  # Written by process 0 only.
  losses = {}
  try:
    for event in tf.compat.v1.train.summary_iterator(files[0]):
      for value in event.summary.value:
        if value.tag == "loss":
          losses[event.step] = float(tf.make_ndarray(value.tensor))
  except tf.errors.DataLossError:  # A record being written while the job runs.
    if not wait:
      raise
  return [losses[step] for step in sorted(losses)]


def _first_segment_words(batch) -> np.ndarray:
  """Word ids of segment A (always from the host's own document; B may be a random next sentence from any
  shard), leaving out masked positions (10% of them hold random words)."""
  keep = (batch["segment_ids"] == 0) & (batch["input_mask"] == 1) & (batch["input_ids"] >= 6)
  rows = np.arange(len(keep))[:, None]
  keep[rows, batch["masked_lm_positions"]] &= batch["masked_lm_weights"] == 0
  return batch["input_ids"][keep]


def _preempt_after_two_logged_steps(processes, workdir) -> list[subprocess.CompletedProcess]:
  """A TPU slice's preemption notice: SIGTERM to every host once training is under way."""
  try:
    deadline = time.monotonic() + 240
    while len(_logged_losses(workdir, wait=True)) < 2:
      assert time.monotonic() < deadline and all(p.poll() is None for p in processes), "no training steps logged"
      time.sleep(0.2)
    for process in processes:
      process.send_signal(signal.SIGTERM)
    return [_finish(process) for process in processes]
  finally:
    for process in processes:
      process.kill()


def test_two_hosts_equal_one_host_with_eight_devices_and_stop_together_with_a_checkpoint_one_host_continues(
  prepared, tmp_path, monkeypatch
):
  workdir = str(tmp_path / "two_hosts")
  processes = _start_two_hosts(prepared, workdir, second=_DELAYED_MAIN)
  results = _preempt_after_two_logged_steps(processes, workdir)
  for index, result in enumerate(results):
    assert result.returncode == 0, f"process {index}:\n{result.stderr[-4000:]}"
  assert "delayed until checkpoints/ existed: True" in results[1].stderr  # The interleaving happened, and started.
  assert "process 0 of 2, 4 local / 8 global devices" in results[0].stderr
  # Both stopped at one agreed step, with one checkpoint; each process saved its own pipeline state.
  (stopped,) = os.listdir(os.path.join(workdir, "checkpoints"))
  steps = int(stopped)
  assert 2 <= steps < 10_000 and f"Stopped at step {steps}" in results[0].stderr
  # One data reader per host (data.num_readers=0 at a first launch), each saved by its host.
  assert sorted(os.listdir(os.path.join(workdir, "pipeline_state", stopped))) == ["reader_0", "reader_1"]
  # Progress lines come from process 0 only.
  assert "step 2/10000" in results[0].stderr and "step 2/10000" not in results[1].stderr

  # Each host reads its own half of the corpus: the tokens of its batches come from its own shards.
  config = _config(prepared)
  model_cfg = config_checks.check_pretraining(config)
  data = Corpus(config, workdir, model_cfg)
  hosts = [data.source(0, host=(index, HOSTS)) for index in range(HOSTS)]
  host_batches = [[next(source) for _ in range(steps)] for source in hosts]
  for index, batches in enumerate(host_batches):
    shards = {(int(t) - 6) // WORDS_PER_SHARD for b in batches for t in _first_segment_words(b)}
    assert shards == {index, index + HOSTS}, (index, shards)  # Host 0 reads shards 0 and 2, host 1 shards 1 and 3.

  # One process, 8 devices, the global batches the two hosts formed (host 0's rows, then host 1's).
  run = pretraining.make_run(config)
  mesh, abstract, shardings, step = run.mesh, run.abstract, run.shardings, run.train_step
  state = run.init_state(config.seed)
  losses = []
  for step_index in range(steps):
    batch = {
      name: np.concatenate([host_batches[h][step_index][name] for h in range(HOSTS)]) for name in host_batches[0][0]
    }
    state, metrics = step(state, sharding.global_batch(batch, mesh), loop.train_dropout_key(config.seed))
    losses.append(float(metrics["loss"]))
  np.testing.assert_allclose(_logged_losses(workdir), losses, rtol=1e-5)

  # The checkpoint the two processes wrote restores in this one process, on 8 devices, to the same parameters.
  with checkpoints.read_only_manager(workdir) as manager:
    restored, position = reading.restore(manager, steps, abstract, shardings)
  assert int(restored.step) == steps and position["tokenizer"] == data.identity
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5),
    jax.device_get(restored.params),
    jax.device_get(state.params),
  )

  # One host continues the two hosts' global stream (both readers, restored from the states the two saved): its next
  # two steps equal the uninterrupted stream's, computed here from one host's source of the same two readers.
  restored_readers = []
  restore = sources.PipelineSource._restore
  monkeypatch.setattr(
    sources.PipelineSource, "_restore", lambda self, r, d: restored_readers.append((r, restore(self, r, d))) or True
  )
  config.update(num_train_steps=steps + 2, schedule_end_step=10_000)  # Stops early on the two hosts' schedule.
  resumed = jobs.run(config, workdir, "pretrain")
  assert restored_readers == [(0, True), (1, True)]  # Not replayed.
  config.data.num_readers = 2  # What the first launch recorded.
  uninterrupted = data.source(0, host=(0, 1))
  for step_index in range(steps + 2):
    batch = next(uninterrupted)
    if step_index < steps:  # The two hosts' rows were this stream's.
      two_hosts = {name: np.concatenate([host_batches[h][step_index][name] for h in range(HOSTS)]) for name in batch}
      jax.tree.map(np.testing.assert_array_equal, batch, two_hosts)
    else:
      state, _ = step(state, sharding.global_batch(batch, mesh), loop.train_dropout_key(config.seed))
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5),
    jax.device_get(resumed.params),
    jax.device_get(state.params),
  )


def test_a_first_launch_with_the_embedded_corpus_prepares_once_and_a_failing_host_brings_the_other_down(tmp_path):
  """A fresh workdir, two hosts, the embedded corpus: process 0 prepares it while process 1 waits for the commit
  (they once raced on the same temporary files); then process 1 fails in step 3, and process 0, blocked in the
  step's collectives, stops within seconds with process 1's error as its last line (not after a 300 s timeout)."""
  workdir = tmp_path / "run"
  overrides = {
    "model.vocab_size": 400,
    "model.hidden_size": 32,
    "model.num_layers": 1,
    "model.num_heads": 2,
    "model.intermediate_size": 48,
    "model.max_position_embeddings": 32,
    "data.max_seq_length": 32,
    "data.max_predictions_per_seq": 5,
    "batch_size": 16,
    "num_train_steps": 10_000,
    "log_every_steps": 1,
    "eval_steps": 0,
  }
  processes = _start_two_hosts(None, workdir, second=_FAILING_MAIN, overrides=overrides)
  try:
    exited = {}
    deadline = time.monotonic() + 400
    while len(exited) < len(processes):
      assert time.monotonic() < deadline, "the job did not end"
      for index, process in enumerate(processes):
        if index not in exited and process.poll() is not None:
          exited[index] = time.monotonic()
      time.sleep(0.1)
    results = [_finish(process) for process in processes]
  finally:
    for process in processes:
      process.kill()
  assert [result.returncode for result in results] == [1, 1], [result.stderr[-3000:] for result in results]
  assert abs(exited[0] - exited[1]) < 15  # Within seconds of each other, not a collective's timeout.
  error = "ValueError: injected failure in the batch of step 3"
  for result in results:
    assert error in result.stderr.strip().splitlines()[-1], result.stderr[-3000:]
  assert "process 1 ran the preparer" not in results[1].stderr  # It found the corpus process 0 had prepared.
  assert (workdir / "prepared" / "manifest.json").exists()


# Two processes that join a job, start the failure watcher polling as fast as it can, and end without error.
_WATCHED_EXIT = """
import sys, time
import jax
from bert_jax import distributed
jax.distributed.initialize(sys.argv[1], num_processes=2, process_id=int(sys.argv[2]))
distributed.watch_for_failures(poll_seconds=0.0001)
time.sleep(1)
"""


def test_processes_that_end_cleanly_exit_zero_while_the_failure_watcher_polls():
  """The watcher stops before JAX shuts the coordination client down at exit: a daemon thread still inside the
  client's call as Python finalised aborted a host that had just stopped cleanly ("FATAL: exception not
  rethrown", exit -6), in CI's multi-host preemption run and in 6 of 6 runs of this script."""
  address = f"localhost:{_free_port()}"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  processes = [_spawn(["-c", _WATCHED_EXIT, address, str(index)], env) for index in range(HOSTS)]
  try:
    results = [_finish(process) for process in processes]
  finally:
    for process in processes:
      process.kill()
  assert [result.returncode for result in results] == [0, 0], [result.stderr[-3000:] for result in results]
