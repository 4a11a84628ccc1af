"""bert_jax/retrieval/mining.py: the negatives sentence-transformers' `mine_hard_negatives` picks ("top" sampling,
"n-tuple" rows), given the same embeddings: rank ranges, margins, score bounds, repeated anchors, a separate
corpus."""

import numpy as np
import pytest
import torch
import transformers
from datasets import Dataset
from sentence_transformers import SentenceTransformer, models
from sentence_transformers.util import mine_hard_negatives

from bert_jax.retrieval import mining

WORDS = [f"w{i}" for i in range(40)]


@pytest.fixture(scope="module")
def st_model(tmp_path_factory):
  """A small random BERT as a sentence-transformers model (mean pooling), written and read back offline."""
  directory = tmp_path_factory.mktemp("st_model")
  (directory / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
  torch.manual_seed(0)
  config = transformers.BertConfig(
    vocab_size=45, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
  )
  transformers.BertModel(config).save_pretrained(directory)
  transformers.BertTokenizer(str(directory / "vocab.txt")).save_pretrained(directory)
  transformer = models.Transformer(str(directory), max_seq_length=32)
  return SentenceTransformer(modules=[transformer, models.Pooling(16, "mean")], device="cpu")


def pairs(seed: int, num_pairs: int = 30):
  rng = np.random.default_rng(seed)
  text = lambda n: " ".join(rng.choice(WORDS, n))  # noqa: E731
  anchors = [text(3) for _ in range(num_pairs)]
  anchors[5] = anchors[2]  # an anchor with two positives
  anchors[9] = anchors[2]
  positives = [text(int(rng.integers(4, 10))) for _ in range(num_pairs)]
  positives[7] = positives[3]  # a positive two anchors share
  return anchors, positives, [text(int(rng.integers(4, 10))) for _ in range(25)]


def mined_by_both(model, settings: mining.MiningSettings, seed: int = 0, separate_corpus: bool = False):
  anchors, positives, extra = pairs(seed)
  corpus = extra + positives[:10] if separate_corpus else None
  reference = mine_hard_negatives(
    Dataset.from_dict({"anchor": anchors, "positive": positives}),
    model,
    corpus=corpus,
    num_negatives=settings.num_negatives,
    range_min=settings.range_min,
    range_max=settings.range_max or None,
    absolute_margin=settings.absolute_margin,
    relative_margin=settings.relative_margin,
    max_score=settings.max_score,
    min_score=settings.min_score,
    sampling_strategy="top",
    output_format="n-tuple",
    verbose=False,
  )
  found = mining.texts(anchors, positives, corpus)
  mine = mining.mine(
    anchors,
    positives,
    found,
    model.encode(found.anchors, normalize_embeddings=True),
    model.encode(found.corpus, normalize_embeddings=True),
    settings,
  )
  return mine, reference.to_list()


@pytest.mark.parametrize(
  ("settings", "separate_corpus"),
  [
    (mining.MiningSettings(num_negatives=3), False),
    (mining.MiningSettings(num_negatives=2, range_min=3, range_max=12), True),
    (mining.MiningSettings(num_negatives=4, absolute_margin=0.0), False),
    (mining.MiningSettings(num_negatives=2, relative_margin=0.05, range_min=1), True),
    (mining.MiningSettings(num_negatives=3, max_score=0.9, min_score=0.2), False),
  ],
)
def test_negatives_are_sentence_transformers(st_model, settings, separate_corpus):
  mine, reference = mined_by_both(st_model, settings, separate_corpus=separate_corpus)
  assert mine == reference
  assert mine  # some pairs get their negatives
  for row in mine:
    negatives = [text for column, text in row.items() if column.startswith("negative_")]
    assert len(negatives) == settings.num_negatives and row["positive"] not in negatives


def test_a_filter_that_leaves_too_few_candidates_drops_the_pair(st_model):
  mine, reference = mined_by_both(st_model, mining.MiningSettings(num_negatives=3, max_score=0.5))
  assert mine == reference
  assert len(mine) < 30


@pytest.mark.parametrize(
  ("settings", "message"),
  [
    (mining.MiningSettings(num_negatives=0), r"mine.num_negatives=0; expected at least 1"),
    (mining.MiningSettings(range_min=5, range_max=5), r"mine.range_min=5 must be less than mine.range_max=5"),
    (mining.MiningSettings(num_negatives=4, range_min=2, range_max=5), r"mine.num_negatives=4 exceeds the 3 ranks"),
  ],
)
def test_impossible_ranges_are_refused(settings, message):
  with pytest.raises(ValueError, match=message):
    mining.check(settings)
