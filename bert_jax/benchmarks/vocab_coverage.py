"""What a pretraining corpus taught a task's word pieces: the pieces of a GLUE task's text (a split) bucketed by how
often the prepared pretraining corpus holds them, with each bucket's share of the task's tokens and how alike the
pretrained model's input embeddings of those pieces are (mean pairwise cosine; near 0 for a random initialisation).

    python -m bert_jax.benchmarks.vocab_coverage --init_from=/tmp/tiny_english \
        --prepared_dir=/tmp/english_prepared --glue_dir=../shared/data/glue --task=sst2

With BERT's input and output embeddings tied, the MLM softmax pushes every piece the corpus never (or rarely)
shows away from the predicted ones, all in the same direction: the rare pieces' embeddings collapse onto one
vector, and a fine-tuning task that leans on them starts from less than a random initialisation gives it. The
corpus's counts come from its shards' statistics (`<shard>.stats.json`, written by --mode=prepare).
"""

import os

import numpy as np
from absl import app, flags
from etils import epath

from bert_jax.finetune import glue
from bert_jax.handoff import formats, pretrained

_INIT_FROM = flags.DEFINE_string("init_from", None, "The pretrained source (any that pretrained.load reads).")
_PREPARED_DIR = flags.DEFINE_string("prepared_dir", None, "The prepared pretraining corpus it was trained on.")
_GLUE_DIR = flags.DEFINE_string("glue_dir", None, "Directory holding the GLUE task directories.")
_TASK = flags.DEFINE_string("task", "sst2", "The GLUE task whose text is counted.")
_SPLIT = flags.DEFINE_string("split", "train", "Which split of the task (e.g. dev: what the evaluation reads).")
_BUCKETS = flags.DEFINE_list("buckets", ["0", "1", "10", "100"], "Lower edges of the pretraining-count buckets.")
_SAMPLE = flags.DEFINE_integer("sample", 500, "Pieces per bucket (the task's most frequent) for the cosines.")


def corpus_counts(prepared_dir: str, vocab_size: int) -> np.ndarray:
  """Token counts of the prepared corpus's training shards (their stats files)."""
  files = sorted(epath.Path(prepared_dir).glob("*.stats.json"))
  if not files:
    raise FileNotFoundError(f"{prepared_dir} has no *.stats.json; expected a corpus written by --mode=prepare.")
  counts = np.zeros(vocab_size, np.int64)
  for path in files:
    counts += np.asarray(formats.read_json(path)["token_counts"], np.int64)
  return counts


def mean_cosine(embeddings: np.ndarray) -> float:
  """The mean cosine similarity over all pairs of rows."""
  unit = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
  similarity = unit @ unit.T
  return float(similarity[np.triu_indices(len(unit), 1)].mean())


def coverage_table(task_counts: np.ndarray, corpus: np.ndarray, embeddings: np.ndarray, edges, sample: int) -> list:
  """Rows (bucket, pieces, share of the task's tokens, mean cosine of the `sample` most frequent pieces)."""
  rows, total = [], task_counts.sum()
  bounds = [*edges[1:], np.iinfo(np.int64).max]
  for low, high in zip(edges, bounds, strict=True):
    ids = np.flatnonzero((task_counts > 0) & (corpus >= low) & (corpus < high))
    top = ids[np.argsort(-task_counts[ids], kind="stable")][:sample]
    label = f"{low}" if high == low + 1 else f"{low}-{high - 1}" if high < bounds[-1] else f">={low}"
    cosine = mean_cosine(embeddings[top]) if len(top) > 1 else float("nan")
    rows.append((label, len(ids), float(task_counts[ids].sum() / total), cosine))
  return rows


def main(argv):
  del argv
  loaded = pretrained.load(_INIT_FROM.value)
  embeddings = np.asarray(loaded.params["bert"]["embeddings"]["word_embeddings"]["embedding"], np.float32)
  corpus = corpus_counts(_PREPARED_DIR.value, len(embeddings))
  task = glue.make_task(_TASK.value, data_dir=os.path.join(_GLUE_DIR.value, glue.TASKS[_TASK.value].glue_dir))
  texts = [text for example in task.read(_SPLIT.value) for text in (example.text_a, example.text_b) if text]
  task_counts = np.bincount(loaded.tokenizer.encode_batch(texts)[0], minlength=len(embeddings))
  random = np.random.default_rng(0).normal(0, 0.02, embeddings.shape)
  edges = [int(edge) for edge in _BUCKETS.value]
  name = f"{_TASK.value} {_SPLIT.value}"
  print(f"| pretraining count | {name} pieces | share of its tokens | mean cosine, pretrained | random init |")
  print("|---|---|---|---|---|")
  for (label, pieces, share, cosine), (*_, baseline) in zip(
    coverage_table(task_counts, corpus, embeddings, edges, _SAMPLE.value),
    coverage_table(task_counts, corpus, random, edges, _SAMPLE.value),
    strict=True,
  ):
    print(f"| {label} | {pieces} | {share:.3f} | {cosine:.3f} | {baseline:.3f} |")


if __name__ == "__main__":
  flags.mark_flags_as_required(["init_from", "prepared_dir", "glue_dir"])
  app.run(main)
