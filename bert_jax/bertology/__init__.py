"""What a pretrained encoder has learned (the BERTology analyses), over any source `pretrained.load` accepts: the
attention heads' statistics and maps (`attention.py`), the heads a fine-tuned model needs (`heads.py`), probes on
frozen layers and their scalar mix (`probe.py`), drawn by `plots.py`."""
