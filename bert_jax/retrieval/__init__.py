"""Embeddings and retrieval: BEIR-layout sets, retrieval metrics, exact search over the mesh, corpus embedding.
Above `handoff/` (it loads any source), below `train/` and `finetune/` (the retrieval probe of pretraining and the
contrastive task's dev metric use it)."""
