"""The retrieval probe of pretraining: at each evaluation, how well the encoder being trained retrieves on a BEIR-layout
set (nDCG@10, MRR@10, recall@100), beside the masked-LM loss.

`RetrievalProbe.of(config, run, model_cfg, tokenizer)` is made with the job, before anything is compiled or written:
the set is read and checked there (`retrieval/beir.read`: a bad line is refused naming file:line), its queries cut
to `retrieval_probe.max_queries`, and one `Embedder` built over the run's mesh for the abstract `bert` subtree of
the run's parameters (ELECTRA's discriminator is `bert` too; scanned or not, as the run's). `measure(params)` then
embeds the queries and the whole corpus with the state's parameters as trained (float32, the run's compute dtype),
through the programs the first evaluation compiled (one per row width), and scores them by exact search on the mesh
(`retrieval/search.retrieval_metrics`).

The probe holds no state: a resumed run measures the same parameters the same way. Every host reads the same set
and builds the same batches (`Embedder.embed`), so all run the same programs on global arrays.
"""

import dataclasses

from bert_jax import sharding
from bert_jax.data.tokenizer import Tokenizer
from bert_jax.model import sentence_embedding
from bert_jax.model.bert_config import BertConfig
from bert_jax.retrieval import beir, search
from bert_jax.retrieval.embedder import Embedder
from bert_jax.train.run import Run

# What the probe adds to an evaluation's summary (TensorBoard's tags), from `search.retrieval_metrics`' names.
METRICS = {"retrieval_ndcg@10": "ndcg@10", "retrieval_mrr@10": "mrr@10", "retrieval_recall@100": "recall@100"}
SHOWN = "retrieval_ndcg@10"  # The one the console's evaluation line shows, as "ndcg@10".


class RetrievalProbe:
  """A BEIR set's judged queries (at most `max_queries`: the first, 0: all) and corpus, embedded by `embedder`."""

  def __init__(self, beir_set: beir.BeirSet, embedder: Embedder, mesh, max_queries: int = 0):
    if max_queries and max_queries < len(beir_set.queries):
      kept = dict(list(beir_set.queries.items())[:max_queries])
      beir_set = dataclasses.replace(beir_set, queries=kept, qrels={qid: beir_set.qrels[qid] for qid in kept})
    self.beir_set, self.embedder, self.mesh = beir_set, embedder, mesh
    self.documents = [beir_set.document_text(doc_id) for doc_id in beir_set.corpus]  # The corpus's order.
    self.queries = list(beir_set.queries.values())

  @classmethod
  def of(cls, config, run: Run, model_cfg: BertConfig, tokenizer: Tokenizer | None) -> "RetrievalProbe | None":
    """The probe `config.retrieval_probe` asks for (None when its data_dir is empty), for `run`'s `bert` parameters
    (`model_cfg`, the run's encoder) tokenized by `tokenizer`, the run's. Reads and checks the set: raises
    ValueError (or FileNotFoundError) naming the file and line of what BEIR's layout does not allow, and ValueError
    for a row width or batch the model or mesh cannot take."""
    settings = config.retrieval_probe
    if not settings.data_dir:
      return None
    if tokenizer is None:
      raise ValueError(
        f"retrieval_probe.data_dir={settings.data_dir!r} needs the run's tokenizer; data.source="
        f"{config.data.source!r} has none."
      )
    beir_set = beir.read(settings.data_dir, settings.split)
    abstract = sharding.with_shardings(run.abstract.params["bert"], run.shardings.params["bert"])
    embedder = Embedder(
      model_cfg,
      abstract,
      tokenizer,
      sentence_embedding.settings(config.embedding),
      settings.max_seq_length or config.data.max_seq_length,
      settings.batch_size or config.batch_size // config.num_microbatches,
      run.mesh,
      run.rules,
    )
    return cls(beir_set, embedder, run.mesh, settings.max_queries)

  def describe(self) -> str:
    """The run header's row: the set, what it holds and how it is embedded."""
    beir_set, embedder = self.beir_set, self.embedder
    pooling = embedder.settings.pooling + ("-pooled, normalised" if embedder.settings.normalized else "-pooled")
    return (
      f"{beir_set.directory} ({beir_set.split}): {len(self.queries):,} queries, {len(self.documents):,} documents; "
      f"nDCG@10 of {pooling} embeddings ({embedder.max_seq_length} tokens) at each evaluation"
    )

  def measure(self, params: dict) -> dict[str, float]:
    """`METRICS` of the encoder `params` (the train state's tree, its `bert` subtree embedding)."""
    encoder = params["bert"]
    queries = self.embedder.embed(self.queries, "query", params=encoder)
    corpus = self.embedder.embed(self.documents, "document", params=encoder)
    found = search.retrieval_metrics(queries, corpus, self.beir_set, k=100, mesh=self.mesh)
    return {name: found[measure] for name, measure in METRICS.items()}

  @staticmethod
  def shown(summary: dict) -> str:
    """The console's part of an evaluation line: " | ndcg@10 0.1234" where `summary` holds the probe's value."""
    return f" | ndcg@10 {summary[SHOWN]:.4f}" if SHOWN in summary else ""
