"""What leaves a run and what comes in: what a pretrained source holds, from its metadata (`formats.py`), its
weights on a mesh in one call (`pretrained.py`), exports (`export.py`, its formats by name: `export_formats.py`),
feature extraction (`extract_features.py`), the Hugging Face and original Google BERT formats (`hf_format.py`,
`hf_names.py`, `hf_configs.py`, `hf_tokenizer.py`, `google_format.py`), sentence-transformers directories
(`sentence_transformers.py`), and the start of a job over a source
(`source_jobs.py`)."""
