"""Embedding speed: bert_jax's embedder (`retrieval/embedder.py`, what `--mode=embed` runs) against
sentence-transformers' `encode`, the same model and the same texts, side by side in one process on this machine.

    python -m bert_jax.benchmarks.embed_speed --preset=mini --squad=../shared/data/squad/dev-v1.1.json \
        --vocab=../shared/data/vocab/bert-base-uncased-vocab.txt

The model is a BERT of `--preset`'s size with random weights (speed does not depend on them), written as a Hugging
Face directory and exported by bert_jax as a sentence-transformers model (mean pooling, normalised); both sides load
that one directory. The texts are SQuAD's dev questions and paragraphs, shuffled together (mixed lengths: questions
of about 14 tokens, paragraphs of about 160), truncated at `--max_seq_length`. Each side embeds them once untimed
(compiles, warms caches), then `--repeats` times timed, alternating; the best time of each is reported, with
tokenization included on both sides. Tokens are the texts' real tokens (special tokens included, padding not).
"""

import json
import os
import random
import tempfile
import time

os.environ.setdefault("USE_TF", "0")  # sentence-transformers beside TensorFlow: transformers without its TF part.

import numpy as np
from absl import app, flags

from bert_jax.handoff import export, hf_configs
from bert_jax.model.bert_config import BertConfig, preset
from bert_jax.retrieval.embedder import Embedder
from configs import default

_PRESET = flags.DEFINE_string("preset", "mini", "Model size preset (bert_jax.model.bert_config.PRESETS).")
_SQUAD = flags.DEFINE_string("squad", None, "SQuAD v1.1 JSON (dev-v1.1.json): the texts.")
_VOCAB = flags.DEFINE_string("vocab", None, "A WordPiece vocab.txt (its size sets the model's vocabulary).")
_QUESTIONS = flags.DEFINE_integer("questions", 1000, "Questions embedded.")
_PARAGRAPHS = flags.DEFINE_integer("paragraphs", 250, "Paragraphs embedded.")
_MAX_SEQ_LENGTH = flags.DEFINE_integer("max_seq_length", 256, "Tokens per text at most, special tokens included.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 32, "Both sides' batch size (bert_jax: rows of max_seq_length).")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed runs of each side (the best is reported).")
flags.mark_flags_as_required(["squad", "vocab"])


def _texts(path: str, questions: int, paragraphs: int) -> list[str]:
  articles = json.loads(open(path, encoding="utf-8").read())["data"]
  contexts = [paragraph["context"] for article in articles for paragraph in article["paragraphs"]]
  asked = [qa["question"] for article in articles for paragraph in article["paragraphs"] for qa in paragraph["qas"]]
  rng = random.Random(0)
  texts = rng.sample(asked, questions) + rng.sample(contexts, paragraphs)
  rng.shuffle(texts)
  return texts


def _model(directory: str) -> str:
  """A random BERT of `--preset`'s size as a sentence-transformers directory, under `directory`."""
  import torch
  import transformers

  vocab_size = sum(1 for _ in open(_VOCAB.value, encoding="utf-8"))
  config = BertConfig(**preset(_PRESET.value), vocab_size=vocab_size)
  hf = os.path.join(directory, "hf")
  torch.manual_seed(0)
  transformers.BertModel(transformers.BertConfig(**hf_configs.hf_config(config))).save_pretrained(hf)
  transformers.BertTokenizerFast(_VOCAB.value).save_pretrained(hf)
  return export.export(hf, os.path.join(directory, "st"), "sentence-transformers")


def main(argv):
  del argv
  import torch
  from sentence_transformers import SentenceTransformer

  texts = _texts(_SQUAD.value, _QUESTIONS.value, _PARAGRAPHS.value)
  with tempfile.TemporaryDirectory() as directory:
    path = _model(directory)
    config = default.get_config()
    config.embed.update(max_seq_length=_MAX_SEQ_LENGTH.value, batch_size=_BATCH_SIZE.value)
    config.mesh.update(data=1, fsdp=1, tensor=1)
    embedder = Embedder.from_source(path, config)
    reference = SentenceTransformer(path, device="cpu")
    reference.max_seq_length = _MAX_SEQ_LENGTH.value

    def ours():
      return embedder.embed(texts)

    def theirs():
      with torch.inference_mode():
        return reference.encode(texts, batch_size=_BATCH_SIZE.value, convert_to_numpy=True)

    start = time.perf_counter()
    first = ours()
    first_seconds = time.perf_counter() - start
    difference = float(np.abs(first - theirs()).max())
    tokens = embedder.last_stats["tokens"]
    reference_tokens = sum(min(len(ids), _MAX_SEQ_LENGTH.value) for ids in reference.tokenizer(texts)["input_ids"])
    best = {"bert_jax": float("inf"), "sentence-transformers": float("inf")}
    for _ in range(_REPEATS.value):
      for name, fn in (("bert_jax", ours), ("sentence-transformers", theirs)):
        start = time.perf_counter()
        fn()
        best[name] = min(best[name], time.perf_counter() - start)

  lengths = sorted(len(row) for row in embedder.rows(texts))
  print(
    f"{len(texts):,} texts ({_QUESTIONS.value:,} questions, {_PARAGRAPHS.value:,} paragraphs of SQuAD dev), "
    f"{tokens:,} tokens (sentence-transformers' tokenizer: {reference_tokens:,}); lengths median "
    f"{lengths[len(lengths) // 2]}, max {lengths[-1]}; {_PRESET.value} ({embedder.model_config.title}), "
    f"max_seq_length {_MAX_SEQ_LENGTH.value}, batch {_BATCH_SIZE.value}; torch threads {torch.get_num_threads()}"
  )
  print(
    f"largest difference of the embeddings: {difference:.2e}; bert_jax's first run (compiling): {first_seconds:.1f} s"
  )
  print(f"| side | seconds (best of {_REPEATS.value}) | tokens/s | texts/s |")
  print("|---|---|---|---|")
  for name, seconds in best.items():
    print(f"| {name} | {seconds:.2f} | {tokens / seconds:,.0f} | {len(texts) / seconds:,.0f} |")
  print(f"bert_jax / sentence-transformers: {best['sentence-transformers'] / best['bert_jax']:.2f}x")


if __name__ == "__main__":
  app.run(main)
