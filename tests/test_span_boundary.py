"""SpanBERT's span-boundary objective (bert_jax/train/objectives/span_boundary.py): the spans' boundaries on a
hand-made batch and on the pipeline's span-masked rows, packed or not; the loss against a hand computation in numpy;
its FLOPs, BERT's plus the head's; the config it refuses; and a few steps of the real run, whose encoder hands off."""

import copy

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special

from bert_jax import config_checks, flops, jobs, sharding
from bert_jax.data import prepare, sources
from bert_jax.data.tokenizer import load_tokenizer
from bert_jax.handoff import pretrained
from bert_jax.model.bert_config import BertConfig, model_config
from bert_jax.model.encoder import BertForPretraining, init_params
from bert_jax.train import pretraining
from bert_jax.train.objectives import registry, span_boundary
from configs import spanbert_base, tiny
from tests.helpers import log_softmax

CLS, SEP, MASK = 2, 3, 4

# Two rows of 16 tokens in the packed rows' form. Row 0, one instance: [CLS] 10 tokens [SEP]; masked: 1-2 (a span
# after [CLS]), 4-6 and 7 (two spans that touch: one run, 4 tokens long), 10 (before [SEP]). Row 1, two instances
# ([CLS] at 0 and 7, [SEP] at 6 and 12): 5 (before the first [SEP]), 8-9 (after the second [CLS]), 11.
HAND_BATCH = dict(
  input_ids=np.array(
    [
      [CLS, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, SEP, 0, 0, 0, 0],
      [CLS, 21, 22, 23, 24, 25, SEP, CLS, 26, 27, 28, 29, SEP, 0, 0, 0],
    ],
    np.int32,
  ),
  input_mask=np.array([[1] * 12 + [0] * 4, [1] * 7 + [2] * 6 + [0] * 3], np.int32),
  segment_ids=np.zeros((2, 16), np.int32),
  position_ids=np.array([list(range(12)) + [0] * 4, list(range(7)) + list(range(6)) + [0] * 3], np.int32),
  cls_positions=np.array([[0, 0], [0, 7]], np.int32),
  next_sentence_labels=np.zeros((2, 2), np.int32),
  next_sentence_weights=np.array([[1, 0], [1, 1]], np.float32),
  masked_lm_positions=np.array([[1, 2, 4, 5, 6, 7, 10, 0], [5, 8, 9, 11, 0, 0, 0, 0]], np.int32),
  masked_lm_ids=np.array([[31, 32, 33, 34, 35, 36, 37, 0], [38, 39, 40, 41, 0, 0, 0, 0]], np.int32),
  masked_lm_weights=np.array([[1, 1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0, 0, 0]], np.float32),
)
MAX_SPAN_TOKENS = 3  # Row 0's run 4-7 is 4 tokens long: its last has no SBO prediction.


def test_the_boundaries_of_hand_made_spans_are_the_tokens_just_outside_each_run():
  left, right, offsets, weights = map(np.asarray, span_boundary.span_boundaries(HAND_BATCH, MAX_SPAN_TOKENS))
  np.testing.assert_array_equal(left, [[0, 0, 3, 3, 3, 0, 9, 0], [4, 7, 7, 10, 0, 0, 0, 0]])
  np.testing.assert_array_equal(right, [[3, 3, 8, 8, 8, 0, 11, 0], [6, 10, 10, 12, 0, 0, 0, 0]])
  np.testing.assert_array_equal(offsets, [[1, 2, 1, 2, 3, 1, 1, 1], [1, 1, 2, 1, 1, 1, 1, 1]])
  np.testing.assert_array_equal(weights, [[1, 1, 1, 1, 1, 0, 1, 0], [1, 1, 1, 1, 0, 0, 0, 0]])


@pytest.fixture(scope="module")
def model_and_params():
  """A one-layer BERT with SpanBERT's head (position table 3 x 8), its head's parameters all drawn at random (norms'
  scales and biases too, so that each one counts)."""
  config = BertConfig(
    vocab_size=48, hidden_size=32, num_layers=1, num_heads=4, intermediate_size=48, max_position_embeddings=16
  )
  model = span_boundary.SpanBertForPretraining(config, max_span_tokens=MAX_SPAN_TOKENS, position_embedding_size=8)
  params = jax.device_get(jax.jit(lambda key: nn.meta.unbox(init_params(model, key)))(jax.random.key(0)))
  rng = np.random.default_rng(0)
  params["span_boundary"] = jax.tree.map(
    lambda x: rng.normal(0, 0.5, x.shape).astype(np.float32), params["span_boundary"]
  )
  return model, params


def _layer_norm(x, norm, eps):
  centred = x - x.mean(-1, keepdims=True)
  return centred / np.sqrt((centred**2).mean(-1, keepdims=True) + eps) * norm["scale"] + norm["bias"]


def _gelu(x):
  return 0.5 * x * (1 + special.erf(x / np.sqrt(2)))


def _hand_sbo_logits(head: dict, word_embeddings, sequence_output, left, right, offsets, eps):
  """SpanBERT's head in float64 numpy: [x_left; x_right; p_offset] -> dense, GELU, LayerNorm, twice -> the decoder
  tied to the word embeddings, plus its own output bias."""
  gather = lambda where: np.take_along_axis(sequence_output, where[:, :, None], axis=1)  # noqa: E731
  h0 = np.concatenate([gather(left), gather(right), head["position_embeddings"][offsets - 1]], axis=-1)
  dense_1, dense_2 = head["dense_1"], head["dense_2"]
  h1 = _layer_norm(_gelu(h0 @ dense_1["kernel"] + dense_1["bias"]), head["layer_norm_1"], eps)
  y = _layer_norm(_gelu(h1 @ dense_2["kernel"] + dense_2["bias"]), head["layer_norm_2"], eps)
  return y @ word_embeddings.T + head["output_bias"]


def test_the_loss_is_the_masked_lm_mean_plus_the_sbo_mean_computed_by_hand(model_and_params):
  model, params = model_and_params
  batch = {name: jnp.asarray(value) for name, value in HAND_BATCH.items()}
  loss, metrics = jax.jit(lambda p: span_boundary.make_loss(MAX_SPAN_TOKENS).value(p, batch, model))(params)
  outputs = jax.jit(lambda p: BertForPretraining(model.config).apply({"params": p}, **_inputs(batch)))(params)

  # The boundaries as the hand-made batch's test spells them, the encoder's output, and the head by hand.
  left = np.array([[0, 0, 3, 3, 3, 0, 9, 0], [4, 7, 7, 10, 0, 0, 0, 0]])
  right = np.array([[3, 3, 8, 8, 8, 0, 11, 0], [6, 10, 10, 12, 0, 0, 0, 0]])
  offsets = np.array([[1, 2, 1, 2, 3, 1, 1, 1], [1, 1, 2, 1, 1, 1, 1, 1]])
  sbo_weights = np.array([[1, 1, 1, 1, 1, 0, 1, 0], [1, 1, 1, 1, 0, 0, 0, 0]], np.float64)
  head = jax.tree.map(np.float64, params["span_boundary"])
  word_embeddings = np.float64(params["bert"]["embeddings"]["word_embeddings"]["embedding"])
  sequence_output = np.float64(outputs["sequence_output"])
  eps = model.config.layer_norm_eps
  sbo_logits = _hand_sbo_logits(head, word_embeddings, sequence_output, left, right, offsets, eps)

  labels, mlm_weights = HAND_BATCH["masked_lm_ids"], np.float64(HAND_BATCH["masked_lm_weights"])
  xent = lambda logits: -np.take_along_axis(log_softmax(logits), labels[..., None], -1)[..., 0]  # noqa: E731
  mlm_sum = (xent(np.float64(outputs["mlm_logits"])) * mlm_weights).sum()
  sbo_sum = (xent(sbo_logits) * sbo_weights).sum()
  expected = mlm_sum / (mlm_weights.sum() + 1e-5) + sbo_sum / (sbo_weights.sum() + 1e-5)
  np.testing.assert_allclose(loss, expected, rtol=2e-6)
  np.testing.assert_allclose(metrics["sbo_loss"], sbo_sum, rtol=2e-6)
  np.testing.assert_allclose(metrics["mlm_loss"], mlm_sum, rtol=2e-6)
  assert metrics["sbo_count"] == 10 and metrics["mlm_count"] == 11
  assert metrics["sbo_accuracy"] == ((sbo_logits.argmax(-1) == labels) * sbo_weights).sum()

  # Two microbatches of one row each, normalised by the whole batch's counts, add up to the whole batch's loss.
  loss_fn = span_boundary.make_loss(MAX_SPAN_TOKENS)
  normalizers = loss_fn.normalizers(batch)
  halves = [jax.tree.map(lambda x, row=row: x[row : row + 1], batch) for row in (0, 1)]
  summed = sum(jax.jit(lambda p, b: loss_fn.value(p, b, model, normalizers=normalizers)[0])(params, b) for b in halves)
  np.testing.assert_allclose(summed, loss, rtol=1e-6)


def _inputs(batch: dict) -> dict:
  names = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "position_ids", "cls_positions")
  return {name: batch[name] for name in names}


def test_flops_are_berts_and_the_heads_at_every_prediction_as_xla_counts_them():
  """The objective counts BERT's FLOPs and exactly the head's at every prediction slot, three times for a train step;
  a forward pass's count is XLA's within 10% (XLA also counts norms, GELUs and softmaxes)."""
  config = spanbert_base.get_config()
  model_cfg = model_config(config)
  bert_flops = registry.of("bert").flops(config, model_cfg, None)
  batch, preds, hidden, vocab = config.batch_size, config.data.max_predictions_per_seq, 768, model_cfg.vocab_size
  head = 2 * batch * preds * ((2 * hidden + 200) * hidden + hidden * hidden + hidden * vocab)
  objective = registry.of("span_boundary")
  assert objective.flops(config, model_cfg, None) - bert_flops == 3 * head
  assert objective.flops(config, model_cfg, None, training=False) == pytest.approx((bert_flops + 3 * head) / 3)

  batch, seq, preds = 4, 32, 5
  small = BertConfig(vocab_size=2000, hidden_size=256, num_layers=2, num_heads=4, intermediate_size=1024)
  model = span_boundary.SpanBertForPretraining(small, max_span_tokens=15, position_embedding_size=200)
  params = jax.eval_shape(lambda: init_params(model, jax.random.key(0)))
  ids = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
  slots = jax.ShapeDtypeStruct((batch, preds), jnp.int32)

  def forward(p, ids, mask, segments, positions, left, right, offsets):
    spans = dict(span_left=left, span_right=right, span_offsets=offsets)
    return model.apply({"params": p}, ids, mask, segments, positions, **spans)

  xla = jax.jit(forward).lower(params, ids, ids, ids, *[slots] * 4).compile().cost_analysis()["flops"]
  forward_flops = flops.train_flops_per_step(small, batch, seq, preds) / 3
  ours = forward_flops + flops.span_boundary_flops(small, batch, preds, 200)
  assert ours == pytest.approx(xla, rel=0.1), (ours, xla)


@pytest.mark.parametrize(
  "overrides, message",
  [
    ({"data.masking": "tokens"}, r"objective='span_boundary' with data.masking='tokens': .* set data.masking='spans'"),
    ({"data.masking": "words"}, r"objective='span_boundary' with data.masking='words'"),
    ({"span_boundary.max_span_tokens": 0}, r"^span_boundary.max_span_tokens=0 must be at least 1.$"),
    ({"span_boundary.position_embedding_size": 0}, r"^span_boundary.position_embedding_size=0 must be at least 1."),
  ],
)
def test_a_config_the_objective_cannot_train_is_refused_naming_its_values(overrides, message):
  config = spanbert_base.get_config()
  config_checks.check_pretraining(config)  # As shipped.
  config.update_from_flattened_dict(overrides)
  with pytest.raises(ValueError, match=message):  # What the front door runs, before anything is imported or written.
    config_checks.check_pretraining(config)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, data_config):
  """A prepared corpus of short documents whose words are one to three WordPiece pieces (`a5`, `a5 ##x`,
  `a5 ##x ##y`): (prepared directory, manifest, vocabulary path)."""
  root = tmp_path_factory.mktemp("span_corpus")
  stems = [f"a{i}" for i in range(50)]
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *stems, "##x", "##y"]
  (root / "vocab.txt").write_text("\n".join(vocab) + "\n")
  rng = np.random.default_rng(0)
  words = lambda n: [stem + rng.choice(["", "", "x", "xy"]) for stem in rng.choice(stems, n)]  # noqa: E731
  documents = [
    "\n".join(" ".join(words(rng.integers(3, 9))) + " ." for _ in range(rng.integers(2, 7))) for _ in range(120)
  ]
  (root / "corpus.txt").write_text("\n\n".join(documents) + "\n")
  tokenizer = dict(kind="wordpiece", path=str(root / "vocab.txt"))
  manifest = prepare.prepare(data_config(input_pattern=str(root / "corpus.txt")), tokenizer, str(root / "prepared"), 1)
  return str(root / "prepared"), manifest, str(root / "vocab.txt")


def _expected_spans(batch: dict, max_span_tokens: int):
  """The spans of every real prediction, walked in numpy: (left, right, offsets, weights) as `span_boundaries`
  gives them."""
  shape = batch["masked_lm_positions"].shape
  left, right, offsets, weights = np.zeros(shape, int), np.zeros(shape, int), np.ones(shape, int), np.zeros(shape)
  for row in range(shape[0]):
    masked = set(batch["masked_lm_positions"][row][batch["masked_lm_weights"][row] > 0].tolist())
    for slot, position in enumerate(batch["masked_lm_positions"][row]):
      if not batch["masked_lm_weights"][row, slot]:
        continue
      before, after = position - 1, position + 1
      while before in masked:
        before -= 1
      while after in masked:
        after += 1
      if position - before <= max_span_tokens:
        left[row, slot], right[row, slot], offsets[row, slot], weights[row, slot] = before, after, position - before, 1
  return left, right, offsets, weights


@pytest.mark.parametrize("packed", [False, True], ids=["rows", "packed_rows"])
def test_the_pipelines_spans_have_their_boundaries_within_their_instance(corpus, data_config, packed):
  """On span-masked rows of the real pipeline: the boundaries are the tokens just outside each run of masked tokens,
  in the same instance (its [CLS] or [SEP] at its edges), and the offsets count 1, 2, ... along each run."""
  prepared, manifest, vocab = corpus
  tokenizer = load_tokenizer("wordpiece", vocab)
  packing = dict(pack_instances=True, max_instances_per_row=4, packing_group=32) if packed else {}
  data = data_config(
    masking="spans", instances="doc_sentences", max_seq_length=64, max_predictions_per_seq=10, shuffle_buffer=100
  )
  data.update(num_readers=1, **packing)
  source = sources.pipeline_source(data, prepared, manifest, tokenizer, seed=0, batch_size=16)
  counts = dict(spans=0, long=0, special=0, later_instances=0, words=0)
  for _ in range(4):
    batch = next(source)
    boundaries = [np.asarray(x) for x in jax.jit(span_boundary.span_boundaries, static_argnums=1)(batch, 4)]
    for got, expected in zip(boundaries, _expected_spans(batch, 4), strict=True):
      np.testing.assert_array_equal(got, expected)
    left, right, offsets, weights = boundaries
    positions, instance = batch["masked_lm_positions"], batch["input_mask"]
    rows = np.arange(len(positions))[:, None]
    predicted = weights > 0
    for ends in (left, right):  # The same instance as the span; unmasked; [CLS] or [SEP] at the instance's edges.
      np.testing.assert_array_equal(instance[rows, ends][predicted], instance[rows, positions][predicted])
      assert (batch["input_ids"][rows, ends][predicted] != MASK).all()
    counts["spans"] += int((predicted & (offsets == 1)).sum())
    counts["long"] += int((predicted & (offsets >= 3)).sum())
    counts["special"] += int(np.isin(batch["input_ids"][rows, np.stack([left, right])][:, predicted], [CLS, SEP]).sum())
    counts["later_instances"] += int((predicted & (instance[rows, positions] > 1)).sum())
    counts["words"] += int(((batch["input_ids"] == 55) | (batch["input_ids"] == 56)).sum())  # ##x, ##y
  assert counts["spans"] > 50 and counts["long"] > 10 and counts["special"] > 5 and counts["words"] > 100, counts
  assert (counts["later_instances"] > 10) == packed, counts


def _run_config(corpus, workdir: str):
  """configs/tiny.py, a one-layer H32 BERT on `corpus` with the span-boundary objective, over the 8 devices."""
  prepared, _, vocab = corpus
  config = tiny.get_config()
  config.objective = "span_boundary"
  config.model.update(
    vocab_size=64, hidden_size=32, num_layers=1, num_heads=4, intermediate_size=48, max_position_embeddings=64
  )
  config.tokenizer.update(kind="wordpiece", path=vocab)
  config.data.update(embedded_corpus="", prepared_dir=prepared, masking="spans", instances="doc_sentences")
  config.data.update(max_seq_length=64, max_predictions_per_seq=10, shuffle_buffer=100)
  config.span_boundary.update(max_span_tokens=4, position_embedding_size=8)
  config.update(batch_size=8, num_train_steps=8, warmup_steps=1, log_every_steps=1, checkpoint_every_steps=2)
  config.update(eval_steps=0)
  return config


@pytest.mark.slow  # A run end to end and its export; the loss, FLOPs and spans have fast tests above.
def test_a_few_steps_of_the_real_run_lower_both_losses_and_the_encoder_hands_off(corpus, tmp_path):
  config = _run_config(corpus, str(tmp_path / "run"))
  spec = pretraining.job_spec(config)
  run = spec.run
  assert set(run.abstract.params) == {"bert", "mlm_transform", "mlm_layer_norm", "mlm_output_bias", "nsp"} | {
    "span_boundary"
  }
  prepared, manifest, vocab = corpus
  data = copy.deepcopy(config.data)
  data.num_readers = 1
  tokenizer = load_tokenizer("wordpiece", vocab)
  host_batch = next(sources.pipeline_source(data, prepared, manifest, tokenizer, seed=0, batch_size=8))
  batch = sharding.global_batch(host_batch, run.mesh)
  state, history = run.init_state(config.seed), []
  for step in range(6):  # The same batch each step: both losses fall.
    state, metrics = run.train_step(state, batch, jax.random.key(step))
    metrics = jax.device_get(metrics)
    history.append([metrics[name] / metrics[f"{name[:3]}_count"] for name in ("mlm_loss", "sbo_loss")])
    assert np.isfinite(metrics["loss"]) and metrics["sbo_count"] > 0
  history = np.array(history)  # Step 0 learns nothing: the learning rate warms up from 0.
  assert (history[-1] < history[1]).all() and (np.diff(history[1:], axis=0) < 0).sum() >= 8, history

  # A run's workdir: what `pretrained.load` (and so export and fine-tuning) reads is the BERT without the head.
  config.num_train_steps = 2
  trained = jobs.run(config, str(tmp_path / "run"), "pretrain")
  loaded = pretrained.load(str(tmp_path / "run"))
  params = jax.device_get(trained.params)
  assert set(loaded.params) == set(params) - {"span_boundary"}
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(loaded.params), {k: params[k] for k in loaded.params})
