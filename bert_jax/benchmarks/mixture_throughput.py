"""Input-pipeline throughput of a mixture of three sources against one source (docs/benchmarks.md, "Mixtures").

    python -m bert_jax.benchmarks.mixture_throughput --source='wiki=../shared/data/pretrain/wikitext-2/*' \\
        --source='books=../shared/data/pretrain/gutenberg/*.txt' \\
        --source='speeches=../shared/data/pretrain/state_union/*' \\
        --tokenizer_path=../shared/data/vocab/bert-base-uncased-vocab.txt

Prepares each source into a scratch directory, then times, alternately (`--rounds` times each, medians reported),
the tf.data pipeline of one source (the first) and of the three drawn by size (tau 1): NSP pairs, 80/10/10 masks,
batches of `--batch_size` at sequence 128, one reader. Sequences per second on this host, and the mixture's share
of the single source's.
"""

import statistics
import tempfile
import time

from absl import app, flags

from bert_jax.data import prepare, sources
from bert_jax.data.batch_warmup import BatchSchedule
from bert_jax.data.mixed import Mixture
from bert_jax.data.tokenizer import load_tokenizer
from configs import default

_SOURCES = flags.DEFINE_multi_string("source", None, "NAME=GLOB of a source's text files (the first: the one).")
_FORMAT = flags.DEFINE_string("input_format", "document", "data.input_format of every source.")
_PATH = flags.DEFINE_string("tokenizer_path", None, "A WordPiece vocab.txt.", required=True)
_BATCH = flags.DEFINE_integer("batch_size", 256, "Host batch size.")
_SECONDS = flags.DEFINE_float("seconds", 10.0, "Seconds to time each round.")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Rounds of each stream, alternating.")


def _rate(source, seconds: float) -> float:
  for _ in range(3):  # Warm up: graph building, the first shuffle buffers.
    next(source)
  start, sequences = time.perf_counter(), 0
  while time.perf_counter() - start < seconds:
    sequences += len(next(source)["input_ids"])
  return sequences / (time.perf_counter() - start)


def main(argv):
  del argv
  tokenizer_args = dict(kind="wordpiece", path=_PATH.value)
  tokenizer = load_tokenizer(**tokenizer_args)
  dirs, manifests = {}, {}
  for part in _SOURCES.value:
    name, pattern = part.split("=", 1)
    data = default.get_config().data
    data.update(input_pattern=pattern, input_format=_FORMAT.value, tfds_name="")
    dirs[name] = tempfile.mkdtemp(prefix=f"bert_jax_mixture_{name}_")
    manifests[name] = prepare.prepare(data, tokenizer_args, dirs[name])
    print(f"{name}: {manifests[name]['documents']:,} documents, {manifests[name]['tokens']:,} tokens", flush=True)
  data = default.get_config().data
  data.update(max_seq_length=128, max_predictions_per_seq=20, num_readers=1)
  first = next(iter(dirs))
  mixed_data = default.get_config().data
  mixed_data.update(data.to_dict())
  mixed_data.mixture_sources = ",".join(f"{name}={directory}" for name, directory in dirs.items())
  batches = BatchSchedule.warmup(_BATCH.value, _BATCH.value, 0, 128)
  mixture = Mixture.of(mixed_data, manifests, batches, 1_000_000)
  rates = {"one source": [], "three sources": []}
  for _ in range(_ROUNDS.value):
    one = sources.pipeline_source(data, dirs[first], manifests[first], tokenizer, seed=0, batch_size=_BATCH.value)
    rates["one source"].append(_rate(one, _SECONDS.value))
    three = sources.pipeline_source(
      mixed_data, dirs[first], manifests[first], tokenizer, seed=0, batch_size=_BATCH.value, mixture=mixture
    )
    rates["three sources"].append(_rate(three, _SECONDS.value))
    print({name: f"{values[-1]:,.0f}" for name, values in rates.items()}, flush=True)
  medians = {name: statistics.median(values) for name, values in rates.items()}
  for name, value in medians.items():
    print(f"{name}: {value:,.0f} sequences/s (median of {_ROUNDS.value} rounds of {_SECONDS.value:g} s)")
  print(f"the mixture at {medians['three sources'] / medians['one source']:.1%} of one source's throughput")


if __name__ == "__main__":
  app.run(main)
