"""Google BERT's WordPiece tokenizer, exactly as `tokenization.py` of google-research/bert does it.

Text cleanup (NUL, U+FFFD and control characters dropped, whitespace normalised), CJK ideographs split into
words of their own, lower-casing and accent stripping for uncased vocabularies, punctuation split off, then
greedy longest-match-first WordPiece with `##` continuations and `[UNK]` for words over 100 characters.
"""

import unicodedata

MAX_INPUT_CHARS_PER_WORD = 100


def _is_whitespace(char: str) -> bool:
  return char in " \t\n\r" or unicodedata.category(char) == "Zs"


def _is_control(char: str) -> bool:
  if char in "\t\n\r":  # Whitespace, handled as such.
    return False
  return unicodedata.category(char) in ("Cc", "Cf")


def _is_punctuation(char: str) -> bool:
  cp = ord(char)
  # ASCII non-letters/digits count as punctuation even where Unicode says otherwise ("^", "$", "`").
  if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
    return True
  return unicodedata.category(char).startswith("P")


def _is_cjk(cp: int) -> bool:
  return (
    0x4E00 <= cp <= 0x9FFF
    or 0x3400 <= cp <= 0x4DBF
    or 0x20000 <= cp <= 0x2A6DF
    or 0x2A700 <= cp <= 0x2B73F
    or 0x2B740 <= cp <= 0x2B81F
    or 0x2B820 <= cp <= 0x2CEAF
    or 0xF900 <= cp <= 0xFAFF
    or 0x2F800 <= cp <= 0x2FA1F
  )


def _clean(text: str) -> str:
  out = []
  for char in text:
    cp = ord(char)
    if cp == 0 or cp == 0xFFFD or _is_control(char):
      continue
    out.append(" " if _is_whitespace(char) else char)
  return "".join(out)


def _space_cjk(text: str) -> str:
  return "".join(f" {char} " if _is_cjk(ord(char)) else char for char in text)


def _strip_accents(text: str) -> str:
  return "".join(char for char in unicodedata.normalize("NFD", text) if unicodedata.category(char) != "Mn")


def _split_punctuation(word: str) -> list[str]:
  pieces, current = [], []
  for char in word:
    if _is_punctuation(char):
      if current:
        pieces.append("".join(current))
        current = []
      pieces.append(char)
    else:
      current.append(char)
  if current:
    pieces.append("".join(current))
  return pieces


def basic_tokenize(text: str, lower_case: bool) -> list[str]:
  """Text -> words and punctuation marks (BERT's BasicTokenizer)."""
  words = []
  for word in _space_cjk(_clean(text)).split():
    if lower_case:
      word = _strip_accents(word.lower())
    words.extend(_split_punctuation(word))
  return " ".join(words).split()


def wordpiece(word: str, vocab: dict[str, int], unk_token: str) -> list[str]:
  """One word -> greedy longest-match-first pieces (`##` marks a continuation); `[UNK]` if any part fails."""
  if len(word) > MAX_INPUT_CHARS_PER_WORD:
    return [unk_token]
  pieces, start = [], 0
  while start < len(word):
    end = len(word)
    while end > start:
      piece = word[start:end] if start == 0 else "##" + word[start:end]
      if piece in vocab:
        break
      end -= 1
    if end == start:
      return [unk_token]
    pieces.append(piece)
    start = end
  return pieces


def load_vocab(path_or_lines) -> dict[str, int]:
  """A BERT `vocab.txt` (one token per line, id = line number) -> token to id."""
  lines = path_or_lines
  if isinstance(path_or_lines, str):
    from etils import epath  # Local and gs:// paths alike.

    content = epath.Path(path_or_lines).read_bytes()
    try:
      lines = content.decode("utf-8").splitlines()
    except UnicodeDecodeError as error:
      raise ValueError(
        f"{path_or_lines} is not UTF-8 at byte {error.start} ({content[error.start : error.start + 1]!r}); a "
        "WordPiece vocab.txt is UTF-8 text, one token a line."
      ) from None
  return {token.rstrip("\n"): index for index, token in enumerate(lines) if token.strip()}
