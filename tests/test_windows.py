"""Document-stride windows (data/windows.py), against Google BERT's run_squad.py rules: its doc spans and its
`_check_is_max_context`, written out here as run_squad writes them."""

import numpy as np
import pytest

from bert_jax.data.windows import doc_spans, max_context_spans


def _check_is_max_context(spans, index, position):  # run_squad's, as written there.
  best_score, best_index = None, None
  for span_index, (start, length) in enumerate(spans):
    end = start + length - 1
    if position < start or position > end:
      continue
    score = min(position - start, end - position) + 0.01 * length
    if best_score is None or score > best_score:
      best_score, best_index = score, span_index
  return index == best_index


def test_doc_spans_start_at_zero_advance_by_the_stride_and_stop_at_the_end():
  assert doc_spans(30, 12, 5) == [(0, 12), (5, 12), (10, 12), (15, 12), (20, 10)]
  assert doc_spans(10, 4, 2) == [(0, 4), (2, 4), (4, 4), (6, 4)]
  assert doc_spans(3, 4, 2) == [(0, 3)] and doc_spans(12, 12, 5) == [(0, 12)]
  assert doc_spans(0, 4, 2) == [(0, 0)]  # No tokens: one empty window.
  assert doc_spans(7, 3, 4) == [(0, 3), (3, 3), (6, 1)]  # A stride beyond a window: the next starts where it ends.
  for num_tokens in range(40):
    for max_tokens in range(1, 12):
      for stride in range(1, 14):
        spans = doc_spans(num_tokens, max_tokens, stride)
        assert spans[0][0] == 0 and all(length == min(max_tokens, num_tokens - start) for start, length in spans)
        assert [start + length == num_tokens for start, length in spans] == [False] * (len(spans) - 1) + [True]
        starts = [start for start, _ in spans]
        assert all(starts[k + 1] == start + min(length, stride) for k, (start, length) in enumerate(spans[:-1]))
  for bad in ((10, 0, 2), (10, 4, 0)):
    with pytest.raises(ValueError, match="max_tokens >= 1 and doc_stride >= 1"):
      doc_spans(*bad)


def test_each_token_takes_the_window_of_run_squads_check_is_max_context():
  spans = doc_spans(10, 4, 2)
  # Token 3: no right context in window 0, one each side in 1; token 2: one each side in 0 and in 1: the first.
  assert max_context_spans(spans, 10).tolist() == [0, 0, 0, 1, 1, 2, 2, 3, 3, 3]
  # Token 23: three each side in the last two windows: the longer (12 tokens, not 10) wins by 0.01 per token.
  assert max_context_spans(doc_spans(30, 12, 5), 30)[23] == 3
  assert max_context_spans([(0, 0)], 0).tolist() == []
  for num_tokens, max_tokens, stride in [(30, 12, 5), (7, 3, 4), (100, 20, 7), (5, 10, 2), (41, 14, 9), (64, 16, 3)]:
    spans = doc_spans(num_tokens, max_tokens, stride)
    owner = max_context_spans(spans, num_tokens)
    for position in range(num_tokens):
      assert [_check_is_max_context(spans, k, position) for k in range(len(spans))] == list(
        np.arange(len(spans)) == owner[position]
      ), (num_tokens, max_tokens, stride, position)
