"""Document-stride windows over a sequence longer than one row, by the rules of Google BERT's run_squad.py: the
windows (`doc_spans`) and, for each token, the one window whose prediction or vector it takes (`max_context_spans`,
run_squad's `_check_is_max_context`). SQuAD's encoding (finetune/squad_windows.py) and feature extraction
(handoff/extract_features.py) both cut their documents here.
"""

import numpy as np


def doc_spans(num_tokens: int, max_tokens: int, doc_stride: int) -> list[tuple[int, int]]:
  """(start, length) of each window over `num_tokens` tokens: the first at 0, each `min(its length, doc_stride)`
  after the last, each `min(max_tokens, the tokens left)` long, the last the one that reaches the end. A document
  without tokens gets one empty window (0, 0)."""
  if max_tokens < 1 or doc_stride < 1:
    raise ValueError(f"Windows need max_tokens >= 1 and doc_stride >= 1; got {max_tokens} and {doc_stride}.")
  spans, start = [], 0
  while True:
    length = min(num_tokens - start, max_tokens)
    spans.append((start, length))
    if start + length == num_tokens:
      return spans
    start += min(length, doc_stride)


def max_context_spans(spans: list[tuple[int, int]], num_tokens: int) -> np.ndarray:
  """[num_tokens] int: the index in `spans` of the window that owns each token, the one where it has the most
  context. A token's score in a window is min(tokens left of it, tokens right of it) + 0.01 * the window's length
  (at equal context the longer window); the first window wins a tie of scores."""
  best_score, best_span = np.full(num_tokens, -np.inf), np.full(num_tokens, -1)
  for index, (start, length) in enumerate(spans):
    position = np.arange(start, start + length)
    score = np.minimum(position - start, start + length - 1 - position) + 0.01 * length
    better = score > best_score[position]  # Strictly: an earlier window keeps a tie.
    best_score[position[better]], best_span[position[better]] = score[better], index
  return best_span
