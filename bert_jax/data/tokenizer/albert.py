"""ALBERT's text preprocessing before SentencePiece, which ALBERT's published checkpoints were trained with
(google-research/albert tokenization.py, `preprocess_text` and `encode_pieces`; transformers' `AlbertTokenizer` applies
the same):

1. `remove_space`: leading and trailing whitespace dropped, every run of whitespace made one space;
2. always: "``" and "''" become '"';
3. unless `keep_accents`: NFKD, then combining marks dropped ("é" becomes "e");
4. `do_lower_case`: lower-cased;
5. after SentencePiece: a piece that ends in a digit and a comma ("▁1,") is encoded again without its comma, which
   becomes a piece of its own.

bert_jax's own SentencePiece models are trained on raw text and encode it raw. A model read from a Hugging Face
directory that asks for this preprocessing (`handoff/hf_tokenizer.py`) is encoded with it: the flags are
`SentencePieceTokenizer.albert_preprocessing`, recorded in the tokenizer's identity, so that they travel with its
checkpoints and bundles and a tokenizer without them is refused in their place.
"""

import unicodedata

# The flags, under transformers' names, with AlbertTokenizer's defaults (what it applies when a tokenizer_config.json
# is silent).
DEFAULTS = {"do_lower_case": True, "remove_space": True, "keep_accents": False}
_WORD_START = "\u2581"  # SentencePiece's "▁", which begins a word.


def flags(settings: dict, where: str) -> dict:
  """The three flags as `settings` (a tokenizer_config.json, a recorded identity) set them, AlbertTokenizer's defaults
  for any it does not name. Raises ValueError naming `where` for a value that is not a boolean."""
  found = {name: settings.get(name, default) for name, default in DEFAULTS.items()}
  wrong = {name: value for name, value in found.items() if not isinstance(value, bool)}
  if wrong:
    raise ValueError(f"{where}: ALBERT's preprocessing flags {wrong} are not booleans (true or false).")
  return found


def preprocess(text: str, flags: dict) -> str:
  """Steps 1-4 of the module docstring."""
  if flags["remove_space"]:
    text = " ".join(text.strip().split())
  text = text.replace("``", '"').replace("''", '"')
  if not flags["keep_accents"]:
    text = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
  return text.lower() if flags["do_lower_case"] else text


def encode(processor, text: str, flags: dict) -> list[int]:
  """The ids of `text` under the preprocessing `flags`, by the SentencePiece `processor` (steps 1-5)."""
  pieces = []
  for piece in processor.encode(preprocess(text, flags), out_type=str):
    if len(piece) > 1 and piece[-1] == "," and piece[-2].isdigit():
      again = processor.encode(piece[:-1].replace(_WORD_START, ""), out_type=str)
      if piece[0] != _WORD_START and again[0][0] == _WORD_START:  # Encoded alone, the digits gained a "▁".
        again = again[1:] if len(again[0]) == 1 else [again[0][1:], *again[1:]]
      pieces += [*again, ","]
    else:
      pieces.append(piece)
  return [processor.piece_to_id(piece) for piece in pieces]
