"""How masked-LM selection picks its tokens (`data.masking`), by name, and the older keys `data.whole_word_masking`
and `data.span_masking` read as before. Light: no TensorFlow, no file, so that the config checks, the pipeline and
the pipeline state's fingerprint share one owner of these names; the schemes themselves are `masking.SCHEMES` (a
test keeps the two equal)."""

from absl import logging

# data.masking (configs/default.py, docs/data.md): what one selection unit is. "tokens": BERT's, token by token;
# "words": a word's pieces together; "spans": SpanBERT's spans of whole words.
MASKINGS = ("tokens", "words", "spans")

# The older boolean keys, each with the scheme it asked for when True (False: not that scheme).
OLDER_KEYS = {"whole_word_masking": "words", "span_masking": "spans"}


def masking_scheme(data) -> str:
  """The masking scheme of `data` (`config.data`, or a checkpoint's saved config as a dict, which may predate
  `data.masking`). The older keys still speak where they were set: `span_masking=True` reads as "spans",
  `whole_word_masking=True` as "words", when `data.masking` is left at "tokens" (a config cannot tell that from
  "tokens" set on purpose, as with `data.instances`). `check_masking` refuses the settings that contradict each
  other."""
  scheme = data.get("masking") or "tokens"
  if scheme == "tokens" and data.get("span_masking"):
    return "spans"
  if scheme == "tokens" and data.get("whole_word_masking"):
    return "words"
  return scheme


def check_masking(data) -> None:
  """`data.masking` and the older keys beside it: a name of MASKINGS, and each older key that is set (True or False)
  agrees with the scheme; a note for each older key used, with the new spelling."""
  if data.masking not in MASKINGS:
    raise ValueError(f"data.masking={data.masking!r}; expected one of {MASKINGS}.")
  if data.whole_word_masking and data.span_masking:
    raise ValueError(
      "data.whole_word_masking=True and data.span_masking=True contradict each other (spans are always of whole "
      "words): set data.masking='spans' (or 'words') and leave both older keys unset."
    )
  scheme = masking_scheme(data)
  used = {key: data[key] for key in OLDER_KEYS if data[key] is not None}
  for key, value in used.items():
    if value != (OLDER_KEYS[key] == scheme):
      raise ValueError(
        f"data.{key}={value} contradicts data.masking={data.masking!r}: data.masking alone says how tokens are "
        "selected; leave the older key unset."
      )
  for key, value in used.items():
    logging.warning("data.%s=%s is deprecated: write data.masking=%r instead.", key, value, scheme)
