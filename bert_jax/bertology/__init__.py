"""What a pretrained encoder has learned (the BERTology analyses), over any source `pretrained.load` accepts: the
attention heads' statistics and maps (`attention.py`), drawn by `plots.py`."""
