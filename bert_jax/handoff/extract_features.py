"""Feature extraction (`--mode=features`): the paper's feature-based use of a pretrained encoder.

Text lines (files by glob, local or `gs://`) are tokenized with the model's own tokenizer and run through the
encoder, sharded over the mesh, in batches of windows. A line longer than one window (`max_seq_length` tokens
with [CLS] and [SEP]) is covered by windows `doc_stride` tokens apart, and each token's vectors come from the
window in which it has the most context on both sides, so nothing is cut: BERT's SQuAD windows and their rule
(`bert_jax.data.windows`, as SQuAD's encoding uses them).

The output is numpy's own `.npz` format, readable without bert_jax: `<output_dir>/features-NNNNN.npz`, each with

* `line_index` [lines] int64: the line's number in the input (files in sorted order, lines counted from 0);
* `token_offsets` [lines + 1] int64: line i's tokens are rows `token_offsets[i]:token_offsets[i + 1]` below;
* `token_ids` [tokens] int32 (no [CLS]/[SEP]);
* `token_vectors` [tokens, len(layers), hidden] float32: the hidden states of the chosen layers;
* `pooled` [lines, hidden] float32: the pooled [CLS] output of the line's first window;
* `layers` [len(layers)] int32: the layers, as configured (-1 the last, 0 the embeddings);

and `manifest.json`, written last: the source model, inputs, layers, shards, lines and tokens.
"""

import dataclasses
import io
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from etils import epath

from bert_jax import paths, progress, sharding
from bert_jax.data.windows import doc_spans, max_context_spans
from bert_jax.handoff import source_jobs
from bert_jax.model.encoder import BertModel, encoder_intermediates
from bert_jax.model.mesh_context import with_activation_rules


def layer_indices(layers, num_layers: int, key: str = "features.layers") -> list[int]:
  """Hidden-state indices (0: the embeddings, num_layers: the last layer) of `layers` counted as Google BERT's
  extract_features.py does (-1 the last layer, -2 the one before, ...; 0 the embeddings); `key` names them in the
  error."""
  indices = []
  for layer in layers:
    if not -(num_layers + 1) <= layer <= num_layers:
      raise ValueError(
        f"{key} has {layer}; this model has hidden states -{num_layers + 1}..{num_layers} "
        f"(0 and -{num_layers + 1}: the embeddings; -1 and {num_layers}: the last layer)."
      )
    indices.append(layer % (num_layers + 1))
  return indices


@dataclasses.dataclass
class _Line:
  index: int
  token_ids: np.ndarray
  vectors: np.ndarray  # [tokens, layers, hidden]
  best: np.ndarray  # [tokens] the window each token's vectors come from.
  windows_left: int
  pooled: np.ndarray | None = None


class _ShardWriter:
  def __init__(self, directory: epath.Path, layers: list[int]):
    self._directory, self._layers, self._lines, self.shards = directory, layers, [], []

  def add(self, line: _Line, lines_per_shard: int) -> None:
    self._lines.append(line)
    if len(self._lines) >= lines_per_shard:
      self.flush()

  def flush(self) -> None:
    if not self._lines:
      return
    lengths = [len(line.token_ids) for line in self._lines]
    arrays = dict(
      line_index=np.array([line.index for line in self._lines], np.int64),
      token_offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
      token_ids=np.concatenate([line.token_ids for line in self._lines]).astype(np.int32),
      token_vectors=np.concatenate([line.vectors for line in self._lines]).astype(np.float32),
      pooled=np.stack([line.pooled for line in self._lines]).astype(np.float32),
      layers=np.array(self._layers, np.int32),
    )
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    name = f"features-{len(self.shards):05d}.npz"
    (self._directory / name).write_bytes(buffer.getvalue())
    self.shards.append(name)
    self._lines = []


def extract(config, workdir: str) -> dict:
  """Writes the features of `config.features.input_pattern`'s lines; returns the manifest (see module docstring)."""
  settings = config.features
  job = source_jobs.start(config, "features", workdir)
  files, output, mesh, loaded = job.files, job.output, job.mesh, job.loaded
  rules = config.logical_axis_rules
  model_cfg = dataclasses.replace(loaded.config, dtype=config.model.dtype)
  if settings.max_seq_length > model_cfg.max_sequence_length:
    raise ValueError(
      f"features.max_seq_length={settings.max_seq_length} exceeds the model's {model_cfg.max_sequence_text}."
    )
  layers = list(settings.layers)
  indices = layer_indices(layers, model_cfg.num_layers)
  output.mkdir(parents=True, exist_ok=True)
  total_lines = sum(1 for _ in paths.text_lines(files))

  def encode(params, input_ids, input_mask):
    (_, pooled), state = BertModel(model_cfg).apply(
      {"params": params}, input_ids, input_mask, jnp.zeros_like(input_ids), mutable=["intermediates"]
    )
    hidden = encoder_intermediates(state["intermediates"], model_cfg)["hidden_states"]  # [layers + 1, B, S, H]
    chosen = hidden[jnp.array(indices)].astype(jnp.float32)
    return jnp.moveaxis(chosen, 0, 2), pooled.astype(jnp.float32)  # [B, S, layers, H], [B, H]

  batch_sharding = sharding.batch_sharding(mesh)
  param_shardings = jax.tree.map(lambda x: x.sharding, loaded.params["bert"])
  encode = jax.jit(
    with_activation_rules(encode, mesh, rules),
    in_shardings=(param_shardings, batch_sharding, batch_sharding),
    out_shardings=batch_sharding,
  )
  tokenizer, seq = loaded.tokenizer, settings.max_seq_length
  writer = _ShardWriter(output, layers)
  pending: list[tuple[_Line, int, int, int]] = []  # (line, window index, start, length)
  open_lines: list[_Line] = []
  stats = dict(lines=0, tokens=0, windows=0)
  start_time, last_log = time.perf_counter(), time.perf_counter()

  def run_batch():
    ids = np.full((settings.batch_size, seq), tokenizer.pad_id, np.int32)
    mask = np.zeros((settings.batch_size, seq), np.int32)
    for row, (line, _, start, length) in enumerate(pending):
      ids[row, : length + 2] = [tokenizer.cls_id, *line.token_ids[start : start + length], tokenizer.sep_id]
      mask[row, : length + 2] = 1
    batch = sharding.global_batch({"input_ids": ids, "input_mask": mask}, mesh)
    vectors, pooled = jax.device_get(encode(loaded.params["bert"], batch["input_ids"], batch["input_mask"]))
    for row, (line, window, start, length) in enumerate(pending):
      if window == 0:
        line.pooled = pooled[row]
      mine = np.flatnonzero(line.best[start : start + length] == window)
      line.vectors[start + mine] = vectors[row, 1 + mine]
      line.windows_left -= 1
    stats["windows"] += len(pending)
    pending.clear()
    while open_lines and open_lines[0].windows_left == 0:
      done = open_lines.pop(0)
      writer.add(done, settings.lines_per_shard)
      stats["lines"] += 1
      stats["tokens"] += len(done.token_ids)

  for index, text in enumerate(paths.text_lines(files)):
    token_ids = np.array(tokenizer.encode(text), np.int32)
    spans = doc_spans(len(token_ids), seq - 2, settings.doc_stride)
    line = _Line(
      index,
      token_ids,
      np.zeros((len(token_ids), len(layers), model_cfg.hidden_size), np.float32),
      max_context_spans(spans, len(token_ids)),
      len(spans),
    )
    open_lines.append(line)
    for window, (start, length) in enumerate(spans):
      pending.append((line, window, start, length))
      if len(pending) == settings.batch_size:
        run_batch()
        if time.perf_counter() - last_log > 10:
          last_log = time.perf_counter()
          logging.info(
            "%s", progress.lines_row("features", stats["lines"], total_lines, stats["tokens"], last_log - start_time)
          )
  if pending:
    run_batch()
  writer.flush()
  logging.info(
    "%s", progress.lines_row("features", stats["lines"], total_lines, stats["tokens"], time.perf_counter() - start_time)
  )
  manifest = dict(
    source=loaded.source.path,
    source_format=loaded.source.format,
    inputs=[str(path) for path in files],
    layers=layers,
    hidden_size=model_cfg.hidden_size,
    max_seq_length=seq,
    doc_stride=settings.doc_stride,
    shards=writer.shards,
    **stats,
  )
  (output / "manifest.json").write_text(json.dumps(manifest, indent=2))
  logging.info(
    "Wrote the features of %d lines (%d tokens) to %d shard(s) in %s.",
    stats["lines"],
    stats["tokens"],
    len(writer.shards),
    output,
  )
  return manifest


def _progress_row(stats: dict, total_lines: int, seconds: float) -> str:
  return progress.lines_row("features", stats["lines"], total_lines, stats["tokens"], seconds)
