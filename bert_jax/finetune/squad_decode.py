"""SQuAD's n-best span decoding, following Google BERT's `run_squad.py` (`write_predictions`): the logits of a
split's windows (`squad_windows`) back to each question's answer text, its n-best list and, for v2.0, its null score
difference.

An answer is cut back out of the context's words. WordPiece answers take run_squad's `get_final_text` alignment
(which undoes lower-casing and accent stripping). SentencePiece answers are cut out of their words at the piece
boundaries found when encoding (`Document.char_spans`); a word whose pieces do not spell it (NFKC changed a
character) is taken whole.
"""

import dataclasses
import functools

import numpy as np

from bert_jax.data.tokenizer import wordpiece
from bert_jax.finetune.contract import Encoded
from bert_jax.finetune.squad_windows import Document, Windows

# The no-answer score difference of a question for which no span could be predicted at all: certainly no answer.
NO_SPAN_SCORE_DIFF = 1e6


@dataclasses.dataclass(frozen=True)
class SquadPredictions:
  """Decoded predictions, per question id: `answers` (the text predictions.json holds: '' for no answer in v2.0,
  at the task's threshold), `best_non_null` (the best non-empty text), `nbest` (run_squad's n-best entries: text,
  probability, start_logit, end_logit) and for v2.0 `null_odds` (null score - best non-null score)."""

  answers: dict[str, str]
  best_non_null: dict[str, str]
  nbest: dict[str, list[dict]]
  null_odds: dict[str, float] | None


def decode(
  encoded: Encoded, logits: np.ndarray, n_best_size: int, max_answer_length: int, null_threshold: float | None
) -> SquadPredictions:
  """run_squad's `write_predictions` of `logits` [rows, seq, 2]: per question, the n-best distinct texts of the
  spans whose start and end are among a window's `n_best_size` best, inside its document, start <= end, at most
  `max_answer_length` pieces and starting where the window has the piece's max context. With `null_threshold`
  (v2.0) the null answer competes with its score (start + end logit of [CLS], the least over the question's
  windows), and the question is answered '' when null score - best span score exceeds the threshold."""
  windows = encoded.extra
  logits = np.asarray(logits, np.float64)  # run_squad's scores are Python floats.
  expected = (encoded.num_rows, windows.token_is_max_context.shape[1], 2)
  if logits.shape != expected:
    raise ValueError(f"SQuAD logits of shape {logits.shape}; the encoded split needs {expected}.")
  rows_of = [[] for _ in encoded.examples]
  for row, index in enumerate(encoded.row_example):
    rows_of[index].append(row)
  answers, best_non_null, nbest, null_odds = {}, {}, {}, {}
  with_null = null_threshold is not None
  for index, example in enumerate(encoded.examples):
    document = windows.documents[index]
    entries, null_score = _nbest(
      example, document, windows, rows_of[index], logits, n_best_size, max_answer_length, with_null
    )
    nbest[example.qid] = _nbest_json(entries)
    best = next((entry for entry in entries if entry[0]), None)
    best_non_null[example.qid] = best[0] if best else ""
    if not with_null:
      answers[example.qid] = entries[0][0]
      continue
    null_odds[example.qid] = null_score - best[1] - best[2] if best else NO_SPAN_SCORE_DIFF
    answers[example.qid] = "" if null_odds[example.qid] > null_threshold else best_non_null[example.qid]
  return SquadPredictions(answers, best_non_null, nbest, null_odds if with_null else None)


def _nbest(example, document, windows: Windows, rows: list[int], logits, n_best_size, max_answer_length, with_null):
  """([(text, start_logit, end_logit)] best first, at least one; the question's null score)."""
  prelim = []
  for row in rows:
    prelim += _row_candidates(windows, row, logits[row], n_best_size, max_answer_length)
  null_row = min(rows, key=lambda row: logits[row, 0, 0] + logits[row, 0, 1])
  null = (null_row, 0, 0, float(logits[null_row, 0, 0]), float(logits[null_row, 0, 1]))
  if with_null:
    prelim.append(null)
  prelim.sort(key=lambda p: p[3] + p[4], reverse=True)  # Stable, as run_squad's sorted().
  seen, entries = set(), []
  for row, start, end, start_logit, end_logit in prelim:
    if len(entries) >= n_best_size:
      break
    text = _span_text(example, document, windows, row, start, end) if start > 0 else ""
    if text in seen and start > 0:
      continue
    seen.add(text)
    entries.append((text, start_logit, end_logit))
  if with_null and "" not in seen:
    entries.append(("", null[3], null[4]))
  # No valid span at all (run_squad answers its nonce 'empty'): answer nothing.
  return entries or [("", 0.0, 0.0)], null[3] + null[4]


def _row_candidates(windows: Windows, row: int, logits: np.ndarray, n_best_size: int, max_answer_length: int) -> list:
  """[(row, start, end, start_logit, end_logit)] of one window's valid spans among its n-best starts and ends, in
  run_squad's order (by start rank, then end rank)."""
  offset, length = windows.doc_offset[row], windows.doc_length[row]
  starts = _best_indexes(logits[:, 0], n_best_size)[:, None]
  ends = _best_indexes(logits[:, 1], n_best_size)[None, :]
  in_document = lambda i: (i >= offset) & (i < offset + length)
  valid = in_document(starts) & in_document(ends) & windows.token_is_max_context[row][starts]
  valid &= (ends >= starts) & (ends - starts < max_answer_length)
  pairs = zip(*np.nonzero(valid), strict=True)  # Row-major: run_squad's loop order.
  return [
    (row, int(starts[s, 0]), int(ends[0, e]), float(logits[starts[s, 0], 0]), float(logits[ends[0, e], 1]))
    for s, e in pairs
  ]


def _best_indexes(scores: np.ndarray, n: int) -> np.ndarray:
  """The indexes of the `n` largest scores, largest first (the first index on ties, as run_squad's)."""
  return np.argsort(-scores, kind="stable")[:n]


def _span_text(example, document: Document, windows: Windows, row: int, start: int, end: int) -> str:
  """The context text of the row positions [start, end] (see the module docstring)."""
  shift = windows.doc_start[row] - windows.doc_offset[row]
  first, last = start + shift, end + shift
  if windows.kind != "wordpiece":
    return _cut_text(example.words, document, first, last)
  pieces = " ".join(document.pieces[first : last + 1])
  tok_text = " ".join(pieces.replace(" ##", "").replace("##", "").split())  # Pieces back into words.
  orig_text = " ".join(example.words[document.tok_to_orig[first] : document.tok_to_orig[last] + 1])
  return get_final_text(tok_text, orig_text, windows.lower_case)


def _cut_text(words: tuple[str, ...], document: Document, first: int, last: int) -> str:
  """The words of pieces [first, last], the first cut from its piece's first character and the last after its
  piece's last (whole words where the pieces could not be aligned), joined by spaces."""
  first_word, last_word = document.tok_to_orig[first], document.tok_to_orig[last]
  begin, stop = document.char_spans[first, 0], document.char_spans[last, 1]
  parts = list(words[first_word : last_word + 1])
  parts[-1] = parts[-1][: stop if stop >= 0 else len(parts[-1])]
  parts[0] = parts[0][max(begin, 0) :]
  # A span of bare word-start pieces covers no character: take its words.
  return " ".join(parts).strip() or " ".join(words[first_word : last_word + 1])


def get_final_text(pred_text: str, orig_text: str, lower_case: bool) -> str:
  """run_squad's `get_final_text`: the part of `orig_text` (the span's whole words) that `pred_text` (its pieces
  joined back, lower-cased and accent-stripped by an uncased WordPiece) is, by aligning `orig_text`'s
  BasicTokenizer text to it character by character once spaces are removed; `orig_text` where that fails
  (orig_text 'Steve Smith's', pred_text 'steve smith' -> 'Steve Smith')."""
  tok_text = " ".join(token for word in orig_text.split(" ") for token in _basic_tokens(word, lower_case))
  start = tok_text.find(pred_text)
  if start == -1 or not pred_text:
    return orig_text
  end = start + len(pred_text) - 1
  orig_ns_text, orig_ns_to_s = _strip_spaces(orig_text)
  tok_ns_text, tok_ns_to_s = _strip_spaces(tok_text)
  if len(orig_ns_text) != len(tok_ns_text):
    return orig_text
  tok_s_to_ns = {s: ns for ns, s in enumerate(tok_ns_to_s)}
  if start not in tok_s_to_ns or end not in tok_s_to_ns:
    return orig_text
  return orig_text[orig_ns_to_s[tok_s_to_ns[start]] : orig_ns_to_s[tok_s_to_ns[end]] + 1]


@functools.lru_cache(maxsize=1 << 16)
def _basic_tokens(word: str, lower_case: bool) -> tuple[str, ...]:
  """BasicTokenizer's tokens of one word. Text splits at spaces tokenize word by word, and a decoding aligns the
  same words over and over: memoised."""
  return tuple(wordpiece.basic_tokenize(word, lower_case))


def _strip_spaces(text: str) -> tuple[str, list[int]]:
  """`text` without its spaces, and the index in `text` of each of its characters."""
  kept = [i for i, char in enumerate(text) if char != " "]
  return "".join(text[i] for i in kept), kept


def _nbest_json(entries: list[tuple[str, float, float]]) -> list[dict]:
  """run_squad's nbest_predictions.json entries: text, probability (softmax over the n-best scores), logits."""
  scores = np.array([start + end for _, start, end in entries])
  probabilities = np.exp(scores - scores.max())
  probabilities /= probabilities.sum()
  return [
    {"text": text, "probability": float(p), "start_logit": float(start), "end_logit": float(end)}
    for (text, start, end), p in zip(entries, probabilities, strict=True)
  ]
