"""Feature extraction: every layer's hidden states on request (free otherwise), and `--mode=features`' shards."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import jobs
from bert_jax.data.pretraining_batch import pretraining_shapes
from bert_jax.data.windows import doc_spans, max_context_spans
from bert_jax.handoff import extract_features, pretrained
from bert_jax.model.encoder import BertModel, encoder_intermediates
from bert_jax.train import pretraining


def _compiled_train_step(small_config, small_model_config):
  small_config.mesh.update(data=1, fsdp=1, tensor=1)
  run = pretraining.make_run(small_config, jax.devices()[:1], small_model_config)
  batch = {name: jax.ShapeDtypeStruct(shape, dtype) for name, (shape, dtype) in pretraining_shapes(8, 32, 5).items()}
  compiled = run.train_step.lower(run.abstract, batch, jax.random.key(0)).compile()
  memory = compiled.memory_analysis()
  return compiled.cost_analysis()["flops"], memory.temp_size_in_bytes, memory.output_size_in_bytes


@pytest.mark.slow
def test_collecting_hidden_states_costs_the_train_step_nothing(small_config, small_model_config, monkeypatch):
  with_sow = _compiled_train_step(small_config, small_model_config)
  monkeypatch.setattr(nn.Module, "sow", lambda self, *args, **kwargs: False)  # As if the model never collected.
  assert _compiled_train_step(small_config, small_model_config) == with_sow


def _encode_window(model_cfg, params, ids):
  ids = jnp.asarray([ids], jnp.int32)
  (_, pooled), state = BertModel(model_cfg).apply(
    {"params": params}, ids, jnp.ones_like(ids), jnp.zeros_like(ids), mutable=["intermediates"]
  )
  return encoder_intermediates(state["intermediates"], model_cfg)["hidden_states"][:, 0], pooled[0]


@pytest.mark.slow
def test_features_of_text_lines_are_the_encoders_hidden_states_of_their_best_windows(
  small_config, exports, tmp_path, monkeypatch
):
  lines_a = ["w1 w2 w3 .", "", "w5 W6 w7"]
  lines_b = [" ".join(f"w{i}" for i in range(40)) + " ."]  # 41 tokens: four windows of 14.
  (tmp_path / "a.txt").write_text("\n".join(lines_a) + "\n")
  (tmp_path / "b.txt").write_text("\n".join(lines_b) + "\n")
  config = small_config
  monkeypatch.chdir(tmp_path)  # Relative paths, as people type them.
  config.features.update(
    source=exports["bundle"],
    input_pattern="*.txt",
    output_dir="features",
    layers=(-1, -2, 0),
    max_seq_length=16,
    doc_stride=9,
    batch_size=8,
    lines_per_shard=3,
  )
  manifest = jobs.run(config, str(tmp_path / "unused"), "features")
  assert manifest["shards"] == ["features-00000.npz", "features-00001.npz"] and manifest["lines"] == 4
  shards = [np.load(tmp_path / "features" / name) for name in manifest["shards"]]  # numpy alone reads them.
  assert [list(shard["line_index"]) for shard in shards] == [[0, 1, 2], [3]]

  loaded = pretrained.load(exports["bundle"])
  params, model_cfg, tokenizer = loaded.params["bert"], loaded.config, loaded.tokenizer
  layers = [2, 1, 0]  # -1, -2 and 0 of hidden states [embeddings, layer 1, layer 2].
  for shard, lines in zip(shards, [lines_a, lines_b], strict=True):
    assert list(shard["layers"]) == [-1, -2, 0]
    for row, line in enumerate(lines):
      start, end = shard["token_offsets"][row], shard["token_offsets"][row + 1]
      tokens = tokenizer.encode(line)
      np.testing.assert_array_equal(shard["token_ids"][start:end], tokens)
      spans = doc_spans(len(tokens), 14, 9)
      best = max_context_spans(spans, len(tokens))
      for window, (window_start, length) in enumerate(spans):
        hidden, pooled = _encode_window(
          model_cfg, params, [tokenizer.cls_id, *tokens[window_start : window_start + length], tokenizer.sep_id]
        )
        if window == 0:
          np.testing.assert_allclose(shard["pooled"][row], pooled, atol=1e-5)
        for token in np.flatnonzero(best == window):
          expected = hidden[layers, 1 + token - window_start]
          np.testing.assert_allclose(shard["token_vectors"][start + token], expected, atol=1e-5)
  assert shards[1]["token_vectors"].shape == (41, 3, 32)  # Nothing of the long line was cut.
  # The long line's windows and which one each token's vectors come from, by run_squad's rule: min(left, right
  # context) + 0.01 * the window's length, the first window on a tie (tokens 11, 20 and 29: two each side in two).
  assert spans == [(0, 14), (9, 14), (18, 14), (27, 14)]
  assert best.tolist() == [0] * 12 + [1] * 9 + [2] * 9 + [3] * 11

  with pytest.raises(FileExistsError, match=r"features.output_dir=features is not empty"):  # Shards never mix.
    jobs.run(config, str(tmp_path / "unused"), "features")
  config.features.update(layers=(-1, -4), output_dir="elsewhere")
  with pytest.raises(ValueError, match=r"features.layers has -4; this model has hidden states -3..2"):
    jobs.run(config, str(tmp_path / "unused"), "features")


def test_layers_are_counted_as_google_berts_extract_features_counts_them():
  """-1 the last layer, -2 the one before, 0 the embeddings; outside the model's hidden states, an error naming the
  key and the range."""
  assert extract_features.layer_indices([-1, -2, -3, -4], 4) == [4, 3, 2, 1]
  assert extract_features.layer_indices([0, 4, -5], 4) == [0, 4, 0]
  with pytest.raises(ValueError, match=r"bertology.feature_layers has 5; this model has hidden states -5..4"):
    extract_features.layer_indices([5], 4, key="bertology.feature_layers")
