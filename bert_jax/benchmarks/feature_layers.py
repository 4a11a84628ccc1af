"""The BERT paper's feature-based comparison (Devlin et al. 2018, section 5.3): a BiLSTM tagger on a frozen encoder's
hidden states, for each choice of layers the paper compared, against fine-tuning the whole encoder on the same files.

    python -m bert_jax.benchmarks.wikitext_names --wikitext_dir=../shared/data/pretrain/wikitext-2 \
        --output_dir=/tmp/wikitext_names
    python -m bert_jax.benchmarks.feature_layers --init_from=/tmp/tiny_english --data_dir=/tmp/wikitext_names \
        --tags=O,B-NAME,I-NAME --workdir=/tmp/feature_layers

(the run in docs/bertology.md). `--data_dir` holds CoNLL column files (train.txt, valid.txt, test.txt: CoNLL-2003,
or any with `--tags`); `--init_from` is any source `pretrained.load` reads. Both jobs are configs/ner.py's, with
`--seq`, `--batch_size` and `--seed`. The tagger is `--mode=feature_based`: two bidirectional LSTM layers of
`--lstm_size` units each way, `--tagger_epochs` at `--tagger_learning_rate`. Fine-tuning is `--mode=finetune`:
`--finetune_epochs`, one sweep member per rate of `--finetune_learning_rates` (trained together), the best on dev
reported, as the paper chose its rate.

The choices, in extract_features.py's counting (-1 the last layer, 0 the embeddings), for a model of L layers: the
embeddings only; the second-to-last hidden layer; the last; the last four summed and concatenated (the last
min(4, L + 1) hidden states: a model of fewer than 4 layers brings its embeddings in); all L layers summed. The
paper's sums are learned weightings; these add the layers with equal weights (--mode=probe learns the weights).

Each run writes under `--workdir` and is read back when it finished before. Writes `<workdir>/feature_layers.json`
and prints the table as markdown: the dev F1 (conlleval) of each choice, and of fine-tuning.
"""

import json
import time

from absl import app, flags, logging
from etils import epath

from bert_jax import jobs
from bert_jax.bertology import feature_based
from bert_jax.finetune import job
from bert_jax.handoff import formats
from configs import ner

FLAGS = flags.FLAGS


def _define_flags() -> None:
  """The command's flags, defined when it runs, not on import: a test imports this module beside others that define
  flags of the same names."""
  flags.DEFINE_string("init_from", None, "The pretrained encoder: any source pretrained.load reads.")
  flags.DEFINE_string("data_dir", None, "CoNLL column files: train.txt, valid.txt, test.txt.")
  flags.DEFINE_string("tags", "", "finetune.tags: the files' tag set in order; empty: CoNLL-2003's.")
  flags.DEFINE_string("workdir", None, "One directory per run goes here.")
  flags.DEFINE_integer("seq", 128, "Tokens per row (longer sentences are split at word boundaries).")
  flags.DEFINE_integer("batch_size", 32, "Rows per batch, for the tagger and for fine-tuning.")
  flags.DEFINE_integer("lstm_size", 768, "The tagger's LSTM units each way (the paper: 768).")
  flags.DEFINE_integer("tagger_epochs", 3, "The tagger's epochs of the train split.")
  flags.DEFINE_float("tagger_learning_rate", 1e-3, "The tagger's Adam learning rate.")
  flags.DEFINE_float("finetune_epochs", 3.0, "Fine-tuning's epochs (the paper: 3).")
  flags.DEFINE_string(
    "finetune_learning_rates", "5e-5,3e-5,2e-5", "Fine-tuning's learning rates, one sweep member each; the best on dev."
  )
  flags.DEFINE_integer("seed", 0, "The seed of every run.")


def choices(num_layers: int) -> list[tuple[str, tuple[int, ...], str]]:
  """(name, feature_layers, feature_combine) for each of the paper's rows, for a model of `num_layers` layers."""
  last = tuple(-i for i in range(1, min(4, num_layers + 1) + 1))
  with_embeddings = " (the embeddings included)" if len(last) == num_layers + 1 else ""
  return [
    ("embeddings only", (0,), "concat"),
    ("second-to-last hidden", (-2,), "concat"),
    ("last hidden", (-1,), "concat"),
    (f"sum of the last {len(last)}{with_embeddings}", last, "sum"),
    (f"concatenation of the last {len(last)}{with_embeddings}", last, "concat"),
    (f"sum of all {num_layers} layers", tuple(range(1, num_layers + 1)), "sum"),
  ]


def _config():
  config = ner.get_config()
  config.finetune.update(data_dir=FLAGS.data_dir, tags=FLAGS.tags, max_seq_length=FLAGS.seq)
  config.update(batch_size=FLAGS.batch_size, seed=FLAGS.seed)
  config.bertology.update(
    source=FLAGS.init_from,
    batch_size=FLAGS.batch_size,
    lstm_size=FLAGS.lstm_size,
    probe_epochs=FLAGS.tagger_epochs,
    probe_learning_rate=FLAGS.tagger_learning_rate,
  )
  return config


def _tagger(index: int, layers: tuple[int, ...], combine: str) -> dict:
  output = epath.Path(FLAGS.workdir) / f"tagger_{index}"
  if (output / "feature_based.json").exists():
    logging.info("%s: finished before, read back.", output)
    return json.loads((output / "feature_based.json").read_text())
  config = _config()
  config.bertology.update(feature_layers=layers, feature_combine=combine, output_dir=str(output))
  start = time.perf_counter()
  result = feature_based.analyse(config, FLAGS.init_from)
  result["seconds"] = time.perf_counter() - start
  (output / "feature_based.json").write_text(json.dumps(result, indent=1))
  return result


def _finetuned() -> dict:
  workdir = epath.Path(FLAGS.workdir) / "finetune"
  if (workdir / job.METRICS_FILE).exists():
    logging.info("%s: finished before, read back.", workdir)
    return json.loads((workdir / job.METRICS_FILE).read_text())
  config = _config()
  config.init_from = FLAGS.init_from
  config.finetune.num_epochs = FLAGS.finetune_epochs
  config.sweep.learning_rates = FLAGS.finetune_learning_rates
  start = time.perf_counter()
  summary = jobs.run(config, str(workdir), "finetune")
  summary["seconds"] = time.perf_counter() - start
  (workdir / job.METRICS_FILE).write_text(json.dumps(summary, indent=1))
  return summary


def main(argv):
  del argv
  num_layers = formats.read_source(FLAGS.init_from).config.num_layers
  rows = []
  for index, (name, layers, combine) in enumerate(choices(num_layers)):
    result = _tagger(index, layers, combine)
    rows.append(
      dict(features=name, layers=list(layers), combine=combine, **result["metrics"], seconds=result["seconds"])
    )
  summary = _finetuned()
  members = summary["final"]["dev"]
  best = max(range(len(members)), key=lambda member: members[member]["f1"])
  rate = summary["members"][best]["learning_rate"]
  rows.append(dict(features=f"fine-tuning (learning rate {rate:g})", layers=[], combine="", **members[best]))
  rows[-1]["seconds"] = summary["seconds"]
  epath.Path(FLAGS.workdir, "feature_layers.json").write_text(json.dumps(rows, indent=1))
  print("| features | layers | dev precision | dev recall | dev F1 | seconds |\n|---|---|---|---|---|---|")
  for row in rows:
    layers = ",".join(map(str, row["layers"])) + (f" ({row['combine']})" if len(row["layers"]) > 1 else "")
    print(
      f"| {row['features']} | {layers or '-'} | {100 * row['precision']:.1f} | {100 * row['recall']:.1f} | "
      f"{100 * row['f1']:.1f} | {row['seconds']:.0f} |"
    )


if __name__ == "__main__":
  _define_flags()
  flags.mark_flags_as_required(["init_from", "data_dir", "workdir"])
  app.run(main)
