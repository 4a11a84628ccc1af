"""Probing classifiers on frozen layers (`--mode=probe`), with Tenney et al. 2019's learned scalar mix ("BERT
Rediscovers the Classical NLP Pipeline").

The task is `config.finetune`'s: a sentence task (GLUE's readers: classification, or STS-B's regression) or a token
task (CoNLL-2003's columns: a tag per word, on its first piece). The encoder (any source `pretrained.load` reads)
stays frozen: every layer's hidden states (the embeddings' output as layer 0, then each layer's) are features,
pooled over a row's real tokens for a sentence task (`bertology.probe_pooling`: their mean, or [CLS]) and taken per
token for a token task. On them, trained together in one jitted step (the encoder runs once per batch), with Adam
for `bertology.probe_epochs` epochs of the train split:

  one linear probe per layer      softmax(h_l W_l + b_l) (regression: h_l w_l + b_l)
  the scalar mix                  gamma * sum_l softmax(s)_l h_l, then a linear probe: s and gamma learned with it

Each is scored on the task's first evaluation split with its official metric. The mix's weights say where the
task's information sits; their centre of gravity, sum_l l softmax(s)_l, is the "expected layer".

Output, in `bertology.output_dir` (empty or absent): `probe.json` (per layer the dev score; the mix's score, weights,
gamma and expected layer) and `probe.png` (the score by layer, with the mix's; the mix's weights).
"""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging

from bert_jax import paths
from bert_jax.bertology import frozen, plots
from bert_jax.finetune import tasks
from bert_jax.handoff import source_jobs

# The heads of the tasks a probe reads.
PROBED_HEADS = ("classification", "regression", "token")


def init_probes(key, layers: int, hidden: int, outputs: int) -> dict:
  """Parameters of one linear probe per layer (`layer_kernel` [layers, hidden, outputs], `layer_bias`) and of the
  scalar mix (`mix_weights` [layers] (softmaxed), `gamma` [], `mix_kernel` [hidden, outputs], `mix_bias`)."""
  keys = jax.random.split(key, 2)
  scale = 1.0 / np.sqrt(hidden)
  return dict(
    layer_kernel=scale * jax.random.normal(keys[0], (layers, hidden, outputs)),
    layer_bias=jnp.zeros((layers, outputs)),
    mix_weights=jnp.zeros((layers,)),
    gamma=jnp.ones(()),
    mix_kernel=scale * jax.random.normal(keys[1], (hidden, outputs)),
    mix_bias=jnp.zeros((outputs,)),
  )


def probe_outputs(probes: dict, features: jax.Array) -> jax.Array:
  """features [layers, batch, (seq,) hidden] -> outputs [layers + 1, batch, (seq,) outputs]: each layer's probe,
  then the scalar mix's."""
  per_layer = jnp.einsum("lb...h,lho->lb...o", features, probes["layer_kernel"])
  bias = probes["layer_bias"]  # [layers, outputs], broadcast over batch (and seq).
  per_layer = per_layer + bias.reshape(bias.shape[0], *[1] * (features.ndim - 2), bias.shape[1])
  weights = jax.nn.softmax(probes["mix_weights"])
  mixed = probes["gamma"] * jnp.einsum("l,lb...h->b...h", weights, features)
  mix = mixed @ probes["mix_kernel"] + probes["mix_bias"]
  return jnp.concatenate([per_layer, mix[None]])


def probe_loss(outputs: jax.Array, batch: dict, head: str) -> jax.Array:
  """The summed (over probes) mean loss over labelled rows (pieces, for the token head): cross-entropy, or squared
  error for regression. outputs: [probes, batch, (seq,) outputs]."""
  weights = batch["weight"]
  if head == "regression":
    errors = jnp.square(outputs[..., 0] - batch["label"][None])
  elif head == "token":
    weights = batch["label_weights"] * weights[:, None]
    labels = jnp.broadcast_to(batch["labels"], outputs.shape[:-1])
    errors = optax.softmax_cross_entropy_with_integer_labels(outputs, labels)
  else:
    labels = jnp.broadcast_to(batch["label"], outputs.shape[:-1])
    errors = optax.softmax_cross_entropy_with_integer_labels(outputs, labels)
  return jnp.sum(errors * weights[None]) / (jnp.sum(weights) + 1e-9)


def analyse(config, workdir: str) -> dict:
  """Trains and scores the probes of the module docstring; writes and returns what probe.json holds."""
  settings = config.bertology
  task = tasks.make_task(config.finetune)
  if task.head not in PROBED_HEADS:
    raise ValueError(
      f"finetune.task={task.name!r} has a {task.head} head; probing reads a sentence or token task (heads "
      f"{PROBED_HEADS})."
    )
  started = source_jobs.start(config, "bertology", workdir, lines=False)
  output, mesh, loaded = started.output, started.mesh, started.loaded
  model_cfg = dataclasses.replace(loaded.config, dtype=config.model.dtype)
  seq = config.finetune.max_seq_length
  train = task.encode(task.read(task.train_split), loaded.tokenizer, seq)
  split = task.eval_splits[0]
  evaluation = task.encode(task.read(split), loaded.tokenizer, seq)
  layers, outputs = model_cfg.num_layers + 1, 1 if task.head == "regression" else task.num_labels
  pooling = settings.probe_pooling

  def features(encoder_params, batch) -> jax.Array:  # [layers, batch, (seq,) hidden]
    hidden = frozen.hidden_states(model_cfg, encoder_params, batch)
    if task.head == "token":
      return hidden
    if pooling == "cls":
      return hidden[:, :, 0]
    real = (batch["input_mask"] > 0).astype(jnp.float32)[None, :, :, None]
    return jnp.sum(hidden * real, 2) / jnp.maximum(jnp.sum(real, 2), 1.0)

  def loss(probes, encoder_params, batch):
    return probe_loss(probe_outputs(probes, features(encoder_params, batch)), batch, task.head)

  def predict(probes, encoder_params, batch):  # [layers + 1, batch, ...]: a "member" per probe (rows.predict).
    out = probe_outputs(probes, features(encoder_params, batch))
    return out[..., 0] if task.head == "regression" else out

  fitted = frozen.fit(
    "probe",
    init_probes(jax.random.key(config.seed), layers, model_cfg.hidden_size, outputs),
    loss,
    predict,
    loaded.params["bert"],
    train,
    evaluation,
    config,
    mesh,
  )
  scored, probes, loss = fitted.predictions, fitted.params, fitted.final_loss
  scores = [float(task.metrics(evaluation, scored[i])[task.main_metric]) for i in range(layers + 1)]
  weights = np.asarray(jax.nn.softmax(probes["mix_weights"]), np.float64)
  result = dict(
    source=loaded.source.path,
    source_format=loaded.source.format,
    task=task.name,
    split=split,
    metric=task.main_metric,
    pooling=pooling if task.head != "token" else "token",
    train_rows=train.num_rows,
    epochs=settings.probe_epochs,
    layer_scores=scores[:layers],  # Layer 0: the embeddings.
    mix_score=scores[layers],
    mix_weights=weights.tolist(),
    gamma=float(probes["gamma"]),
    expected_layer=float(np.sum(np.arange(layers) * weights)),
    final_loss=loss,
  )
  output.mkdir(parents=True, exist_ok=True)
  with paths.staged_file(output / "probe.png") as local:
    plots.probe(result, local)
  paths.write_text(output / "probe.json", json.dumps(result, indent=1))
  logging.info(
    "Probes of %s on %s %s: best layer %d (%s %.4f), scalar mix %.4f, expected layer %.2f; written to %s.",
    loaded.source.path,
    task.name,
    split,
    int(np.argmax(scores[:layers])),
    task.main_metric,
    max(scores[:layers]),
    scores[layers],
    result["expected_layer"],
    output,
  )
  return result
