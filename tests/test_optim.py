import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax import jobs
from bert_jax.model import param_layout
from bert_jax.train.optim import Steps, learning_rate_schedule, make_optimizer, make_schedule, weight_decay_mask
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
  with pytest.raises(ValueError, match=r"lr_schedule='cosine' is not a linear schedule.*\('bert', 'transformers'\)"):
    learning_rate_schedule(1e-4, warmup_steps=warmup, total_steps=100, kind="cosine")


def test_the_linear_schedules_are_optaxs_linear_schedules_joined_bit_for_bit_at_every_step():
  """ "bert" and "transformers" as they were before wsd joined them, bit for bit (the expressions of optax 0.2.8's
  linear_schedule and join_schedules, which they were built from, in float32)."""
  total, warmup, peak = 50, 7, np.float32(3e-4)

  def linear(init, end, steps, count):  # optax.linear_schedule: init + (end - init) * clip(count, 0, steps) / steps.
    frac = np.float32(1) - np.float32(np.clip(count, 0, steps)) / np.float32(steps)
    return np.float32((init - end) * frac**1 + end)

  for kind, start in (("bert", peak * np.float32(1 - warmup / total)), ("transformers", peak)):
    for config_warmup in (0, warmup):
      config = default.get_config()
      config.update(lr_schedule=kind, learning_rate=float(peak), warmup_steps=config_warmup, num_train_steps=total)
      schedule = make_schedule(config)
      decay_start = np.float32(peak * (1 - config_warmup / total)) if kind == "bert" else start
      for step in range(total + 3):
        if step < config_warmup:
          expected = linear(np.float32(0), peak, config_warmup, step)
        else:
          expected = linear(decay_start, np.float32(0), total - config_warmup, step - config_warmup)
        assert np.float32(schedule(step)) == expected, (kind, config_warmup, step)


def _wsd_reference(peak, warmup, total, decay_steps, decay, floor, step):
  """The wsd schedule by its formula, in float64."""
  if step < warmup:
    return peak * step / warmup
  decay_start = total - decay_steps
  if step <= decay_start or not decay_steps:
    return peak
  t = min((step - decay_start) / decay_steps, 1.0)
  shape = {"linear": 1 - t, "cosine": 0.5 * (1 + np.cos(np.pi * t)), "1-sqrt": 1 - np.sqrt(t)}[decay]
  return peak * (floor + (1 - floor) * shape)


@pytest.mark.parametrize("decay", ["linear", "cosine", "1-sqrt"])
@pytest.mark.parametrize("warmup, fraction, floor", [(10, 0.3, 0.0), (0, 0.5, 0.1), (4, 0.0, 0.0), (5, 0.95, 0.0)])
def test_wsd_follows_its_formula_at_every_step(decay, warmup, fraction, floor):
  config = default.get_config()
  config.update(
    lr_schedule="wsd",
    lr_decay=decay,
    lr_decay_fraction=fraction,
    lr_decay_floor=floor,
    learning_rate=2e-3,
    warmup_steps=warmup,
    num_train_steps=100,
  )
  jobs.check(config, "pretrain")
  schedule = make_schedule(config)
  decay_steps = round(fraction * 100)
  for step in range(103):  # Past the end, the rate stays at the floor (no decay: at the peak).
    expected = _wsd_reference(2e-3, warmup, 100, decay_steps, decay, floor, step)
    # float32 within a few ulps of the peak: 1 + cos(pi t) near t = 1 loses the rest to cancellation.
    np.testing.assert_allclose(float(schedule(step)), expected, rtol=2e-6, atol=2e-3 * 1e-7, err_msg=step)
  assert float(schedule(100 - decay_steps)) == pytest.approx(2e-3)  # The peak holds until the decay starts,
  if decay_steps:
    assert float(schedule(100)) == pytest.approx(2e-3 * floor, rel=1e-6, abs=1e-12)  # which ends at the floor.
  if decay == "1-sqrt" and decay_steps:  # Hägele et al.'s: peak * (1 - sqrt((s - decay_start) / decay_steps)).
    step = 100 - decay_steps // 4
    np.testing.assert_allclose(
      float(schedule(step)) - 2e-3 * floor,
      2e-3 * (1 - floor) * (1 - np.sqrt((step - (100 - decay_steps)) / decay_steps)),
      rtol=2e-6,
    )


def test_wsd_ends_where_the_schedule_ends_and_takes_traced_peaks():
  """Over schedule_end_step (two-phase pretraining), and with the peak a traced value (a learning-rate sweep)."""
  config = default.get_config()
  config.update(lr_schedule="wsd", warmup_steps=10, num_train_steps=60, schedule_end_step=100, lr_decay="linear")
  jobs.check(config, "pretrain")
  rates = jax.jit(lambda peak: jax.vmap(make_schedule(config, peak))(jnp.arange(101)))(jnp.float32(1e-3))
  expected = [_wsd_reference(1e-3, 10, 100, 20, "linear", 0.0, step) for step in range(101)]
  np.testing.assert_allclose(rates, expected, rtol=2e-6, atol=1e-3 * 1e-7)
  # Fine-tuning's steps (its run plan): the decay takes its fraction of those, at most the steps after warmup.
  schedule = make_schedule(config, steps=Steps(warmup_steps=2, end_step=3))  # round(0.2 x 3) = 1 decay step.
  np.testing.assert_allclose([float(schedule(s)) for s in range(4)], [0.0, 5e-5, 1e-4, 0.0], rtol=1e-6)
  config.update(lr_decay_fraction=0.5)
  schedule = make_schedule(config, steps=Steps(warmup_steps=2, end_step=3))  # round(1.5) = 2, bounded to 1.
  np.testing.assert_allclose([float(schedule(s)) for s in range(4)], [0.0, 5e-5, 1e-4, 0.0], rtol=1e-6)


@pytest.mark.parametrize(
  "updates, message",
  [
    (
      dict(lr_decay="exponential"),
      r"lr_decay='exponential' is not supported; expected one of \('linear', 'cosine', '1-sqrt'\)",
    ),
    (dict(lr_decay_fraction=-0.1), r"lr_decay_fraction=-0.1 must be in \[0, 1\]"),
    (dict(lr_decay_fraction=1.5), r"lr_decay_fraction=1.5 must be in \[0, 1\]"),
    (dict(lr_decay_floor=-0.5), r"lr_decay_floor=-0.5 must be in \[0, 1\]"),
    (
      dict(warmup_steps=30, lr_decay_fraction=0.8),
      r"lr_decay_fraction=0.8 is 80 of the schedule's 100 steps, more than the 70 after warmup_steps=30: "
      r"expected at most 0.7",
    ),
    (
      dict(warmup_steps=30, num_train_steps=50, schedule_end_step=100, lr_decay_fraction=0.8),
      r"lr_decay_fraction=0.8 is 80 of the schedule's 100 steps",
    ),
  ],
)
def test_bad_wsd_settings_are_refused_by_the_checks(updates, message):
  config = default.get_config()
  config.update(lr_schedule="wsd", num_train_steps=100, warmup_steps=10)
  config.update(**updates)
  with pytest.raises(ValueError, match=message):
    jobs.check(config, "pretrain")


def test_fine_tuning_refuses_wsd_fractions_that_do_not_fit():
  config = default.get_config()
  config.update(lr_schedule="wsd", lr_decay_fraction=0.95)
  config.finetune.update(task="sst2", warmup_fraction=0.1)
  with pytest.raises(ValueError, match=r"lr_decay_fraction=0.95 and finetune.warmup_fraction=0.1 sum to more than 1"):
    jobs.check(config, "finetune")
  config.update(lr_decay_fraction=0.9)
  jobs.check(config, "finetune")


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


def _stable_adamw_reference(params, grads_per_step, decayed, per_layer, lr=0.01, b1=0.9, b2=0.99, eps=1e-6, wd=0.1):
  """StableAdamW by its formula, in float64 numpy: per tensor (per slice of the leading axis where
  `per_layer[name]`), the rate divided by max(1, sqrt(mean(g^2 / max(v_hat, eps^2)))), applied to Adam's step and
  the decoupled decay (where `decayed[name]`) alike. The defaults are `_stable_adamw_config`'s. Returns the
  parameters after the last step and each step's RMS per tensor."""
  params = {name: np.asarray(p, np.float64) for name, p in params.items()}
  m = {name: np.zeros_like(p) for name, p in params.items()}
  v = {name: np.zeros_like(p) for name, p in params.items()}
  rms_per_step = []
  for t, grads in enumerate(grads_per_step, start=1):
    rms_now = {}
    for name, g in grads.items():
      g = np.asarray(g, np.float64)
      m[name] = b1 * m[name] + (1 - b1) * g
      v[name] = b2 * v[name] + (1 - b2) * g**2
      m_hat, v_hat = m[name] / (1 - b1**t), v[name] / (1 - b2**t)
      axes = tuple(range(1, g.ndim)) if per_layer[name] else None
      rms = np.sqrt(np.mean(g**2 / np.maximum(v_hat, eps**2), axis=axes, keepdims=True))
      rate = lr / np.maximum(1.0, rms)
      step = m_hat / (np.sqrt(v_hat) + eps) + (wd * params[name] if decayed[name] else 0.0)
      params[name] = params[name] - rate * step
      rms_now[name] = rms
    rms_per_step.append(rms_now)
  return params, rms_per_step


def _stable_adamw_config():
  config = default.get_config()
  config.update(
    optimizer="stable_adamw",
    learning_rate=0.01,
    lr_schedule="wsd",  # No warmup, no decay: a constant rate.
    lr_decay_fraction=0.0,
    warmup_steps=0,
    num_train_steps=10,
    weight_decay=0.1,
    max_grad_norm=float("inf"),
    adam_b2=0.99,
  )
  jobs.check(config, "pretrain")
  return config


def test_stable_adamw_divides_each_tensors_rate_by_its_update_rms():
  config = _stable_adamw_config()
  tx = make_optimizer(config)
  rng = np.random.default_rng(0)
  shapes = {"kernel": (3, 4), "bias": (4,), "tiny": (5,), "small": (2, 3)}
  params = {name: jnp.asarray(rng.normal(size=shape), jnp.float32) for name, shape in shapes.items()}
  base = {name: rng.normal(size=shape) for name, shape in shapes.items()}
  # At step 3 the gradients grow 10x but the bias's, which stays the same (RMS 1: not clipped). The kernel's RMS
  # goes above 1 (clipped); so does the small tensor's (3e-6: its v is above eps^2 = 1e-12, a floor of eps would
  # hide it); the tiny tensor's (1e-8) stays far below 1, as the eps^2 floor of v has it (without the floor, clipped).
  scale = {"kernel": 1.0, "bias": 1.0, "tiny": 1e-8, "small": 3e-6}
  growth = [1.0, 1.0, 10.0, 0.5]
  grads_per_step = [
    {name: scale[name] * (1.0 if name == "bias" else factor) * base[name] for name in shapes} for factor in growth
  ]
  state, new = tx.init(params), params
  for grads in grads_per_step:
    updates, state = tx.update(jax.tree.map(lambda g: jnp.asarray(g, jnp.float32), grads), state, new)
    new = optax.apply_updates(new, updates)
  mask = weight_decay_mask(params)
  assert mask == {"kernel": True, "bias": False, "tiny": False, "small": False}
  expected, rms = _stable_adamw_reference(params, grads_per_step, mask, dict.fromkeys(shapes, False))
  assert rms[2]["kernel"].item() > 1.3 and rms[2]["small"].item() > 1.3  # Clipped,
  assert abs(rms[2]["bias"].item() - 1) < 1e-6 and rms[2]["tiny"].item() < 0.5  # and not.
  for name in shapes:
    np.testing.assert_allclose(new[name], expected[name], rtol=2e-5, atol=1e-7, err_msg=name)
  # AdamW takes the same steps where StableAdamW does not clip (the bias), other steps where it does (the kernel).
  adamw = config.copy_and_resolve_references()
  adamw.optimizer = "adamw"
  plain = make_optimizer(adamw)
  state, other = plain.init(params), params
  for grads in grads_per_step:
    updates, state = plain.update(jax.tree.map(lambda g: jnp.asarray(g, jnp.float32), grads), state, other)
    other = optax.apply_updates(other, updates)
  np.testing.assert_allclose(other["bias"], expected["bias"], rtol=2e-5, atol=1e-7)
  assert not np.allclose(other["kernel"], expected["kernel"], rtol=1e-3)


def test_stable_adamw_takes_one_rms_per_layer_in_either_layer_layout():
  tx = make_optimizer(_stable_adamw_config())
  rng = np.random.default_rng(1)
  kernels = [rng.normal(size=(3, 4)) for _ in range(3)]
  growth = (10.0, 1.0, 3.0)  # Layer 0's second gradient is 10x its first (clipped), layer 1's the same (not).

  def tree(leaves):
    bert = {f"layer_{i}": {"dense": {"kernel": jnp.asarray(leaf, jnp.float32)}} for i, leaf in enumerate(leaves)}
    return {"bert": bert, "cls": {"kernel": jnp.asarray(leaves[0][:2], jnp.float32)}}

  params = tree([rng.normal(size=(3, 4)) for _ in range(3)])
  grads_per_step = [tree(kernels), tree([g * k for g, k in zip(growth, kernels, strict=True)])]

  def two_steps(params, grads_per_step):
    state = tx.init(params)
    for grads in grads_per_step:
      updates, state = tx.update(grads, state, params)
      params = optax.apply_updates(params, updates)
    return params

  from_unrolled = two_steps(params, grads_per_step)
  scanned = [param_layout.convert(grads, scanned=True) for grads in grads_per_step]
  from_scanned = two_steps(param_layout.convert(params, scanned=True), scanned)
  stacked = from_scanned["bert"]["layers"]["dense"]["kernel"]
  assert stacked.shape == (3, 3, 4)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
    param_layout.convert(from_scanned, scanned=False),
    from_unrolled,
  )
  # The stack as the reference has it, one RMS per layer: layer 0 clipped, layer 1 not.
  stack = {"stack": np.stack([params["bert"][f"layer_{i}"]["dense"]["kernel"] for i in range(3)])}
  stacked_grads = [
    {"stack": np.stack(kernels)},
    {"stack": np.stack([g * k for g, k in zip(growth, kernels, strict=True)])},
  ]
  expected, rms = _stable_adamw_reference(stack, stacked_grads, {"stack": True}, {"stack": True})
  assert rms[1]["stack"][0].item() > 1.3 and abs(rms[1]["stack"][1].item() - 1) < 1e-6
  np.testing.assert_allclose(stacked, expected["stack"], rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize(
  "key, value, message",
  [
    ("optimizer", "sgd", r"optimizer='sgd' is not supported; expected one of \('adamw', 'lamb', 'stable_adamw'\)"),
    (
      "lr_schedule",
      "cosine",
      r"lr_schedule='cosine' is not supported; expected one of \('bert', 'transformers', 'wsd'\)",
    ),
  ],
)
def test_unknown_optimizer_or_schedule_is_named(key, value, message):
  config = default.get_config()
  config[key] = value
  with pytest.raises(ValueError, match=message):
    jobs.check(config, "pretrain")
