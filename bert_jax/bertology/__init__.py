"""What a pretrained encoder has learned (the BERTology analyses), over any source `pretrained.load` accepts: the
attention heads' statistics and maps (`attention.py`), the heads a fine-tuned model needs (`heads.py`), probes on
frozen layers and their scalar mix (`probe.py`), the paper's feature-based tagger (`feature_based.py`), both trained
by `frozen.py`; figures by `plots.py`."""
