"""Texts -> sentence embeddings from any source, on the mesh: what `--mode=embed`, retrieval evaluation and the mteb
adapter compute.

Each text (after its kind's prompt: `Settings.query_prompt` or `document_prompt`, put before it as
sentence-transformers does) is tokenized by the model's tokenizer as a row of one text (`Tokenizer.pair_row` with no
second text: BERT's [CLS] text [SEP], RoBERTa's <s> text </s>), truncated to `max_seq_length` tokens with its special
tokens. The rows are then packed so that padding costs little:

* texts are sorted by length, longest first; a batch takes the next text's row width from a few fixed widths
  (`row_widths`: 16, 32, 64, ... up to max_seq_length), so jit compiles a few programs, not one per batch;
* a batch holds `batch_size x max_seq_length` token positions whatever its width (`batch_size x max_seq_length //
  width` rows): narrow rows cost less attention, and every batch is as large, but the last, which takes half, a
  quarter, ... of the rows where the texts left fill no more;
* the longest texts left go first-fit into the batch's rows, then the shortest fill the gaps they leave (texts
  sorted, two ends of one list); several texts to a row (at most `instances_per_row(width)`), each
  with its own positions from 0, its instance number in `input_mask` (the encoder attends within an instance only;
  ModernBERT's local window is a distance within the row, hence within the instance) and its first token in
  `cls_positions`; `model/sentence_embedding.sentence_embeddings` pools each instance.

The embeddings come back in input order. The packer is here rather than `data/packing.py`'s, which packs masked NSP
instances in tf.data (predictions, sentence labels, shuffled rows): inference needs neither TensorFlow nor those, and
its texts arrive sorted, so first-fit over one batch's rows is a few lines of numpy.
"""

import dataclasses
import time
from collections.abc import Sequence

import jax
import numpy as np
from absl import logging

from bert_jax import progress, sharding
from bert_jax.data.tokenizer import Tokenizer
from bert_jax.handoff import pretrained
from bert_jax.model import sentence_embedding
from bert_jax.model.bert_config import BertConfig
from bert_jax.model.encoder import BertModel
from bert_jax.model.mesh_context import with_activation_rules

KINDS = ("query", "document")
SMALLEST_ROW = 16  # The narrowest row width.
SHORTEST_TEXT = 4  # Tokens a text is assumed to take at least when a row's instance slots are counted.
PROGRESS_SECONDS = 10.0  # Between progress lines.


def row_widths(max_seq_length: int) -> tuple[int, ...]:
  """The row widths batches take: powers of two from `SMALLEST_ROW` below `max_seq_length`, then it."""
  widths, width = [], SMALLEST_ROW
  while width < max_seq_length:
    widths.append(width)
    width *= 2
  return (*widths, max_seq_length)


def instances_per_row(width: int) -> int:
  """How many texts a row of `width` tokens holds at most (its `cls_positions` slots)."""
  return max(1, width // SHORTEST_TEXT)


@dataclasses.dataclass(frozen=True)
class Batch:
  """One batch of packed rows: the arrays `sentence_embeddings` reads ([rows, width] and `cls_positions` [rows,
  instances]), and where each of its texts sits (`texts`, `rows`, `slots`: [texts] each)."""

  arrays: dict
  texts: np.ndarray
  rows: np.ndarray
  slots: np.ndarray
  tokens: int


class _Filling:
  """One batch being filled: `num_rows` rows of `width` tokens, at most `capacity` texts each."""

  def __init__(self, num_rows: int, width: int, capacity: int, pad_id: int):
    self.width, self.capacity = width, capacity
    self.used, self.counts = np.zeros(num_rows, np.int64), np.zeros(num_rows, np.int64)
    self.arrays = dict(
      input_ids=np.full((num_rows, width), pad_id, np.int32),
      input_mask=np.zeros((num_rows, width), np.int32),
      segment_ids=np.zeros((num_rows, width), np.int32),
      position_ids=np.zeros((num_rows, width), np.int32),
      cls_positions=np.zeros((num_rows, capacity), np.int32),
    )
    self.texts, self.rows, self.slots = [], [], []

  def place(self, text: int, ids: list[int]) -> bool:
    """Text number `text` (its row's `ids`) into the first row with room for it; False where none has."""
    length = len(ids)
    fits = np.flatnonzero((self.used + length <= self.width) & (self.counts < self.capacity))
    if not fits.size:
      return False
    row = fits[0]
    slot, offset = self.counts[row], self.used[row]
    self.arrays["input_ids"][row, offset : offset + length] = ids
    self.arrays["input_mask"][row, offset : offset + length] = slot + 1
    self.arrays["position_ids"][row, offset : offset + length] = np.arange(length)
    self.arrays["cls_positions"][row, slot] = offset
    self.used[row], self.counts[row] = offset + length, slot + 1
    self.texts.append(text)
    self.rows.append(row)
    self.slots.append(slot)
    return True

  def batch(self) -> Batch:
    return Batch(self.arrays, np.array(self.texts), np.array(self.rows), np.array(self.slots), int(self.used.sum()))


def _num_rows(full: int, min_rows: int, tokens_left: int, width: int) -> int:
  """A batch's rows: `full`, or the last batch's fewer (`full` halved while a multiple of `min_rows` that holds the
  `tokens_left` with room to spare), so that the end of the texts does not run a batch of padding."""
  rows = full
  while rows % 2 == 0 and (rows // 2) % min_rows == 0 and (rows // 2) * width >= 1.25 * tokens_left:
    rows //= 2
  return rows


def pack(rows: list[list[int]], max_seq_length: int, batch_size: int, pad_id: int, min_rows: int = 1) -> list[Batch]:
  """`rows` (each text's token ids, special tokens included, at most `max_seq_length`) packed into batches (see the
  module docstring) of a multiple of `min_rows` rows (the mesh's data-parallel devices); every text is in exactly one
  batch."""
  lengths = np.array([len(row) for row in rows], np.int64)
  if len(lengths) and lengths.max() > max_seq_length:
    text = int(np.argmax(lengths))
    raise ValueError(f"Row {text} has {lengths[text]} tokens; max_seq_length={max_seq_length} (truncate rows first).")
  order = np.argsort(-lengths, kind="stable")
  widths = row_widths(max_seq_length)
  tokens_left = int(lengths.sum())
  batches, head, tail = [], 0, len(order) - 1  # The longest and the shortest text not yet placed.
  while head <= tail:
    width = next(w for w in widths if w >= lengths[order[head]])
    num_rows = _num_rows(batch_size * max(1, max_seq_length // width), min_rows, tokens_left, width)
    filling = _Filling(num_rows, width, instances_per_row(width), pad_id)
    # The longest texts first, then the gaps they leave filled with the shortest.
    while head <= tail and filling.place(order[head], rows[order[head]]):
      head += 1
    while head <= tail and filling.place(order[tail], rows[order[tail]]):
      tail -= 1
    batches.append(filling.batch())
    tokens_left -= batches[-1].tokens
  return batches


class Embedder:
  """Embeds texts with one encoder: `model_config` (a `BertConfig`), its encoder `params` (a tree's `bert`, placed
  on `mesh` when there is one; or ShapeDtypeStructs in their shardings, `embed` then given the parameters each
  time), `tokenizer`, the embedding `settings` (pooling, normalisation, prompts), rows of at most `max_seq_length`
  tokens, `batch_size` rows of `max_seq_length` (or as many token positions in narrower rows) per batch, sharded over
  the `mesh`'s data axes (with its logical axis `rules`); without a mesh, on the default device."""

  def __init__(
    self,
    model_config: BertConfig,
    params: dict,
    tokenizer: Tokenizer,
    settings: sentence_embedding.Settings,
    max_seq_length: int,
    batch_size: int,
    mesh: jax.sharding.Mesh | None = None,
    rules=None,
  ):
    special = len(tokenizer.pair_row([], [])[0])
    if not special < max_seq_length <= model_config.max_sequence_length:
      raise ValueError(
        f"max_seq_length={max_seq_length}: expected more than the {special} special tokens of a row and at most the "
        f"model's {model_config.max_sequence_text}."
      )
    if batch_size < 1 or (mesh is not None and batch_size % sharding.data_parallel_size(mesh)):
      raise ValueError(
        f"batch_size={batch_size} must be positive and split over the "
        f"{1 if mesh is None else sharding.data_parallel_size(mesh)} data-parallel devices of the mesh."
      )
    self.model_config, self.params, self.tokenizer, self.settings = model_config, params, tokenizer, settings
    self.max_seq_length, self.batch_size, self.mesh = max_seq_length, batch_size, mesh
    self.dim = model_config.hidden_size
    self.last_stats = dict(texts=0, tokens=0, seconds=0.0)  # The last `embed`'s: texts, real tokens, seconds.
    encoder = BertModel(model_config)

    def embed(params, batch):
      return sentence_embedding.sentence_embeddings(encoder, params, batch, settings.pooling, settings.normalized)

    if mesh is None:
      self._embed = jax.jit(embed)
    else:
      self._embed = jax.jit(
        with_activation_rules(embed, mesh, rules or ()),
        in_shardings=(jax.tree.map(lambda x: x.sharding, params), sharding.batch_sharding(mesh)),
        out_shardings=sharding.replicated(mesh),  # Every host reads every embedding back.
      )

  def _global(self, arrays: dict) -> dict:
    """A batch every host holds whole -> global arrays, rows split over the mesh's batch axes (each host keeps its
    devices' rows)."""
    rows = sharding.batch_sharding(self.mesh)
    return {name: jax.make_array_from_process_local_data(rows, value, value.shape) for name, value in arrays.items()}

  @classmethod
  def from_source(cls, path: str, config) -> "Embedder":
    """The embedder of any source `pretrained.load` reads (a workdir, a bundle, a Hugging Face or sentence-transformers
    directory, ...), on `config.mesh`, with `config.embedding`'s settings over the source's recorded ones, and
    `config.embed`'s max_seq_length (0: the source's recorded one, else the model's longest) and batch_size."""
    sentence_embedding.settings(config.embedding)  # A bad value named before the source is read.
    mesh = sharding.make_mesh(config.mesh.to_dict())
    rules = config.logical_axis_rules
    loaded = pretrained.load(path, scan_layers=config.model.scan_layers, mesh=mesh, rules=rules)
    settings = sentence_embedding.settings(config.embedding, getattr(loaded, "embedding", None))
    model_config = dataclasses.replace(loaded.config, dtype=config.model.dtype)
    max_seq_length = config.embed.max_seq_length or settings.max_seq_length or model_config.max_sequence_length
    return cls(
      model_config,
      loaded.params["bert"],
      loaded.tokenizer,
      settings,
      max_seq_length,
      config.embed.batch_size,
      mesh,
      rules,
    )

  def rows(self, texts: Sequence[str], kind: str = "document") -> list[list[int]]:
    """Each text's row of token ids: its kind's prompt and the text, tokenized, truncated, with special tokens."""
    if kind not in KINDS:
      raise ValueError(f"kind={kind!r}; expected one of {KINDS}.")
    prompt = self.settings.query_prompt if kind == "query" else self.settings.document_prompt
    ids, counts = self.tokenizer.encode_batch([prompt + text for text in texts])
    keep = self.max_seq_length - len(self.tokenizer.pair_row([], [])[0])
    ends = np.cumsum(counts)
    return [
      self.tokenizer.pair_row(ids[end - count : end - count + min(count, keep)].tolist(), [])[0]
      for end, count in zip(ends, counts, strict=True)
    ]

  def embed(
    self, texts: Sequence[str], kind: str = "document", progress_label: str | None = None, params: dict | None = None
  ) -> np.ndarray:
    """The embeddings of `texts` as `kind` ("query" or "document"): [len(texts), dim] float32, in input order. With
    `progress_label`, a progress line (texts, tokens/s, ETA) every `PROGRESS_SECONDS` and at the end. `params`: other
    encoder parameters of the same tree and shardings (a training run's, at each evaluation), run by the programs
    already compiled; default: the embedder's own.

    Every host embeds every text: on several hosts each builds the same batches from the same `texts`, so all run
    the same programs on global arrays, and each gets every embedding back."""
    params = self.params if params is None else params
    self.last_stats = dict(texts=len(texts), tokens=0, seconds=0.0)
    out = np.zeros((len(texts), self.dim), np.float32)
    if not len(texts):
      return out
    start = last_log = time.perf_counter()
    min_rows = 1 if self.mesh is None else sharding.data_parallel_size(self.mesh)
    batches = pack(self.rows(texts, kind), self.max_seq_length, self.batch_size, self.tokenizer.pad_id, min_rows)
    done = tokens = 0
    for batch in batches:
      arrays = batch.arrays if self.mesh is None else self._global(batch.arrays)
      embeddings = np.asarray(jax.device_get(self._embed(params, arrays)))  # [rows, instances, dim]
      out[batch.texts] = embeddings[batch.rows, batch.slots]
      done, tokens = done + len(batch.texts), tokens + batch.tokens
      if progress_label and time.perf_counter() - last_log > PROGRESS_SECONDS:
        last_log = time.perf_counter()
        logging.info("%s", progress.lines_row(progress_label, done, len(texts), tokens, last_log - start, "texts"))
    self.last_stats.update(tokens=tokens, seconds=time.perf_counter() - start)
    if progress_label:
      logging.info(
        "%s", progress.lines_row(progress_label, done, len(texts), tokens, self.last_stats["seconds"], "texts")
      )
    return out
