"""What leaves a run and what comes in: loading pretrained weights from any source (`pretrained.py`), exports
(`export.py`), feature extraction (`extract_features.py`), and the Hugging Face and original Google BERT
formats (`hf_format.py`, `google_format.py`)."""
