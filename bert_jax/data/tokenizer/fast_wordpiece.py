"""Google BERT's WordPiece for many texts at once, compiled: TensorFlow Text's FastBertTokenizer (linear-time
WordPiece, C++), with the text cleanup done by TensorFlow string ops so that the ids equal `wordpiece.py`'s.

FastBertTokenizer's own normaliser differs from Google's `tokenization.py` (it applies compatibility
decomposition: "…" becomes "...", full-width letters ASCII; it keeps NUL and U+FFFD); here the text is cleaned as
Google does (tab/CR/LF to spaces; NUL, U+FFFD, Cc and Cf dropped; uncased: lower-case, NFD, Mn dropped) and
FastBertTokenizer only splits and looks pieces up. Google maps a word of more than 100 characters to [UNK];
FastBertTokenizer counts bytes, so it is given room (400 bytes, four per character) and the rare text with a word
that may be longer is tokenized by `wordpiece.py` instead: a byte scan flags runs of more than 100 bytes between
ASCII spaces and punctuation, and a word split of the flagged texts finds the ones with a word of more than 100
characters. `tests/test_tokenizer.py` checks the ids against `wordpiece.py` on the edge cases;
`python -m bert_jax.benchmarks.prepare_throughput --check` on whole corpora.
"""

from collections.abc import Callable

import numpy as np

MAX_CHARS_PER_WORD = 100  # wordpiece.MAX_INPUT_CHARS_PER_WORD
_CJK = (
  r"\x{4E00}-\x{9FFF}\x{3400}-\x{4DBF}\x{20000}-\x{2A6DF}\x{2A700}-\x{2B73F}\x{2B740}-\x{2B81F}"
  r"\x{2B820}-\x{2CEAF}\x{F900}-\x{FAFF}\x{2F800}-\x{2FA1F}"
)
# What ends a word in Google's BasicTokenizer: whitespace, Unicode punctuation, ASCII symbols, CJK ideographs.
_WORD_DELIMITER = r"[\s\p{Z}\p{P}!-/:-@\[-`{-~" + _CJK + "]"
# The bytes that surely end a word: ASCII space and ASCII punctuation (the byte scan's separators).
_SEPARATOR_BYTES = np.zeros(256, bool)
_SEPARATOR_BYTES[[32, *range(33, 48), *range(58, 65), *range(91, 97), *range(123, 127)]] = True


class FastWordPiece:
  """`texts -> (ids, lengths)`: every text's ids, concatenated (int64), and how many each text has."""

  def __init__(self, pieces: list[str], lower_case: bool, reference: Callable[[str], list[int]]):
    from bert_jax.tensorflow_cpu import text, tf

    tf_text = text()

    self._lower_case, self._reference = lower_case, reference
    self._tokenizer = tf_text.FastBertTokenizer(
      # Ids a vocab.txt leaves empty (blank lines) get a piece no text can produce (words have no spaces).
      [piece or f" unused {index}" for index, piece in enumerate(pieces)],
      token_out_type=tf.int64,
      unknown_token="[UNK]",
      max_bytes_per_word=4 * MAX_CHARS_PER_WORD,
    )

  def _clean(self, texts):
    from bert_jax.tensorflow_cpu import text, tf

    tf_text = text()

    cleaned = tf.strings.regex_replace(texts, r"[\t\n\r]", " ")
    cleaned = tf.strings.regex_replace(cleaned, r"[\x00\x{FFFD}\p{Cc}\p{Cf}]", "")
    if self._lower_case:
      cleaned = tf.strings.lower(cleaned, encoding="utf-8")
      cleaned = tf_text.normalize_utf8(cleaned, "NFD")
      cleaned = tf.strings.regex_replace(cleaned, r"\p{Mn}", "")
    return cleaned

  def _long_word_rows(self, cleaned) -> np.ndarray:
    """The rows with a word of more than 100 characters."""
    from bert_jax.tensorflow_cpu import text, tf

    tf_text = text()

    strings = cleaned.numpy().tolist()
    lengths = np.fromiter(map(len, strings), np.int64, len(strings))
    buffer = np.frombuffer(b" ".join(strings), np.uint8)
    separators = np.flatnonzero(np.concatenate([[True], _SEPARATOR_BYTES[buffer], [True]]))
    # A run's last byte: the separator after it, less one, less one more for the leading sentinel.
    run_ends = separators[1:][np.diff(separators) > MAX_CHARS_PER_WORD + 1] - 2
    if not len(run_ends):
      return np.zeros(0, np.int64)
    row_starts = np.cumsum(lengths + 1) - lengths - 1
    candidates = np.unique(np.searchsorted(row_starts, run_ends, side="right") - 1)
    words = tf_text.regex_split(tf.gather(cleaned, candidates), _WORD_DELIMITER)
    too_long = tf.reduce_any(tf.strings.length(words, unit="UTF8_CHAR") > MAX_CHARS_PER_WORD, axis=-1)
    return candidates[too_long.numpy()]

  def __call__(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    from bert_jax.tensorflow_cpu import tf

    if not texts:
      return np.zeros(0, np.int64), np.zeros(0, np.int64)
    cleaned = self._clean(tf.constant(texts))
    tokens = self._tokenizer.tokenize(cleaned)
    ids, lengths = tokens.flat_values.numpy(), tokens.row_lengths().numpy()
    long_rows = self._long_word_rows(cleaned)
    if not len(long_rows):
      return ids, lengths
    rows = np.split(ids, np.cumsum(lengths)[:-1])
    for row in long_rows:
      rows[row] = np.array(self._reference(texts[row]), np.int64)
    return np.concatenate(rows), np.array([len(r) for r in rows], np.int64)
