"""Which attention heads a fine-tuned model needs (`--mode=heads`), after Michel et al. 2019, "Are Sixteen Heads
Really Better than One?", and `transformers`' bertology example.

A head mask xi [layers, heads] scales each head's output (`BertModel`'s `head_mask`; 1: the model as it is, 0: the
head pruned). A head's importance is the expected absolute gradient of the task loss with respect to its mask,
I_h = E |dL / d xi_h|, over the task's first evaluation split (GLUE: dev), in batches of `bertology.batch_size`:
the gradient of a batch's summed loss, its absolute value added up over the batches, divided by the rows. With
batch size 1 that is the paper's per-example estimate; larger batches (as transformers' example) take the absolute
value of a batch's gradient, which is faster and smaller. `bertology.normalize_importance` divides each layer's
scores by their L2 norm (the paper's normalisation) and then scales all of them to [0, 1], for ranking; the raw
scores are written too.

Pruning: from the full model, the `bertology.prune_step` share of all heads with the lowest importance among the
heads left is masked, the importance recomputed under the new mask, and the split's main metric measured, until
`bertology.prune_max` of the heads are gone. Nothing is retrained.

Output, in `bertology.output_dir` (empty or absent): `heads.json` (the importance, raw and normalised, as
`[layer][head]` from the first layer; the pruning table; the order heads were pruned in), `head_importance.png`
(layers x heads) and `pruning.png` (the main metric against the share of heads pruned).
"""

import dataclasses
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from bert_jax import paths, sharding
from bert_jax.bertology import plots
from bert_jax.finetune import losses, rows, tasks
from bert_jax.handoff import source_jobs
from bert_jax.model.mesh_context import with_activation_rules


def normalized(importance: np.ndarray) -> np.ndarray:
  """Michel et al.'s normalisation: each layer's scores over their L2 norm, then all scaled to [0, 1]."""
  per_layer = importance / (np.linalg.norm(importance, axis=-1, keepdims=True) + 1e-20)
  low, high = per_layer.min(), per_layer.max()
  return (per_layer - low) / (high - low) if high > low else np.ones_like(per_layer)


def analyse(config, workdir: str) -> dict:
  """Head importance and iterative pruning of the fine-tuned model `bertology.source` (else the workdir) on
  `config.finetune`'s task; writes and returns what heads.json holds (see the module docstring)."""
  settings = config.bertology
  task = tasks.make_task(config.finetune)
  started = source_jobs.start(config, "bertology", workdir, lines=False)
  output, mesh, loaded = started.output, started.mesh, started.loaded
  rules, source = config.logical_axis_rules, settings.source or workdir
  if loaded.task is None or loaded.task.task != task.name or loaded.task.head != task.head:
    found = "a pretrained model (no task head)" if loaded.task is None else f"fine-tuned on {loaded.task.task!r}"
    raise ValueError(
      f"bertology.source={source} is {found}; --mode=heads needs a model fine-tuned on finetune.task={task.name!r}."
    )
  model_cfg = dataclasses.replace(loaded.config, dtype=config.model.dtype)
  model = loaded.task.model(model_cfg)
  split = task.eval_splits[0]
  encoded = task.encode(task.read(split), loaded.tokenizer, config.finetune.max_seq_length)
  shape = (model_cfg.num_layers, model_cfg.num_heads)

  def gradient(head_mask, params, batch):  # d(the batch's summed loss) / d head_mask.
    summed = lambda mask: losses.task_loss(params, batch, model, normalizers=(1.0,), head=task.head, head_mask=mask)
    return jax.grad(lambda mask: summed(mask)[0])(head_mask)

  def predict(head_mask, params, batch):  # With a member axis of one, as rows.predict reads.
    return losses.logits(params, batch, model, head_mask=head_mask)[None]

  param_shardings = jax.tree.map(lambda x: x.sharding, loaded.params)
  replicated, batch_sharding = sharding.replicated(mesh), sharding.batch_sharding(mesh)
  jitted = {
    name: jax.jit(
      with_activation_rules(fn, mesh, rules),
      in_shardings=(replicated, param_shardings, batch_sharding),
      out_shardings=replicated,
    )
    for name, fn in (("gradient", gradient), ("predict", predict))
  }

  def importance_of(mask: np.ndarray) -> np.ndarray:
    total = np.zeros(shape, np.float64)
    for batch, _ in rows.row_batches(encoded, settings.batch_size, mesh):
      total += np.abs(np.asarray(jax.device_get(jitted["gradient"](jnp.asarray(mask), loaded.params, batch))))
    return total / encoded.num_rows

  def metric_of(mask: np.ndarray) -> float:
    predict_fn = lambda params, batch: jitted["predict"](jnp.asarray(mask), params, batch)
    logits = rows.predict(predict_fn, loaded.params, encoded, settings.batch_size, mesh)[0]
    return float(task.metrics(encoded, logits)[task.main_metric])

  heads = shape[0] * shape[1]
  per_step = max(1, round(heads * settings.prune_step))
  mask = np.ones(shape, np.float32)
  table, order = [], []
  start_time = time.perf_counter()
  first = importance_of(mask)  # The full model's: what heads.json and the figure report.
  while True:
    removed = int((mask == 0).sum())
    table.append(dict(heads_pruned=removed, share_pruned=removed / heads, **{task.main_metric: metric_of(mask)}))
    logging.info(
      "heads: %d of %d pruned (%.0f%%) | %s %.4f | %.0f s",
      removed,
      heads,
      100 * removed / heads,
      task.main_metric,
      table[-1][task.main_metric],
      time.perf_counter() - start_time,
    )
    if removed + per_step > settings.prune_max * heads + 1e-9:
      break
    importance = first if removed == 0 else importance_of(mask)  # Under the mask so far; none after the last step.
    scores = normalized(importance) if settings.normalize_importance else importance
    scores = np.where(mask == 0, np.inf, scores)
    lowest = np.argsort(scores, axis=None, kind="stable")[:per_step]
    order += [[int(i) // shape[1], int(i) % shape[1]] for i in lowest]
    mask.flat[lowest] = 0.0

  result = dict(
    source=loaded.source.path,
    source_format=loaded.source.format,
    task=task.name,
    split=split,
    rows=encoded.num_rows,
    batch_size=settings.batch_size,
    metric=task.main_metric,
    importance=first.tolist(),
    importance_normalized=normalized(first).tolist(),
    pruning=table,
    pruned_order=order,  # [layer, head] from 0, in the order they were masked.
  )
  output.mkdir(parents=True, exist_ok=True)
  shown = normalized(first) if settings.normalize_importance else first
  with paths.staged_file(output / "head_importance.png") as local:
    plots.head_importance(shown, local, f"{task.name} {split}, {encoded.num_rows:,} rows")
  with paths.staged_file(output / "pruning.png") as local:
    plots.pruning_curve(table, task.main_metric, local, f"{task.name} {split}")
  paths.write_text(output / "heads.json", json.dumps(result, indent=1))
  logging.info("Head importance and pruning of %s on %s written to %s.", source, task.name, output)
  return result
