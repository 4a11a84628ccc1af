"""Hard-negative mining: for each (anchor, positive) pair, the corpus documents a model ranks closest to the anchor
that are not its positives, as sentence-transformers' `util.mine_hard_negatives` picks them (its "top" sampling and
"n-tuple" output: anchor, positive, negative_1 ... negative_n).

Its algorithm, step by step (each held against it by tests/test_mining.py):

* the anchors are deduplicated (first appearance order); the corpus is the given corpus (else the positives), then
  the positives, deduplicated; an anchor's positives are every positive it is paired with;
* embeddings are normalised (cosine similarity); each anchor's `range_max + max_positives` best documents are found
  by exact search (`search.top_k`, over the mesh), `max_positives` being the most positives an anchor has;
* an anchor's positives are never its negatives; candidates are dropped whose score is above the anchor's lowest
  positive score less `absolute_margin`, or less `relative_margin` x its magnitude, above `max_score` or below
  `min_score`;
* of the candidates left, best first, the first `range_min` are skipped (ranks counted after the filters, as
  sentence-transformers counts them), and the next `num_negatives` are the negatives, ranks up to `range_max`;
* a pair whose anchor has fewer than `num_negatives` negatives left gets no row.

`range_max` 0 is sentence-transformers' default: `range_min + num_negatives + max_positives`, or with a margin or
a maximum score `range_min + 10 x num_negatives + max_positives`.
"""

import dataclasses
from collections.abc import Sequence

import numpy as np
from jax.sharding import Mesh

from bert_jax.retrieval import search


@dataclasses.dataclass(frozen=True)
class MiningSettings:
  """Which candidates become negatives (module docstring); None: no such filter."""

  num_negatives: int = 3
  range_min: int = 0
  range_max: int = 0  # 0: sentence-transformers' default.
  absolute_margin: float | None = None
  relative_margin: float | None = None
  max_score: float | None = None
  min_score: float | None = None


@dataclasses.dataclass(frozen=True)
class Texts:
  """The texts mining embeds: the unique anchors, and the corpus (the given corpus, then the positives, unique)."""

  anchors: list[str]
  corpus: list[str]


def texts(anchors: Sequence[str], positives: Sequence[str], corpus: Sequence[str] | None = None) -> Texts:
  """The unique anchors and the corpus, in sentence-transformers' order."""
  if len(anchors) != len(positives) or not anchors:
    raise ValueError(f"{len(anchors)} anchors and {len(positives)} positives; expected one or more pairs.")
  return Texts(list(dict.fromkeys(anchors)), list(dict.fromkeys([*(corpus or positives), *positives])))


def range_max(settings: MiningSettings, max_positives: int) -> int:
  """The deepest rank a negative may take: `settings.range_max`, else sentence-transformers' default."""
  if settings.range_max:
    return settings.range_max
  filtered = (
    settings.absolute_margin is not None or settings.relative_margin is not None or settings.max_score is not None
  )
  return settings.range_min + settings.num_negatives * (10 if filtered else 1) + max_positives


def check(settings: MiningSettings, max_positives: int = 1) -> None:
  """Raises ValueError naming the setting for a range that cannot give `num_negatives` negatives."""
  deepest = range_max(settings, max_positives)
  if settings.num_negatives < 1:
    raise ValueError(f"mine.num_negatives={settings.num_negatives}; expected at least 1.")
  if settings.range_min < 0 or settings.range_max < 0:
    raise ValueError(f"mine.range_min={settings.range_min}, range_max={settings.range_max}; expected non-negative.")
  if settings.range_min >= deepest:
    raise ValueError(f"mine.range_min={settings.range_min} must be less than mine.range_max={deepest}.")
  if settings.num_negatives > deepest - settings.range_min:
    raise ValueError(
      f"mine.num_negatives={settings.num_negatives} exceeds the {deepest - settings.range_min} ranks from "
      f"mine.range_min={settings.range_min} to range_max={deepest}."
    )


def _normalized(embeddings: np.ndarray) -> np.ndarray:
  embeddings = np.asarray(embeddings, np.float32)
  return embeddings / np.maximum(np.linalg.norm(embeddings, axis=1, keepdims=True), 1e-12)


def mine(
  anchors: Sequence[str],
  positives: Sequence[str],
  found: Texts,
  anchor_embeddings: np.ndarray,
  corpus_embeddings: np.ndarray,
  settings: MiningSettings,
  mesh: Mesh | None = None,
) -> list[dict]:
  """The rows {"anchor", "positive", "negative_1", ..., "negative_n"} of the pairs (`anchors[i]`, `positives[i]`),
  grouped by anchor in first-appearance order; `found` is `texts(...)` of them, `anchor_embeddings` [anchors, dim]
  and `corpus_embeddings` [corpus, dim] the embeddings of its texts, in its order."""
  anchor_row = {text: row for row, text in enumerate(found.anchors)}
  corpus_row = {text: row for row, text in enumerate(found.corpus)}
  positive_rows: list[list[int]] = [[] for _ in found.anchors]
  for anchor, positive in zip(anchors, positives, strict=True):
    rows = positive_rows[anchor_row[anchor]]
    if corpus_row[positive] not in rows:
      rows.append(corpus_row[positive])
  max_positives = max(len(rows) for rows in positive_rows)
  check(settings, max_positives)
  deepest = range_max(settings, max_positives)
  queries, corpus = _normalized(anchor_embeddings), _normalized(corpus_embeddings)
  depth = min(deepest + max_positives, len(corpus))
  scores, candidates = search.top_k(queries, corpus, depth, mesh)
  scores = scores.astype(np.float32)
  rows_out = []
  for query, rows in enumerate(positive_rows):
    positive_scores = corpus[rows] @ queries[query]
    keep = ~np.isin(candidates[query], rows)
    lowest = positive_scores.min()
    if settings.absolute_margin is not None:
      keep &= ~(scores[query] + settings.absolute_margin > lowest)
    if settings.relative_margin is not None:
      keep &= ~(scores[query] > lowest - abs(lowest) * settings.relative_margin)
    if settings.max_score is not None:
      keep &= ~(scores[query] > settings.max_score)
    if settings.min_score is not None:
      keep &= ~(scores[query] < settings.min_score)
    left = candidates[query][keep][:deepest][settings.range_min :][: settings.num_negatives]
    if len(left) < settings.num_negatives:
      continue
    negatives = {f"negative_{i}": found.corpus[row] for i, row in enumerate(left, 1)}
    rows_out += [{"anchor": found.anchors[query], "positive": found.corpus[row], **negatives} for row in rows]
  return rows_out
