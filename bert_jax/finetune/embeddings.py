"""The embeddings task (`finetune.task="embeddings"`): contrastive fine-tuning of sentence embeddings, as
sentence-transformers trains them with MultipleNegativesRankingLoss, for every architecture bert_jax has.

`finetune.data_dir` holds a BEIR-layout set (`retrieval/beir.py`: corpus.jsonl, queries.jsonl, qrels/dev.tsv), whose
dev split is evaluated every epoch (nDCG@10 by exact search over the mesh picks `best/`), and the training pairs:
a pairs file `train.jsonl`, `train.tsv` or `train.csv` (`pairs.py`), else the set's own qrels/train.tsv.

The model is the encoder alone (`heads.EmbeddingModel`: the embedding head, no output layer), pooled and normalised
by the run's `sentence_embedding.Settings` (config.embedding, else the source's, else mean and normalised); queries
get `query_prompt`, documents `document_prompt`. A training row is a pair: the query's, the positive's and each hard
negative's tokens (`query_*`, `document_*`, `negative_*` [rows, hard_negatives, seq]); each is one pass of the encoder
with its own dropout, and the loss (`contrastive_loss.py`) takes every document of the global batch as a candidate
for every query. The batches hold no text twice (`pairs.NoDuplicateBatches`). A dev split's rows are its queries,
then its corpus: their embeddings are the "logits" the job's prediction step returns, and the metrics and the
prediction file (the top 100 documents per query, BEIR's results as TSV) come from them.
"""

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath

from bert_jax import paths
from bert_jax.finetune import contrastive_loss, losses, pairs
from bert_jax.finetune.contract import Encoded, Task, encode_pair
from bert_jax.finetune.contrastive import Contrastive
from bert_jax.model import sentence_embedding
from bert_jax.model.bert_config import BertConfig
from bert_jax.model.heads import EmbeddingModel
from bert_jax.model.sentence_embedding import Settings
from bert_jax.retrieval import beir, search
from bert_jax.train.step import Loss

NAME = "embeddings"
COLUMNS = ("query", "document", "negative")  # A training row's texts: the features' prefixes.
RESULTS_K = 100  # Documents per query searched and written (nDCG@10, recall@100, MAP@100).


def run_settings(finetune, embedding, source: Settings | None = None) -> Settings:
  """How the run embeds: `config.embedding`'s keys where set, else the source's (`source`), else `Settings`'
  defaults; inputs of `finetune.max_seq_length` tokens."""
  return dataclasses.replace(sentence_embedding.settings(embedding, source), max_seq_length=finetune.max_seq_length)


def train_batch_shapes(batch_size: int, seq: int, hard_negatives: int) -> dict:
  """Feature name -> (shape, dtype) of a training batch: each column's model inputs and `weight`."""
  shapes = {"weight": ((batch_size,), np.float32)}
  for column in COLUMNS[:2] + (COLUMNS[2:] if hard_negatives else ()):
    rows = (batch_size, hard_negatives, seq) if column == "negative" else (batch_size, seq)
    shapes.update({f"{column}_{name}": (rows, np.int32) for name in losses.MODEL_INPUTS})
  return shapes


def _embed(params, batch: dict, column: str, model, dropout_key, index: int) -> jax.Array:
  """[rows, hidden] (negatives: [rows, n, hidden]) embeddings of `column`'s texts, with dropout stream `index`."""
  inputs = {name: batch[f"{column}_{name}"] for name in losses.MODEL_INPUTS}
  shape = inputs["input_ids"].shape
  inputs = {name: x.reshape(-1, shape[-1]) for name, x in inputs.items()}
  key = None if dropout_key is None else jax.random.fold_in(dropout_key, index)
  embeddings = losses.logits(params, inputs, model, key)
  return embeddings.reshape(*shape[:-1], embeddings.shape[-1])


def embeddings_loss(
  params, batch: dict, model, dropout_key=None, normalizers=None, *, contrastive: Contrastive
) -> tuple[jax.Array, dict]:
  """The contrastive loss of a batch of pairs (a step `Loss.value`): the mean over real rows (`weight`) of
  `contrastive_loss.contrastive_losses`; metrics: `task_loss` and `task_count`, and `task_accuracy`, the rows whose
  positive scores highest of every candidate of the batch."""
  queries = _embed(params, batch, "query", model, dropout_key, 0)
  positives = _embed(params, batch, "document", model, dropout_key, 1)
  negatives = _embed(params, batch, "negative", model, dropout_key, 2) if "negative_input_ids" in batch else None
  weight = batch["weight"]
  per_row = contrastive_loss.contrastive_losses(
    queries,
    positives,
    negatives,
    scale=contrastive.scale,
    symmetric=contrastive.symmetric,
    matryoshka_dims=contrastive.matryoshka_dims,
    weight=weight,
  )
  documents = (
    positives if negatives is None else jnp.concatenate([positives, negatives.reshape(-1, positives.shape[-1])])
  )
  scores = contrastive_loss.cosine_similarities(queries, documents)
  scores = jnp.where(jnp.tile(weight > 0, documents.shape[0] // weight.shape[0])[None, :], scores, -jnp.inf)
  correct = (jnp.argmax(scores, axis=1) == jnp.arange(weight.shape[0])).astype(jnp.float32)
  (count,) = _normalizers(dict(weight=weight)) if normalizers is None else normalizers
  metrics = dict(task_loss=jnp.sum(per_row), task_accuracy=jnp.sum(correct * weight), task_count=jnp.sum(weight))
  return jnp.sum(per_row) / count, metrics


def _normalizers(batch: dict) -> tuple[jax.Array]:
  """What the loss sum is divided by: the batch's real rows, at least 1e-5 (a batch of padding alone), as
  `contrastive_loss` divides, so the mean equals sentence-transformers' (no +1e-5 bias)."""
  return (jnp.maximum(jnp.sum(batch["weight"]), 1e-5),)


@dataclasses.dataclass(frozen=True)
class DevSet:
  """A dev split's judged set and how many of its encoded rows are queries (the corpus follows)."""

  beir_set: beir.BeirSet
  num_queries: int


class Embeddings(Task):
  """Contrastive fine-tuning of sentence embeddings on `data_dir` (see the module docstring)."""

  name = NAME
  head = "embedding"
  main_metric = "ndcg@10"
  eval_splits = ("dev",)

  def __init__(self, data_dir: str, contrastive: Contrastive, settings: Settings):
    if not data_dir:
      raise ValueError(f"finetune.task={NAME!r} reads a BEIR-layout set and pairs: set finetune.data_dir.")
    self.data_dir, self.contrastive, self.settings = data_dir, contrastive, settings

  def with_settings(self, settings: Settings) -> "Embeddings":
    """This task embedding by `settings` (the run's, once its source's are known)."""
    return Embeddings(self.data_dir, self.contrastive, settings)

  @property
  def hard_negatives(self) -> int:
    return self.contrastive.hard_negatives

  def read(self, split: str):
    if split == self.train_split:
      found = pairs.pairs_file(self.data_dir)
      if found is not None:
        return pairs.read_pairs(found, self.hard_negatives)
      if self.hard_negatives:
        raise ValueError(
          f"contrastive.hard_negatives={self.hard_negatives}, but {self.data_dir} has no pairs file "
          f"({', '.join(pairs.PAIRS_FILES)}) with negative columns: a BEIR set's qrels give pairs alone."
        )
      return pairs.beir_pairs(beir.read(self.data_dir, split))
    return beir.read(self.data_dir, split)

  def _rows(self, texts: list[str], prompt: str, tokenizer, max_seq_length: int) -> tuple[np.ndarray, ...]:
    """(input_ids, input_mask, segment_ids) [len(texts), max_seq_length] of `prompt` + each text, truncated."""
    rows = [encode_pair(tokenizer, tokenizer.encode(prompt + text), None, max_seq_length) for text in texts]
    if not rows:
      return tuple(np.zeros((0, max_seq_length), np.int32) for _ in range(3))
    return tuple(np.stack(column) for column in zip(*rows, strict=True))

  def encode(self, examples, tokenizer, max_seq_length: int) -> Encoded:
    if isinstance(examples, beir.BeirSet):  # A dev split: its queries, then its corpus.
      queries = self._rows(list(examples.queries.values()), self.settings.query_prompt, tokenizer, max_seq_length)
      documents = [examples.document_text(doc) for doc in examples.corpus]
      corpus = self._rows(documents, self.settings.document_prompt, tokenizer, max_seq_length)
      features = {name: np.concatenate([q, c]) for name, q, c in zip(losses.MODEL_INPUTS, queries, corpus, strict=True)}
      ids = [*examples.queries, *examples.corpus]
      return Encoded(features, ids, np.arange(len(ids), dtype=np.int32), DevSet(examples, len(examples.queries)))
    features = {}
    for column, prompt in zip(COLUMNS, (self.settings.query_prompt, self.settings.document_prompt), strict=False):
      texts = [pair.anchor if column == "query" else pair.positive for pair in examples]
      features.update(self._column(column, texts, prompt, tokenizer, max_seq_length))
    if self.hard_negatives:
      texts = [text for pair in examples for text in pair.negatives]
      flat = self._column("negative", texts, self.settings.document_prompt, tokenizer, max_seq_length)
      features.update({name: x.reshape(len(examples), self.hard_negatives, -1) for name, x in flat.items()})
    return Encoded(features, examples, np.arange(len(examples), dtype=np.int32), pairs.text_ids(examples))

  def _column(self, column: str, texts: list[str], prompt: str, tokenizer, max_seq_length: int) -> dict:
    """`column`'s features of `texts`, each distinct text tokenized once."""
    distinct = list(dict.fromkeys(texts))
    index = {text: i for i, text in enumerate(distinct)}
    rows = np.array([index[text] for text in texts], np.int64)
    encoded = self._rows(distinct, prompt, tokenizer, max_seq_length)
    return {f"{column}_{name}": x[rows] for name, x in zip(losses.MODEL_INPUTS, encoded, strict=True)}

  def _search(self, encoded: Encoded, logits: np.ndarray):
    dev: DevSet = encoded.extra
    return dev, logits[: dev.num_queries], logits[dev.num_queries :]

  def metrics(self, encoded: Encoded, logits: np.ndarray) -> dict[str, float]:
    """nDCG@10, MRR@10, recall@10 and @100, MAP@100 of exact search of the dev queries in its corpus."""
    dev, queries, corpus = self._search(encoded, logits)
    return search.retrieval_metrics(queries, corpus, dev.beir_set, k=RESULTS_K)

  def write_predictions(self, encoded: Encoded, logits: np.ndarray, path: str) -> None:
    """BEIR's results: `query-id<TAB>corpus-id<TAB>score` lines, each query's top 100 best first, after a header."""
    dev, queries, corpus = self._search(encoded, logits)
    results = search.search_results(queries, corpus, dev.beir_set, k=RESULTS_K)
    lines = ["query-id\tcorpus-id\tscore"]
    for query, scored in results.items():
      ranked = sorted(scored.items(), key=lambda item: -item[1])
      lines += [f"{query}\t{doc}\t{score:.6f}" for doc, score in ranked]
    paths.write_text(epath.Path(path), "\n".join(lines) + "\n")

  def content(self) -> dict:
    """The files read, by content: the pairs file (or qrels/train.tsv), the corpus, queries and dev qrels."""
    directory = epath.Path(self.data_dir)
    train = pairs.pairs_file(directory) or directory / "qrels" / f"{self.train_split}.tsv"
    files = [train, directory / "corpus.jsonl", directory / "queries.jsonl"]
    files += [directory / "qrels" / f"{split}.tsv" for split in self.eval_splits]
    return {
      os.path.relpath(os.fspath(path), os.fspath(directory)): paths.fingerprint(path) for path in files if path.exists()
    }

  def model(self, config: BertConfig):
    return EmbeddingModel(config, self.settings)

  def loss(self) -> Loss:
    return Loss(value=functools.partial(embeddings_loss, contrastive=self.contrastive), normalizers=_normalizers)

  def train_batch_shapes(self, batch_size: int, seq: int) -> dict:
    return train_batch_shapes(batch_size, seq, self.hard_negatives)

  @property
  def sequences_per_row(self) -> int:
    return 2 + self.hard_negatives

  def batches(self, train: Encoded, batch_size: int) -> pairs.NoDuplicateBatches:
    return pairs.NoDuplicateBatches(train.extra, batch_size)

  def record(self) -> dict:
    """The head, and how the model embeds (`embedding`: `Settings`' fields), which a later load reads."""
    return dict(super().record(), embedding=dataclasses.asdict(self.settings))
