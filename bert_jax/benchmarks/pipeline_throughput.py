"""Corpus preparation and input-pipeline throughput.

    python -m bert_jax.benchmarks.pipeline_throughput --input='../shared/data/pretrain/*/*.txt' \\
        --input_format=document --tokenizer_kind=wordpiece \\
        --tokenizer_path=../shared/data/vocab/bert-base-uncased-vocab.txt

Prepares the input into a scratch directory with every core (reported as MB of text per second), then times
the tf.data pipeline (NSP pairs, 80/10/10 masks, batching; one reader) from those shards at sequence 128
(20 predictions) and 512 (80 predictions), in sequences per second, on this host.
"""

import glob
import os
import tempfile
import time

from absl import app, flags

from bert_jax.data import prepare, sources
from bert_jax.data.input_formats import INPUT_FORMATS
from bert_jax.data.tokenizer import KINDS, load_tokenizer
from configs import default

_INPUT = flags.DEFINE_string("input", None, "Glob of text files.", required=True)
_FORMAT = flags.DEFINE_enum("input_format", "document", list(INPUT_FORMATS), "Input format (data.input_format).")
_KIND = flags.DEFINE_enum("tokenizer_kind", "wordpiece", list(KINDS), "Tokenizer kind.")
_PATH = flags.DEFINE_string(
  "tokenizer_path", None, "vocab.txt, .model, tokenizer.json or vocab.json file.", required=True
)
_BATCH = flags.DEFINE_integer("batch_size", 256, "Host batch size.")
_SECONDS = flags.DEFINE_float("seconds", 20.0, "Seconds to time each sequence length.")


def main(argv):
  del argv
  scratch = tempfile.mkdtemp(prefix="bert_jax_pipeline_")
  data = default.get_config().data
  data.update(input_pattern=_INPUT.value, input_format=_FORMAT.value, tfds_name="")
  tokenizer_args = dict(kind=_KIND.value, path=_PATH.value)
  text_mb = sum(os.path.getsize(p) for p in glob.glob(_INPUT.value)) / 1e6
  start = time.perf_counter()
  manifest = prepare.prepare(data, tokenizer_args, scratch)
  seconds = time.perf_counter() - start
  print(
    f"prepare: {text_mb:.1f} MB of text, {manifest['documents']} documents, {manifest['tokens']:,} tokens in "
    f"{seconds:.1f} s = {text_mb / seconds:.2f} MB/s on a {os.cpu_count()}-core machine, worker count chosen by "
    f"prepare (see benchmarks/prepare_throughput.py for its speed) ({_KIND.value})",
    flush=True,
  )

  tokenizer = load_tokenizer(**tokenizer_args)
  for seq, predictions in ((128, 20), (512, 80)):
    data.update(max_seq_length=seq, max_predictions_per_seq=predictions, num_readers=1)
    source = sources.pipeline_source(data, scratch, manifest, tokenizer, seed=0, batch_size=_BATCH.value)
    for _ in range(3):  # Warm up: graph building, first shuffle buffer fill.
      next(source)
    start, sequences = time.perf_counter(), 0
    while time.perf_counter() - start < _SECONDS.value:
      sequences += len(next(source)["input_ids"])
    print(f"pipeline at {seq}: {sequences / (time.perf_counter() - start):,.0f} sequences/s", flush=True)


if __name__ == "__main__":
  app.run(main)
