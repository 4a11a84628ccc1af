"""A two-phase run whose mixture and masking rate both change at the boundary, killed on either side of it, against
the same run uninterrupted (docs/benchmarks.md, "Resuming across a phase boundary").

    python -m bert_jax.benchmarks.phase_boundary_resume --workdir=/tmp/phase_boundary \\
        --wiki='../shared/data/pretrain/wikitext-2/*' --books='../shared/data/pretrain/gutenberg/*.txt' \\
        --vocab=../shared/data/vocab/bert-base-uncased-vocab.txt

Two sources (WikiText-2 and Gutenberg's books, a paragraph a document) are prepared once. Every run is
`python -m bert_jax.main` as a user launches it: a small BERT on FULL-SENTENCES rows over two readers, the phases
`0: wiki=3,books=1; B: wiki=1,books=3` and the masking rates `0: 0.3; B: 0.15` (B = `--boundary`), a checkpoint
every `--checkpoint_every` steps. One run goes through uninterrupted; each other is killed with SIGKILL (no grace:
what a preempted VM gets) when its progress line reports `--kill_at` steps (one before the boundary, one after),
then relaunched with the same command, which resumes from its newest checkpoint. Reported per run: where it was
killed, the step it resumed from, whether the final parameters equal the uninterrupted run's bit for bit, and whether
every training loss it logged (TensorBoard, both launches: the steps replayed after the kill included) equals the
uninterrupted run's at that step bit for bit, as do the per-source token shares.
"""

import json
import re
import signal
import subprocess
import sys

import numpy as np
from absl import app, flags
from etils import epath

_WORKDIR = flags.DEFINE_string("workdir", None, "Prepared sources and one workdir per run go here.", required=True)
_WIKI = flags.DEFINE_string("wiki", None, "Glob of WikiText-2's files (BERT's format).", required=True)
_BOOKS = flags.DEFINE_string("books", None, "Glob of the books (BERT's format).", required=True)
_VOCAB = flags.DEFINE_string("vocab", None, "A WordPiece vocabulary (uncased).", required=True)
_STEPS = flags.DEFINE_integer("steps", 40, "Steps of every run.")
_BOUNDARY = flags.DEFINE_integer("boundary", 20, "The step the second phase begins after.")
_EVERY = flags.DEFINE_integer("checkpoint_every", 4, "Steps between checkpoints.")
_KILL_AT = flags.DEFINE_multi_integer("kill_at", [18, 23], "Kill a run when its progress line reports this step.")

_START = re.compile(r"^\s*start\s+(.*)$", re.MULTILINE)  # The run header's row: "Resumed from step 16 (...)".


def _command(workdir: str, dirs: dict[str, str]) -> list[str]:
  sources = ",".join(f"{name}={directory}" for name, directory in dirs.items())
  boundary = _BOUNDARY.value
  flags_ = dict(
    model=dict(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128),
    tokenizer=dict(path=_VOCAB.value),
    data=dict(
      instances="full_sentences",
      max_seq_length=64,
      max_predictions_per_seq=20,
      num_readers=2,
      shuffle_buffer=500,
      mixture_sources=sources,
      mixture_phases=f"0: wiki=3,books=1; {boundary}: wiki=1,books=3",
      masked_lm_prob=0.3,
      masking_phases=f"0: 0.3; {boundary}: 0.15",
    ),
    batch_size=16,
    num_train_steps=_STEPS.value,
    warmup_steps=4,
    log_every_steps=1,
    checkpoint_every_steps=_EVERY.value,
    keep_checkpoints=3,
    eval_every_steps=_STEPS.value,
    eval_steps=2,
  )
  args = []
  for key, value in flags_.items():
    for name, setting in value.items() if isinstance(value, dict) else [(None, value)]:
      args.append(f"--config.{key}{'.' + name if name else ''}={setting}")
  return [sys.executable, "-m", "bert_jax.main", "--config=configs/tiny_english.py", f"--workdir={workdir}", *args]


def _launch(command: list[str], kill_at: int | None = None) -> tuple[str, bool]:
  """Runs `command`; with `kill_at`, SIGKILLs it when its progress line reports that step. Its log, and whether it was
  killed."""
  process = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
  lines = []
  for line in process.stderr:
    lines.append(line)
    if kill_at is not None and re.search(rf"\bstep {kill_at}/{_STEPS.value}\b", line):
      process.send_signal(signal.SIGKILL)
      process.wait()
      return "".join(lines), True
  if process.wait() != 0:
    raise RuntimeError(f"{' '.join(command)} exited {process.returncode}:\n{''.join(lines)[-3000:]}")
  return "".join(lines), False


def _started(log: str) -> str:
  match = _START.search(log)
  return match.group(1).strip() if match else "?"


def _scalars(workdir: str, prefixes: tuple[str, ...]) -> dict[tuple[str, int], list[bytes]]:
  """{(tag, step): the float32 bytes of each time a launch wrote it} of the training scalars whose tags start with
  `prefixes`."""
  from bert_jax.tensorflow_cpu import tf

  values = {}
  for path in sorted(epath.Path(workdir, "tensorboard", "train").glob("events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(str(path)):
      for value in event.summary.value:
        if value.tag.startswith(prefixes):
          number = np.asarray(tf.make_ndarray(value.tensor), np.float32).tobytes()
          values.setdefault((value.tag, event.step), []).append(number)
  return values


def _final_params(workdir: str) -> list[np.ndarray]:
  import jax

  from bert_jax.handoff import pretrained

  return jax.tree.leaves(jax.device_get(pretrained.load(f"{workdir}/checkpoints/{_STEPS.value}").params))


def prepared(name: str, pattern: str) -> str:
  directory = f"{_WORKDIR.value}/{name}"
  if not epath.Path(directory, "manifest.json").exists():
    command = [
      sys.executable,
      "-m",
      "bert_jax.main",
      "--config=configs/tiny_english.py",
      "--mode=prepare",
      f"--workdir={_WORKDIR.value}/prepare_{name}",
      f"--config.data.input_pattern={pattern}",
      "--config.data.input_format=bert",
      f"--config.tokenizer.path={_VOCAB.value}",
      f"--config.data.prepared_dir={directory}",
    ]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
  return directory


def main(argv):
  del argv
  dirs = {"wiki": prepared("wiki", _WIKI.value), "books": prepared("books", _BOOKS.value)}
  tags = ("loss", "share/")
  whole = f"{_WORKDIR.value}/uninterrupted"
  if not epath.Path(whole, "checkpoints", str(_STEPS.value)).exists():
    _launch(_command(whole, dirs))
  reference, reference_params = _scalars(whole, tags), _final_params(whole)
  rows = []
  for kill_at in _KILL_AT.value:
    workdir = f"{_WORKDIR.value}/killed_at_{kill_at}"
    epath.Path(workdir).rmtree(missing_ok=True)
    _, killed = _launch(_command(workdir, dirs), kill_at)
    if not killed:
      raise RuntimeError(f"The run finished before step {kill_at}: nothing was killed.")
    log, _ = _launch(_command(workdir, dirs))
    params = _final_params(workdir)
    bitwise = all(np.array_equal(a, b) for a, b in zip(params, reference_params, strict=True))
    logged = _scalars(workdir, tags)
    mismatched = sorted(key for key, values in logged.items() if set(values) != set(reference.get(key, ())))
    rows.append(
      dict(
        killed_at=kill_at,
        resumed=_started(log),
        params_bitwise=bitwise,
        scalars_compared=len(logged),
        scalars_replayed=sum(len(values) > 1 for values in logged.values()),
        scalars_mismatched=[f"{tag}@{step}" for tag, step in mismatched],
      )
    )
    print(json.dumps(rows[-1]), flush=True)
  epath.Path(_WORKDIR.value, "phase_boundary_resume.json").write_text(json.dumps(rows, indent=1))
  print(f"| killed at (boundary after step {_BOUNDARY.value}) | resumed from | final parameters | logged scalars |")
  print("|---|---|---|---|")
  for row in rows:
    same = "bitwise" if row["params_bitwise"] else "DIFFER"
    scalars = f"{row['scalars_compared'] - len(row['scalars_mismatched'])} of {row['scalars_compared']} bitwise"
    print(f"| step {row['killed_at']} | {row['resumed']} | {same} | {scalars} ({row['scalars_replayed']} replayed) |")


if __name__ == "__main__":
  app.run(main)
