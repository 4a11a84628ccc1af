import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax import config_checks
from bert_jax.model import param_layout
from bert_jax.train.optim import learning_rate_schedule, make_optimizer, weight_decay_mask
from configs import default


def test_schedule_is_linear_warmup_then_berts_linear_decay():
  schedule = learning_rate_schedule(1e-4, warmup_steps=10, total_steps=100)
  assert float(schedule(0)) == 0.0
  np.testing.assert_allclose(float(schedule(5)), 0.5e-4, rtol=1e-6)
  np.testing.assert_allclose(float(schedule(10)), 0.9e-4, rtol=1e-6)  # Original BERT: lr * (1 - step / total).
  np.testing.assert_allclose(float(schedule(55)), 0.45e-4, rtol=1e-6)
  assert float(schedule(100)) == 0.0
  with pytest.raises(ValueError, match="warmup_steps=200"):
    learning_rate_schedule(1e-4, warmup_steps=200, total_steps=100)


@pytest.mark.parametrize("warmup", [0, 10])
def test_the_transformers_schedule_equals_get_linear_schedule_with_warmup_at_every_step(warmup):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-4)
  reference = transformers.get_linear_schedule_with_warmup(optimizer, warmup, 100)
  ours = learning_rate_schedule(1e-4, warmup_steps=warmup, total_steps=100, kind="transformers")
  for step in range(101):  # The rate of update `step` (0-based), as the reference's scheduler has it before step().
    np.testing.assert_allclose(float(ours(step)), reference.get_last_lr()[0], rtol=1e-5, atol=1e-12, err_msg=step)
    optimizer.step()
    reference.step()
  with pytest.raises(ValueError, match="lr_schedule='cosine'.*'bert', 'transformers'"):
    learning_rate_schedule(1e-4, warmup_steps=warmup, total_steps=100, kind="cosine")


def test_weight_decay_spares_layer_norm_and_biases():
  params = {
    "dense": {"kernel": 0, "bias": 0},
    "layer_norm": {"scale": 0, "bias": 0},
    "word_embeddings": {"embedding": 0},
    "mlm_output_bias": 0,
  }
  assert weight_decay_mask(params) == {
    "dense": {"kernel": True, "bias": False},
    "layer_norm": {"scale": False, "bias": False},
    "word_embeddings": {"embedding": True},
    "mlm_output_bias": False,
  }


def test_one_update_is_clipped_adamw_with_decoupled_decay():
  config = default.get_config()
  config.unlock()
  config.update(learning_rate=0.1, warmup_steps=0, num_train_steps=10, weight_decay=0.01, max_grad_norm=1.0)
  tx = make_optimizer(config)
  params = {"dense": {"kernel": jnp.full((2,), 2.0), "bias": jnp.full((2,), 2.0)}}
  grads = {"dense": {"kernel": jnp.array([30.0, 40.0]), "bias": jnp.zeros(2)}}  # Global norm 50 -> clipped to 1.
  updates, _ = tx.update(grads, tx.init(params), params)
  new = optax.apply_updates(params, updates)
  # Adam's first step is lr * sign(g) (bias-corrected m / sqrt(v)); decay adds lr * wd * param on kernels only.
  lr = 0.1
  np.testing.assert_allclose(new["dense"]["kernel"], 2.0 - lr * (1.0 + 0.01 * 2.0), rtol=1e-5)
  np.testing.assert_allclose(new["dense"]["bias"], 2.0, rtol=1e-6)
  assert jax.tree.structure(new) == jax.tree.structure(params)


def test_lamb_scales_each_decayed_update_by_its_trust_ratio():
  config = default.get_config()
  config.unlock()
  config.update(
    optimizer="lamb", learning_rate=0.1, warmup_steps=0, num_train_steps=10, weight_decay=0.01, max_grad_norm=1e9
  )
  tx = make_optimizer(config)
  rng = np.random.default_rng(0)
  params = {"dense": {"kernel": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32), "bias": jnp.ones(4)}}
  grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
  state = tx.init(params)
  for step in range(2):  # Two steps: the moments and bias corrections matter.
    updates, state = tx.update(grads, state, params)
    new = optax.apply_updates(params, updates)
    # The LAMB paper, by hand: Adam's bias-corrected direction + decoupled decay, times ||w|| / ||update||.
    t, lr = step + 1, 0.1 * (1 - step / 10)
    for name, decayed in (("kernel", True), ("bias", False)):
      w, g = np.asarray(params["dense"][name], np.float64), np.asarray(grads["dense"][name], np.float64)
      m = (1 - 0.9**t) * g / (1 - 0.9**t)  # Constant gradients: m and v are g and g^2 after bias correction.
      v = (1 - 0.999**t) * g**2 / (1 - 0.999**t)
      update = m / (np.sqrt(v) + 1e-6)
      if decayed:
        update = update + 0.01 * w
        update *= np.linalg.norm(w) / np.linalg.norm(update)
      np.testing.assert_allclose(new["dense"][name], w - lr * update, rtol=1e-5, atol=1e-6)
    params = new


def test_lamb_takes_one_trust_ratio_per_layer_in_either_layer_layout():
  config = default.get_config()
  config.unlock()
  config.update(optimizer="lamb", learning_rate=0.1, warmup_steps=0, num_train_steps=10)
  tx = make_optimizer(config)
  rng = np.random.default_rng(0)

  def layer(scale):  # Layers of different magnitudes: one ratio over the stack would differ from each layer's.
    return {"dense": {"kernel": jnp.asarray(scale * rng.normal(size=(3, 4)), jnp.float32), "bias": jnp.ones(4)}}

  unrolled = {"bert": {f"layer_{i}": layer(scale) for i, scale in enumerate((0.1, 1.0, 10.0))}}
  unrolled["cls"] = {"kernel": jnp.asarray(rng.normal(size=(4, 2)), jnp.float32)}
  grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), unrolled)

  def two_steps(params, grads):
    state = tx.init(params)
    for _ in range(2):
      updates, state = tx.update(grads, state, params)
      params = optax.apply_updates(params, updates)
    return params

  from_unrolled = two_steps(unrolled, grads)
  from_scanned = two_steps(param_layout.convert(unrolled, scanned=True), param_layout.convert(grads, scanned=True))
  assert "layers" in from_scanned["bert"]
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
    param_layout.convert(from_scanned, scanned=False),
    from_unrolled,
  )


@pytest.mark.parametrize(
  "key, value, message",
  [
    ("optimizer", "sgd", r"optimizer='sgd' is not supported; expected one of \('adamw', 'lamb'\)"),
    ("lr_schedule", "cosine", r"lr_schedule='cosine' is not supported; expected one of \('bert', 'transformers'\)"),
  ],
)
def test_unknown_optimizer_or_schedule_is_named(key, value, message):
  config = default.get_config()
  config[key] = value
  with pytest.raises(ValueError, match=message):
    config_checks.check(config, "pretrain")
