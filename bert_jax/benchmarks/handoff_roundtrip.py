"""Sizes and times of the hand-off: a pretraining checkpoint vs what `--mode=export` writes, and `load` from each.

    python -m bert_jax.benchmarks.handoff_roundtrip --preset=base \
        --vocab=../shared/data/vocab/bert-base-uncased-vocab.txt --workdir=/tmp/handoff

Writes one checkpoint of a model after one AdamW step (batch 8 x 128, synthetic) with the real checkpoint code, then
times `export` to each format and `pretrained.load` from each source (one device, unrolled), and reports the
bytes on disk of each. Local disk; on gs:// the times are the network's.
"""

import shutil
import time

import jax
from absl import app, flags
from etils import epath

from bert_jax import paths, sharding
from bert_jax.data.synthetic import SyntheticSource
from bert_jax.data.tokenizer import load_tokenizer
from bert_jax.handoff import export, pretrained
from bert_jax.model.bert_config import preset
from bert_jax.train import pretraining
from bert_jax.workdir import checkpoints
from configs import default

_PRESET = flags.DEFINE_string("preset", "base", "Model size preset (bert_jax.model.bert_config.PRESETS).")
_VOCAB = flags.DEFINE_string("vocab", None, "A WordPiece vocab.txt (its size sets the model's vocabulary).")
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/bert_jax_handoff", "Scratch directory (replaced).")
flags.mark_flag_as_required("vocab")

_MIB = 1 << 20


def _megabytes(path) -> float:
  return sum(p.stat().length for p in paths.files(path)) / _MIB


def _timed(fn) -> tuple[float, object]:
  start = time.perf_counter()
  result = fn()
  return time.perf_counter() - start, result


def main(argv):
  del argv
  root = epath.Path(_WORKDIR.value)
  if root.exists():
    shutil.rmtree(root)
  tokenizer = load_tokenizer("wordpiece", _VOCAB.value)
  config = default.get_config()
  config.model.update(preset(_PRESET.value), vocab_size=tokenizer.vocab_size)
  config.tokenizer.update(kind="wordpiece", path=_VOCAB.value)
  config.update(batch_size=8)
  config.mesh.update(data=1, fsdp=1, tensor=1)
  run = pretraining.make_run(config, jax.devices()[:1])
  mesh = run.mesh
  state = run.init_state(0)
  # One real step, so that the optimizer moments hold what they hold in training (zeros compress to nothing).
  step_fn = run.train_step
  batch = next(
    SyntheticSource(
      seed=0, global_batch_size=8, max_seq_length=128, max_predictions_per_seq=20, vocab_size=tokenizer.vocab_size
    )
  )
  state, _ = step_fn(state, sharding.global_batch(batch, mesh), jax.random.key(0))
  workdir = root / "run"
  with checkpoints.make_manager(str(workdir), 1) as manager:
    position = {"examples": 0, "tokenizer": tokenizer.identity()}
    checkpoints.save(manager, 1, state, position, config, checkpoints.tokenizer_item(tokenizer), {})
    manager.wait_until_finished()
  step = workdir / "checkpoints" / "1"
  rows = [("checkpoint step (params + optimizer + tokenizer)", _megabytes(step), None, None)]
  rows.append(("  of which params", _megabytes(step / "params"), None, None))
  rows.append(("  of which optimizer state", _megabytes(step / "optimizer"), None, None))
  load_seconds, _ = _timed(lambda: jax.block_until_ready(pretrained.load(str(workdir)).params))
  rows.append(("workdir (params only)", None, None, load_seconds))
  for fmt in export.FORMATS:
    target = root / fmt
    export_seconds, _ = _timed(lambda fmt=fmt, target=target: export.export(str(workdir), str(target), fmt))
    load_seconds, _ = _timed(lambda target=target: jax.block_until_ready(pretrained.load(str(target)).params))
    rows.append((f"{fmt} export", _megabytes(target), export_seconds, load_seconds))
  num_params = sum(x.size for x in jax.tree.leaves(state.params))
  print(f"BERT {_PRESET.value}: {num_params:,} parameters, vocabulary {tokenizer.vocab_size:,}; {jax.devices()[0]}")
  print("| what | MiB on disk | export s | load s |\n|---|---|---|---|")
  for name, size, export_seconds, load_seconds in rows:
    cells = [f"{value:.1f}" if value is not None else "" for value in (size, export_seconds, load_seconds)]
    print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
  app.run(main)
