"""What a pretrained encoder's attention heads look at (`--mode=attention`), after Clark et al. 2019, "What Does BERT
Look At?".

Text lines (files by glob, local or `gs://`) become rows `[CLS] line [SEP]` of the model's own tokenizer (RoBERTa's
`<s> line </s>`), cut to `bertology.max_seq_length` tokens, and run through the encoder on the mesh with the XLA
attention kernel (the one that has probabilities). For every layer and head, over every real query token of every
line:

  entropy     the attention distribution's entropy, in nats (-sum p log p; 0: one key, log n: uniform over n)
  to_cls      the attention on the [CLS] token
  to_sep      the attention on [SEP] tokens
  to_previous the attention on the token before (0 for the first token)
  to_next     the attention on the token after (0 for the last)
  to_self     the attention on the token itself
  distance    the mean distance to the keys, in tokens (sum p |query - key|)

each the mean over query tokens, beside what attention spread evenly over each line's tokens would give (`uniform`:
entropy log n, [CLS] 1/n, distance about n/3; the mark a head's pattern stands out from). The sums leave the jitted
step per batch (`attention_sums`) and are added on the host in float64, so the means do not depend on the batch
size.

Output, in `bertology.output_dir` (which must be empty or absent): `attention.json` (the means, `[layer][head]`
from the first layer, the uniform marks, the source and counts), `attention_statistics.png` (a layers x heads heat
map per statistic) and, for each line in `bertology.show_lines`, `attention_map_line<N>.png` (every head's
attention matrix of that line).
"""

import dataclasses
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from bert_jax import paths, progress, sharding
from bert_jax.bertology import plots
from bert_jax.handoff import source_jobs
from bert_jax.model.encoder import BertModel, encoder_intermediates
from bert_jax.model.mesh_context import with_activation_rules

STATISTICS = ("entropy", "to_cls", "to_sep", "to_previous", "to_next", "to_self", "distance")


def attention_sums(probs, input_ids, input_mask, cls_id: int, sep_id: int) -> dict[str, jax.Array]:
  """Per layer and head, each statistic of the module docstring summed over the real query tokens, and `queries`
  (their count).

  probs: [layers, batch, heads, q, k] float32; input_ids, input_mask: [batch, seq] (mask 0: padding).
  Returns {statistic: [layers, heads], "queries": []}.
  """
  seq = probs.shape[-1]
  real = (input_mask > 0).astype(jnp.float32)  # [batch, seq]
  keys_are = lambda token: (input_ids == token).astype(jnp.float32)[None, :, None, None, :]
  positions = jnp.arange(seq)
  before = jnp.pad(jnp.diagonal(probs, offset=-1, axis1=-2, axis2=-1), [(0, 0)] * 3 + [(1, 0)])  # p[q, q - 1]
  after = jnp.pad(jnp.diagonal(probs, offset=1, axis1=-2, axis2=-1), [(0, 0)] * 3 + [(0, 1)])  # p[q, q + 1]
  per_query = dict(  # Each [layers, batch, heads, q].
    entropy=-jnp.sum(jnp.where(probs > 0, probs * jnp.log(jnp.where(probs > 0, probs, 1.0)), 0.0), -1),
    to_cls=jnp.sum(probs * keys_are(cls_id), -1),
    to_sep=jnp.sum(probs * keys_are(sep_id), -1),
    to_previous=before,
    to_next=after,
    to_self=jnp.diagonal(probs, axis1=-2, axis2=-1),
    distance=jnp.sum(probs * jnp.abs(positions[:, None] - positions[None, :]).astype(jnp.float32), -1),
  )
  weights = real[None, :, None, :]
  sums = {name: jnp.sum(value * weights, axis=(1, 3)) for name, value in per_query.items()}
  return dict(sums, queries=jnp.sum(real))


def uniform_attention(input_mask) -> jax.Array:
  """Attention spread evenly over a row's real tokens, every query: [1, batch, 1, seq, seq] (what a head that looks
  at nothing in particular would give; the baseline of each statistic)."""
  real = (input_mask > 0).astype(jnp.float32)  # [batch, seq]
  per_key = real / jnp.maximum(jnp.sum(real, -1, keepdims=True), 1.0)
  return jnp.broadcast_to(per_key[:, None, None, :], (real.shape[0], 1, real.shape[1], real.shape[1]))[None]


@dataclasses.dataclass
class _Rows:
  """Encoded lines waiting for a batch."""

  ids: list = dataclasses.field(default_factory=list)
  numbers: list = dataclasses.field(default_factory=list)  # Their line numbers.


def analyse(config, workdir: str) -> dict:
  """Writes the attention statistics of `config.bertology.input_pattern`'s lines (see the module docstring);
  returns what attention.json holds."""
  settings = config.bertology
  # The input is checked before the source is read (`source_jobs.start` names a pattern that matches no file): lines
  # to analyse (none would divide by zero queries), and each line to draw among them.
  inputs = paths.glob(settings.input_pattern)
  total_lines = sum(1 for _ in paths.text_lines(inputs))
  if inputs and not total_lines:
    raise ValueError(
      f"bertology.input_pattern={settings.input_pattern!r} matches {inputs}, which hold no lines: there is no "
      "attention to analyse."
    )
  beyond = [number for number in settings.show_lines if number >= total_lines]
  if inputs and beyond:
    raise ValueError(f"bertology.show_lines has {beyond}, but the input has {total_lines} lines (numbered from 0).")
  job = source_jobs.start(config, "bertology", workdir)
  files, output, mesh, loaded = job.files, job.output, job.mesh, job.loaded
  rules = config.logical_axis_rules
  # The probabilities exist only under the XLA kernel (the fused ones never hold them).
  model_cfg = dataclasses.replace(loaded.config, dtype=config.model.dtype, attention="xla")
  seq = settings.max_seq_length
  if seq > model_cfg.max_sequence_length:
    raise ValueError(f"bertology.max_seq_length={seq} exceeds the model's {model_cfg.max_sequence_text}.")
  tokenizer = loaded.tokenizer

  def probabilities(params, input_ids, input_mask):
    _, state = BertModel(model_cfg).apply(
      {"params": params}, input_ids, input_mask, jnp.zeros_like(input_ids), mutable=["intermediates"]
    )
    return encoder_intermediates(state["intermediates"], model_cfg)["attention_probs"]  # [L, B, H, S, S]

  def sums(params, input_ids, input_mask):
    probs = probabilities(params, input_ids, input_mask)
    found = attention_sums(probs, input_ids, input_mask, tokenizer.cls_id, tokenizer.sep_id)
    uniform = attention_sums(uniform_attention(input_mask), input_ids, input_mask, tokenizer.cls_id, tokenizer.sep_id)
    return dict(found, **{f"uniform_{name}": uniform[name][0, 0] for name in STATISTICS})

  batch_sharding = sharding.batch_sharding(mesh)
  param_shardings = jax.tree.map(lambda x: x.sharding, loaded.params["bert"])
  jitted = {
    name: jax.jit(with_activation_rules(fn, mesh, rules), in_shardings=(param_shardings, *[batch_sharding] * 2))
    for name, fn in (("sums", sums), ("probabilities", probabilities))
  }

  def batch_of(rows: list[list[int]]) -> dict:
    ids = np.full((settings.batch_size, seq), tokenizer.pad_id, np.int32)
    mask = np.zeros((settings.batch_size, seq), np.int32)
    for row, row_ids in enumerate(rows):
      ids[row, : len(row_ids)], mask[row, : len(row_ids)] = row_ids, 1
    return sharding.global_batch({"input_ids": ids, "input_mask": mask}, mesh)

  totals = {name: 0.0 for name in (*STATISTICS, *(f"uniform_{name}" for name in STATISTICS), "queries")}
  counts = dict(lines=0, tokens=0, truncated=0)
  shown = dict.fromkeys(settings.show_lines)
  pending = _Rows()
  start_time = last_log = time.perf_counter()

  def run_batch():
    batch = batch_of(pending.ids)
    found = jax.device_get(jitted["sums"](loaded.params["bert"], batch["input_ids"], batch["input_mask"]))
    for name, value in found.items():
      totals[name] = totals[name] + np.asarray(value, np.float64)
    if any(number in shown for number in pending.numbers):
      probs = jax.device_get(jitted["probabilities"](loaded.params["bert"], batch["input_ids"], batch["input_mask"]))
      for row, number in enumerate(pending.numbers):
        if number in shown:
          length = len(pending.ids[row])
          shown[number] = (pending.ids[row], np.asarray(probs[:, row, :, :length, :length], np.float32))
    counts["lines"] += len(pending.ids)
    counts["tokens"] += sum(len(ids) for ids in pending.ids)
    pending.ids.clear()
    pending.numbers.clear()

  for number, text in enumerate(paths.text_lines(files)):
    token_ids = tokenizer.encode(text)
    counts["truncated"] += len(token_ids) > seq - 2
    row_ids, _ = tokenizer.pair_row(token_ids[: seq - 2], [])
    pending.ids.append(row_ids)
    pending.numbers.append(number)
    if len(pending.ids) == settings.batch_size:
      run_batch()
      if time.perf_counter() - last_log > 10:
        last_log = time.perf_counter()
        logging.info("%s", _progress_row(counts, total_lines, last_log - start_time))
  if pending.ids:
    run_batch()
  logging.info("%s", _progress_row(counts, total_lines, time.perf_counter() - start_time))

  queries = totals.pop("queries")
  means = {name: (totals[name] / queries).tolist() for name in STATISTICS}
  uniform = {name: float(totals[f"uniform_{name}"] / queries) for name in STATISTICS}
  result = dict(
    source=loaded.source.path,
    source_format=loaded.source.format,
    inputs=files,
    max_seq_length=seq,
    layers=model_cfg.num_layers,
    heads=model_cfg.num_heads,
    query_tokens=int(queries),
    **counts,
    statistics=means,
    uniform=uniform,
  )
  output.mkdir(parents=True, exist_ok=True)
  with paths.staged_file(output / "attention_statistics.png") as local:
    what = f"the {int(queries):,} tokens of {counts['lines']:,} lines"
    plots.statistics_heatmaps({name: np.array(means[name]) for name in STATISTICS}, local, what)
  for number, found in shown.items():
    with paths.staged_file(output / f"attention_map_line{number}.png") as local:
      plots.attention_maps(found[1], [tokenizer.pieces[i] for i in found[0]], local, f"line {number}")
  paths.write_text(output / "attention.json", json.dumps(result, indent=1))
  logging.info(
    "Attention of %d lines (%d tokens, %d cut to %d) written to %s: attention.json, attention_statistics.png%s.",
    counts["lines"],
    counts["tokens"],
    counts["truncated"],
    seq,
    output,
    "".join(f", attention_map_line{number}.png" for number in shown),
  )
  return result


def _progress_row(counts: dict, total_lines: int, seconds: float) -> str:
  return progress.lines_row("attention", counts["lines"], total_lines, counts["tokens"], seconds)
