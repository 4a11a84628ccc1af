"""The model: the BERT encoder and its pretraining heads (`encoder.py`), its frozen config and the published sizes
(`bert_config.py`), the fine-tuning task heads (`heads.py`), the two layer layouts (`param_layout.py`) and the
attention kernels (`attention.py`). Pure Flax: nothing here reads a ConfigDict, a file or a batch source."""
