"""The input formats of corpus preparation by name (`data.input_format`) and the key each record format reads its
text by (`data.text_field`), checked without I/O: the config checks read them (the readers: `text.py` for text
files, `records.py` for JSONL, Parquet and Arrow)."""

# Text files: BERT's format (a sentence per line, a blank line between documents) or a document per file.
TEXT_FORMATS = ("bert", "document")
# Records, one document each, its text in the field or column `data.text_field`: JSON Lines, Parquet, and a Hugging
# Face dataset saved to disk (Arrow).
RECORD_FORMATS = ("jsonl", "parquet", "arrow")
INPUT_FORMATS = TEXT_FORMATS + RECORD_FORMATS


def check_input_format(data_config) -> None:
  """`data.input_format` is one of `INPUT_FORMATS`; a record format has a `data.text_field` and no TFDS dataset
  beside it (which reads `data.tfds_feature`)."""
  input_format = data_config.input_format
  if input_format not in INPUT_FORMATS:
    raise ValueError(f"data.input_format={input_format!r}; expected one of {INPUT_FORMATS}.")
  if input_format not in RECORD_FORMATS:
    return
  if not data_config.text_field:
    raise ValueError(
      f"data.text_field is empty; data.input_format={input_format!r} reads each record's text from the field (JSONL) "
      "or column (Parquet, Arrow) it names, e.g. 'text'."
    )
  if data_config.tfds_name:
    raise ValueError(
      f"data.input_format={input_format!r} reads data.input_pattern's files, and data.tfds_name="
      f"{data_config.tfds_name!r} is set too (a TFDS dataset reads data.tfds_feature): unset one of them."
    )
