"""Packed vs unpacked pretraining rows: how much of a row is real tokens, and real tokens per second of the step.

    python -m bert_jax.benchmarks.packing_efficiency --input='../shared/data/pretrain/*/*.txt' \\
        --vocab=../shared/data/vocab/bert-base-uncased-vocab.txt --preset=base

Prepares the input twice into a scratch directory: each file one document (`input_format=document`), and each
blank-line-separated paragraph one document, its lines the sentences (`input_format=bert`, the layout that
`create_pretraining_data.py` reads). For each layout and sequence length (128 with 20 predictions, 512 with 80)
it reads `--rows` rows of the real pipeline unpacked and packed and reports the fill (real tokens / row length)
and instances per row. With `--preset`, it then times the whole jitted train step on those batches (one device)
and reports real (non-padding) tokens per second, packed vs unpacked.
"""

import os
import tempfile
import time

import jax
from absl import app, flags

from bert_jax import sharding
from bert_jax.data import prepare, sources
from bert_jax.data.tokenizer import load_tokenizer
from bert_jax.model.bert_config import preset
from bert_jax.train import pretraining
from configs import default

_INPUT = flags.DEFINE_string("input", None, "Glob of text files.", required=True)
_VOCAB = flags.DEFINE_string("vocab", None, "WordPiece vocab.txt.", required=True)
_ROWS = flags.DEFINE_integer("rows", 2048, "Rows read for the fill statistics.")
_PRESET = flags.DEFINE_string("preset", "", "Model preset whose train step is timed (empty: fill only).")
_BATCH = flags.DEFINE_integer("batch_size", 8, "Rows per timed step.")
_STEPS = flags.DEFINE_integer("steps", 3, "Timed steps (after one compiling step).")
_LAYOUTS = flags.DEFINE_list("layouts", ["document", "bert"], "Input formats: document, bert (paragraphs).")
_LENGTHS = flags.DEFINE_list("lengths", ["128", "512"], "Sequence lengths (20 predictions at 128, 80 at 512).")


def _data(layout: str, seq: int, packed: bool):
  data = default.get_config().data
  data.update(input_pattern=_INPUT.value, input_format=layout, tfds_name="", num_readers=1)
  data.update(max_seq_length=seq, max_predictions_per_seq=20 if seq <= 128 else 80, pack_instances=packed)
  return data


def _fill(source, rows: int, batch_size: int) -> tuple[float, float, list]:
  """(fill, instances per row, the first batches) over `rows` rows of `source`."""
  real, instances, batches = 0, 0, []
  for _ in range(rows // batch_size):
    batch = next(source)
    batches.append(batch)
    real += int((batch["input_mask"] > 0).sum())
    weights = batch.get("next_sentence_weights")
    instances += int(weights.sum()) if weights is not None else len(batch["input_ids"])
  total = (rows // batch_size) * batch_size
  return real / (total * batch["input_ids"].shape[1]), instances / total, batches


def _step_seconds(data, batches) -> float:
  """Seconds per step of the jitted train step on `batches` (after a compiling step). A step's time does not depend
  on what its rows hold, only on their shape: real tokens per second are the fill times the row tokens per second."""
  config = default.get_config()
  config.model.update(preset(_PRESET.value))
  config.data.update(data.to_dict())
  config.data.source = "synthetic"  # Only the config checks read it; the batches come from the pipeline.
  config.update(batch_size=_BATCH.value, num_train_steps=10_000, warmup_steps=100)
  config.mesh.update(data=1, fsdp=1, tensor=1)
  run = pretraining.make_run(config, jax.devices()[:1])
  state, key = run.init_state(0), jax.random.key(1)
  device_batches = [sharding.global_batch(b, run.mesh) for b in batches[: _STEPS.value + 1]]
  state, metrics = run.train_step(state, device_batches[0], key)  # Compiles.
  jax.block_until_ready(metrics)
  start = time.perf_counter()
  for batch in device_batches[1:]:
    state, metrics = run.train_step(state, batch, key)
  jax.block_until_ready(metrics)
  return (time.perf_counter() - start) / _STEPS.value


def main(argv):
  del argv
  scratch = tempfile.mkdtemp(prefix="bert_jax_packing_")
  tokenizer_args = dict(kind="wordpiece", path=_VOCAB.value)
  tokenizer = load_tokenizer(**tokenizer_args)
  print(f"{jax.devices()[0].device_kind}, {os.cpu_count()} cores; input {_INPUT.value}", flush=True)
  for layout in _LAYOUTS.value:
    prepared = os.path.join(scratch, layout)
    manifest = prepare.prepare(_data(layout, 128, False), tokenizer_args, prepared)
    print(f"\nlayout {layout}: {manifest['documents']:,} documents, {manifest['tokens']:,} tokens", flush=True)
    for seq in map(int, _LENGTHS.value):
      results = {}
      for packed in (False, True):
        data = _data(layout, seq, packed)
        source = sources.pipeline_source(data, prepared, manifest, tokenizer, seed=0, batch_size=_BATCH.value)
        fill, per_row, batches = _fill(source, _ROWS.value, _BATCH.value)
        line = f"  seq {seq} {'packed  ' if packed else 'unpacked'}: fill {fill:.3f}, {per_row:.2f} instances/row"
        if _PRESET.value:
          seconds = _step_seconds(data, batches)
          results[packed] = fill * _BATCH.value * seq / seconds
          line += f", {seconds:.3f} s/step, {results[packed]:,.0f} real tokens/s ({_PRESET.value})"
        print(line, flush=True)
      if results:
        print(f"  seq {seq}: packed / unpacked real tokens/s = {results[True] / results[False]:.2f}x", flush=True)


if __name__ == "__main__":
  app.run(main)
