"""The formats `--mode=export` writes (`export.format`), by name: nothing is imported, so the config checks read
them without the exporters (handoff/export.py)."""

# A bundle (params, bert_config.json, tokenizer, manifest); Hugging Face files; the original Google BERT files; the
# Hugging Face files as a sentence-transformers model (handoff/sentence_transformers.py).
FORMATS = ("bundle", "huggingface", "google", "sentence-transformers")
