"""SQuAD's encoding, following Google BERT's `run_squad.py` (`convert_examples_to_features`): each context
tokenized word by word into a `Document`, and per question the document-stride windows
`[CLS] question [SEP] document piece [SEP]` (cut by `bert_jax.data.windows`) with the answer's first and last piece
in each; `Windows` keeps what decoding needs of them.

Tokenizers: the context's words are run_squad's whitespace words (`SquadExample.words`), and each word is tokenized on
its own, so every piece belongs to one word. SentencePiece pieces keep the case; the characters each piece covers in
its word are found when encoding (an `[UNK]` piece covers the characters up to the next known piece, since
SentencePiece merges a run of unknown characters into one), for decoding to cut an answer out of its words at those
piece boundaries.
"""

import dataclasses

import numpy as np

from bert_jax.data.windows import doc_spans, max_context_spans
from bert_jax.finetune.contract import Encoded, pad_row

_WORD_START = "\u2581"  # SentencePiece's word-start mark.


@dataclasses.dataclass(frozen=True)
class Document:
  """A context's word pieces: `ids`, `pieces` (their strings), `tok_to_orig` [pieces] (each piece's word),
  `orig_to_tok` [words] (each word's first piece), and for SentencePiece `char_spans` [pieces, 2], the characters
  of its word each piece covers (-1 where the word's pieces could not be aligned to it)."""

  ids: list[int]
  pieces: list[str]
  tok_to_orig: np.ndarray
  orig_to_tok: np.ndarray
  char_spans: np.ndarray | None


@dataclasses.dataclass(frozen=True)
class Windows:
  """`Encoded.extra` of SQuAD: what decoding needs besides the logits.

  Per row: `doc_start` (the example's first document piece in the window), `doc_length` (its pieces in the window),
  `doc_offset` (the row position of the first, after [CLS] question [SEP]), all [rows] int32, and
  `token_is_max_context` [rows, seq] bool (run_squad's: the window where this piece has the most context on both
  sides). Per example: `documents`. `kind` and `lower_case`: the tokenizer's, for the de-tokenisation.
  """

  documents: list[Document]
  doc_start: np.ndarray
  doc_length: np.ndarray
  doc_offset: np.ndarray
  token_is_max_context: np.ndarray
  kind: str
  lower_case: bool

  def token_to_orig_map(self, row: int, document: Document) -> np.ndarray:
    """[seq] int32: run_squad's token_to_orig_map of a row, the context word at each position (-1 off the
    document); `document`: that of the row's example, `documents[row_example[row]]`."""
    mapping = np.full(self.token_is_max_context.shape[1], -1, np.int32)
    start, length, offset = self.doc_start[row], self.doc_length[row], self.doc_offset[row]
    mapping[offset : offset + length] = document.tok_to_orig[start : start + length]
    return mapping


def encode_examples(examples: list, tokenizer, max_seq_length: int, max_query_length: int, doc_stride: int) -> Encoded:
  """run_squad's `convert_examples_to_features`: per example, windows [CLS] question [SEP] document pieces [SEP]
  of at most max_seq_length pieces (segments 0, then 1), each `doc_stride` pieces after the last; the question is
  cut to `max_query_length` pieces. features: input_ids, input_mask, segment_ids [rows, seq] int32, start_positions,
  end_positions [rows] int32 (the answer's first and last piece in the row; 0, the [CLS], where the window does not
  hold the whole answer, for impossible questions and where no answer matches the context). extra: `Windows`.
  `examples`: `squad.SquadExample`s."""
  if tokenizer.kind not in ("wordpiece", "sentencepiece"):
    raise ValueError(
      f"SQuAD's answer spans need a WordPiece or SentencePiece tokenizer; this one is kind {tokenizer.kind!r} (a "
      "byte-level BPE's word boundaries are not marked the way the span search reads them)."
    )
  kind = tokenizer.kind
  rows, layout, documents, word_cache, document_cache = [], [], [], {}, {}
  for index, example in enumerate(examples):
    if example.words not in document_cache:  # A paragraph's questions share its tokenized context.
      document_cache[example.words] = tokenize_document(example.words, tokenizer, word_cache)
    document = document_cache[example.words]
    documents.append(document)
    query = tokenizer.encode(example.question)[:max_query_length]
    max_tokens_for_doc = max_seq_length - len(query) - 3
    if max_tokens_for_doc < 1:
      raise ValueError(
        f"max_seq_length={max_seq_length} leaves no room for the context after {example.qid!r}'s question of "
        f"{len(query)} pieces (max_query_length={max_query_length})."
      )
    answer = _token_answer(example, document, tokenizer, kind)
    spans = doc_spans(len(document.ids), max_tokens_for_doc, doc_stride)
    owner = max_context_spans(spans, len(document.ids))
    for span, (start, length) in enumerate(spans):
      rows.append(_row(tokenizer, query, document.ids[start : start + length], start, answer, max_seq_length))
      layout.append((index, start, length, len(query) + 2, owner[start : start + length] == span))
  return Encoded(
    _features(rows, max_seq_length),
    list(examples),
    _column(layout, 0),
    _windows(layout, documents, tokenizer, kind, max_seq_length),
  )


def _features(rows: list[tuple], max_seq_length: int) -> dict[str, np.ndarray]:
  features = {
    name: np.array([row[i] for row in rows], np.int32).reshape(-1, max_seq_length)
    for i, name in enumerate(("input_ids", "input_mask", "segment_ids"))
  }
  features["start_positions"] = np.array([row[3] for row in rows], np.int32)
  features["end_positions"] = np.array([row[4] for row in rows], np.int32)
  return features


def _column(layout: list[tuple], i: int) -> np.ndarray:
  return np.array([entry[i] for entry in layout], np.int32)


def _windows(layout: list[tuple], documents: list[Document], tokenizer, kind: str, max_seq_length: int) -> Windows:
  token_is_max_context = np.zeros((len(layout), max_seq_length), bool)
  for row, (_, _, length, offset, max_context) in enumerate(layout):
    token_is_max_context[row, offset : offset + length] = max_context
  return Windows(
    documents=documents,
    doc_start=_column(layout, 1),
    doc_length=_column(layout, 2),
    doc_offset=_column(layout, 3),
    token_is_max_context=token_is_max_context,
    kind=kind,
    lower_case=bool(getattr(tokenizer, "lower_case", False)),
  )


def _row(tokenizer, query: list[int], window_ids: list[int], start: int, answer, max_seq_length: int) -> tuple:
  """(input_ids, input_mask, segment_ids, start_position, end_position) of one window whose first document piece
  is the document's `start`th; `answer`: the (first, last) document piece of the answer, or None."""
  ids = [tokenizer.cls_id, *query, tokenizer.sep_id, *window_ids, tokenizer.sep_id]
  segments = [0] * (len(query) + 2) + [1] * (len(window_ids) + 1)
  start_position = end_position = 0
  if answer is not None and start <= answer[0] and answer[1] < start + len(window_ids):
    offset = len(query) + 2
    start_position, end_position = answer[0] - start + offset, answer[1] - start + offset
  return (*pad_row(ids, segments, max_seq_length, tokenizer.pad_id), start_position, end_position)


def tokenize_document(words: tuple[str, ...], tokenizer, cache: dict | None = None) -> Document:
  """The pieces of each word on its own (`tokenizer.encode(word)`: WordPiece gives its `tokenize` pieces); `cache`
  {word: (ids, char spans)} spares re-tokenizing a word seen before."""
  cache = {} if cache is None else cache
  sentencepiece = tokenizer.kind != "wordpiece"
  ids, tok_to_orig, orig_to_tok, spans = [], [], [], []
  for w, word in enumerate(words):
    if word not in cache:
      word_ids = tokenizer.encode(word)
      cache[word] = word_ids, (_char_spans(word, word_ids, tokenizer) if sentencepiece else None)
    word_ids, word_spans = cache[word]
    orig_to_tok.append(len(ids))
    ids += word_ids
    tok_to_orig += [w] * len(word_ids)
    spans += word_spans or [(-1, -1)] * len(word_ids)
  return Document(
    ids=ids,
    pieces=[tokenizer.pieces[i] for i in ids],
    tok_to_orig=np.array(tok_to_orig, np.int32),
    orig_to_tok=np.array(orig_to_tok, np.int32),
    char_spans=np.array(spans, np.int32).reshape(-1, 2) if sentencepiece else None,
  )


def _char_spans(word: str, ids: list[int], tokenizer) -> list[tuple[int, int]] | None:
  """The [begin, end) characters of `word` each SentencePiece piece covers, or None where the pieces do not spell
  the word. A piece's text is the piece without the word-start mark; an `[UNK]` piece (a run of unknown
  characters) covers the characters up to where the next known piece's text begins."""
  texts = [None if i == tokenizer.unk_id else tokenizer.pieces[i].removeprefix(_WORD_START) for i in ids]
  spans, position = [], 0
  for k, text in enumerate(texts):
    if text is None:
      following = next((t for t in texts[k + 1 :] if t), None)
      end = len(word) if following is None else word.find(following, position + 1)
    else:
      end = position + len(text) if word.startswith(text, position) else -1
    if end < position or (text is None and end == position):
      return None
    spans.append((position, end))
    position = end
  return spans if position == len(word) else None


def _token_answer(example, document: Document, tokenizer, kind: str) -> tuple[int, int] | None:
  """The (first, last) document piece of the example's answer (run_squad's tok_start/end_position, improved), or
  None without one."""
  if example.start_word < 0:
    return None
  start = int(document.orig_to_tok[example.start_word])
  following = example.end_word + 1
  end = int(document.orig_to_tok[following]) - 1 if following < len(example.words) else len(document.ids) - 1
  if end < start:  # The answer's words have no piece.
    return None
  answer_pieces = [tokenizer.pieces[i] for i in tokenizer.encode(example.answer_text)]
  return improve_answer_span(document.pieces, start, end, answer_pieces, kind)


def improve_answer_span(
  doc_pieces: list[str], start: int, end: int, answer_pieces: list[str], kind: str
) -> tuple[int, int]:
  """run_squad's `_improve_answer_span`: the first (leftmost, then longest) piece span inside the answer's words
  [start, end] whose pieces read as the answer's own pieces ('(1895-1943).' -> '1895'); else [start, end].
  WordPiece spans compare as run_squad's (pieces joined by spaces); SentencePiece spans compare as text (pieces
  joined, word-start marks as spaces), so that '▁18 95' matches '18 95' inside a word, and never start or end
  with a bare word-start piece."""
  answer = _pieces_text(answer_pieces, kind)
  for new_start in range(start, end + 1):
    for new_end in range(end, new_start - 1, -1):
      span = doc_pieces[new_start : new_end + 1]
      if kind != "wordpiece" and _WORD_START in (span[0], span[-1]):
        continue
      if _pieces_text(span, kind) == answer:
        return new_start, new_end
  return start, end


def _pieces_text(pieces: list[str], kind: str) -> str:
  if kind == "wordpiece":
    return " ".join(pieces)
  return " ".join("".join(pieces).replace(_WORD_START, " ").split())
