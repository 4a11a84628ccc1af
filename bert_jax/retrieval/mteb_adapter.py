"""A bert_jax model as mteb's encoder: `MtebEncoder(embedder)` has the `encode` and `similarity` that mteb 2.x's
`EncoderProtocol` asks for, so that `mteb.evaluate(MtebEncoder(...), tasks)` scores the model in-process.

mteb hands `encode` a torch DataLoader of batches whose `text` holds the texts (a document's title and text already
joined by mteb, a query's text) and says by `prompt_type` whether they are queries or documents: the embedder puts
the matching prompt of its settings before each (`Settings.query_prompt`, `document_prompt`). Every batch is
gathered first, so the embedder sorts and packs the whole set at once. Scores are dot products, as
`retrieval/search.py` ranks (cosine similarity for a normalised model).

mteb is not a dependency of bert_jax: this module imports nothing of it; its `ModelMeta` is made only when mteb asks
for `mteb_model_meta`, from within mteb.
"""

import numpy as np

from bert_jax.retrieval.embedder import Embedder


class MtebEncoder:
  """`embedder` as mteb's encoder, named `name` ("organisation/model", as mteb's model metadata wants it) in its
  results."""

  def __init__(self, embedder: Embedder, name: str = "bert_jax/model", revision: str = "local"):
    self.embedder, self.name, self.revision = embedder, name, revision

  @property
  def mteb_model_meta(self):
    """mteb's `ModelMeta` of this model: its name, embedding width, longest input and dot-product scores."""
    from mteb.models.model_meta import ModelMeta

    return ModelMeta.create_empty(
      dict(
        name=self.name,
        revision=self.revision,
        embed_dim=self.embedder.dim,
        max_tokens=self.embedder.max_seq_length,
        similarity_fn_name="dot",
        framework=["JAX"],
      )
    )

  def encode(self, inputs, *, task_metadata=None, hf_split=None, hf_subset=None, prompt_type=None, **kwargs):
    """The embeddings of every batch's `text` in `inputs` (mteb's DataLoader), as queries where `prompt_type` is
    mteb's `PromptType.query` ("query"), else as documents: [texts, dim] float32. mteb's other arguments (its task,
    split, subset, batch size) change nothing: the embedder's settings and batches hold."""
    texts = [text for batch in inputs for text in batch["text"]]
    kind = (
      "query" if prompt_type is not None and str(getattr(prompt_type, "value", prompt_type)) == "query" else "document"
    )
    return self.embedder.embed(texts, kind)

  def similarity(self, embeddings1, embeddings2) -> np.ndarray:
    """Dot products of every row of `embeddings1` [n1, dim] with every row of `embeddings2` [n2, dim]: [n1, n2]."""
    return np.asarray(embeddings1, np.float32) @ np.asarray(embeddings2, np.float32).T

  def similarity_pairwise(self, embeddings1, embeddings2) -> np.ndarray:
    """Dot products of row i of `embeddings1` with row i of `embeddings2`: [n]."""
    return np.sum(np.asarray(embeddings1, np.float32) * np.asarray(embeddings2, np.float32), axis=-1)
