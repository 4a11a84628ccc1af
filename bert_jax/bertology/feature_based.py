"""The BERT paper's feature-based use (`--mode=feature_based`): a token tagger trained on a frozen encoder's hidden
states, to compare with fine-tuning the whole model (Devlin et al. 2018, section 5.3: on CoNLL-2003 NER, the last
four layers concatenated came within 0.3 F1 of fine-tuning).

The task is `config.finetune`'s token task (CoNLL-2003's columns). The features are the hidden states of
`bertology.feature_layers` (counted as Google's extract_features.py counts them: -1 the last layer, 0 the
embeddings), concatenated or summed (`bertology.feature_combine`), for every token of a row; on them a
`bertology.lstm_layers`-layer bidirectional LSTM of `bertology.lstm_size` units each way (the paper: two layers of
768) and a linear layer give each token's tag scores, read on each word's first piece. It trains with Adam
(`bertology.probe_epochs`, `bertology.probe_learning_rate`) on the train split, the encoder frozen, and is scored on
the dev split with conlleval's F1.

Output, in `bertology.output_dir` (empty or absent): `feature_based.json` (the layers, how they were combined, the
tagger's sizes, the dev metrics).
"""

import dataclasses
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from absl import logging

from bert_jax import paths
from bert_jax.bertology import frozen
from bert_jax.finetune import tasks
from bert_jax.handoff import source_jobs
from bert_jax.handoff.extract_features import layer_indices


class BiLstmTagger(nn.Module):
  """Stacked bidirectional LSTMs over a row's tokens, then a tag score per token: [batch, seq, features] ->
  [batch, seq, num_labels]. Padding (beyond `lengths`) is never read by the backward direction."""

  lstm_size: int
  lstm_layers: int
  num_labels: int

  @nn.compact
  def __call__(self, x: jax.Array, lengths: jax.Array) -> jax.Array:
    for _ in range(self.lstm_layers):
      forward, backward = (nn.RNN(nn.OptimizedLSTMCell(self.lstm_size)) for _ in range(2))
      x = nn.Bidirectional(forward, backward)(x, seq_lengths=lengths)
    return nn.Dense(self.num_labels)(x)


def analyse(config, workdir: str) -> dict:
  """Trains and scores the tagger of the module docstring; writes and returns what feature_based.json holds."""
  settings = config.bertology
  task = tasks.make_task(config.finetune)
  if task.head != "token":
    raise ValueError(f"finetune.task={task.name!r} has a {task.head} head; --mode=feature_based tags tokens.")
  started = source_jobs.start(config, "bertology", workdir, lines=False)
  output, mesh, loaded = started.output, started.mesh, started.loaded
  model_cfg = dataclasses.replace(loaded.config, dtype=config.model.dtype)
  indices = layer_indices(settings.feature_layers, model_cfg.num_layers, "bertology.feature_layers")
  seq = config.finetune.max_seq_length
  train = task.encode(task.read(task.train_split), loaded.tokenizer, seq)
  split = task.eval_splits[0]
  evaluation = task.encode(task.read(split), loaded.tokenizer, seq)
  tagger = BiLstmTagger(settings.lstm_size, settings.lstm_layers, task.num_labels)
  width = model_cfg.hidden_size * (len(indices) if settings.feature_combine == "concat" else 1)

  def scores(params, encoder_params, batch):  # [batch, seq, num_labels]
    chosen = frozen.hidden_states(model_cfg, encoder_params, batch)[jnp.array(indices)]  # [chosen, B, S, H]
    features = jnp.concatenate(list(chosen), -1) if settings.feature_combine == "concat" else jnp.sum(chosen, 0)
    return tagger.apply({"params": params}, features, jnp.sum(batch["input_mask"] > 0, -1))

  def loss(params, encoder_params, batch):
    weights = batch["label_weights"] * batch["weight"][:, None]
    errors = optax.softmax_cross_entropy_with_integer_labels(scores(params, encoder_params, batch), batch["labels"])
    return jnp.sum(errors * weights) / (jnp.sum(weights) + 1e-9)

  init_inputs = (jnp.zeros((1, 2, width)), jnp.array([2]))
  fitted = frozen.fit(
    "feature_based",
    tagger.init(jax.random.key(config.seed), *init_inputs)["params"],
    loss,
    lambda params, encoder_params, batch: scores(params, encoder_params, batch)[None],
    loaded.params["bert"],
    train,
    evaluation,
    config,
    mesh,
  )
  metrics = task.metrics(evaluation, fitted.predictions[0])
  result = dict(
    source=loaded.source.path,
    source_format=loaded.source.format,
    task=task.name,
    split=split,
    layers=list(settings.feature_layers),
    combine=settings.feature_combine,
    feature_width=width,
    lstm_size=settings.lstm_size,
    lstm_layers=settings.lstm_layers,
    train_rows=train.num_rows,
    epochs=settings.probe_epochs,
    final_loss=fitted.final_loss,
    metric=task.main_metric,
    metrics=metrics,
  )
  output.mkdir(parents=True, exist_ok=True)
  paths.write_text(output / "feature_based.json", json.dumps(result, indent=1))
  logging.info(
    "Feature-based %s on layers %s (%s) of %s: %s %.4f on %s; written to %s.",
    task.name,
    list(settings.feature_layers),
    settings.feature_combine,
    loaded.source.path,
    task.main_metric,
    metrics[task.main_metric],
    split,
    output,
  )
  return result
