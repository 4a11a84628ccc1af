"""BERT's optimizers: AdamW (the default, as in BERT), LAMB (You et al. 2019, the 76-minute BERT) or StableAdamW
(Wortsman et al. 2023, ModernBERT's), all with weight decay except on LayerNorm and biases, linear warmup then a
linear or warmup-stable-decay schedule, and global-norm clipping."""

import dataclasses

import jax
import jax.numpy as jnp
import optax

from bert_jax.model import param_layout

# Only matrices decay: Dense kernels and embedding tables. LayerNorm scales/biases and all biases do not,
# as in the original BERT (`exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"]`).
_DECAYED_LEAVES = ("kernel", "embedding")


def weight_decay_mask(params):
  """A tree of bools, True where weight decay applies."""

  def decays(path, _):
    return getattr(path[-1], "key", None) in _DECAYED_LEAVES

  return jax.tree_util.tree_map_with_path(decays, params)


def _is_stacked_layers(path) -> bool:
  return any(getattr(key, "key", None) == param_layout.SCANNED_KEY for key in path)


def _layer_axes(path, leaf) -> tuple[int, ...] | None:
  """The axes a per-tensor statistic of `leaf` reduces over: all (None), or, for scanned layers (`bert/layers/...`,
  stacked on a leading layer axis), all but that axis, so that each layer takes its own as in the unrolled layout."""
  return tuple(range(1, leaf.ndim)) if _is_stacked_layers(path) else None


def scale_by_layerwise_trust_ratio() -> optax.GradientTransformation:
  """`optax.scale_by_trust_ratio` with one ratio per layer: leaves of scanned layers (`bert/layers/...`, stacked
  on a leading layer axis) take their norms per slice of that axis, so both layer layouts get the same update."""

  def update_fn(updates, state, params):
    if params is None:
      raise ValueError("The trust ratio needs the params: call update(grads, state, params).")

    def scale(path, update, param):
      axis = _layer_axes(path, param)
      param_norm = optax.safe_norm(param, 0.0, axis=axis, keepdims=True)
      update_norm = optax.safe_norm(update, 0.0, axis=axis, keepdims=True)
      zero = jnp.logical_or(param_norm == 0.0, update_norm == 0.0)
      return update * jnp.where(zero, 1.0, param_norm / update_norm).astype(update.dtype)

    return jax.tree_util.tree_map_with_path(scale, updates, params), state

  return optax.GradientTransformation(optax.init_empty_state, update_fn)


def lamb(learning_rate, b1: float, b2: float, eps: float, weight_decay: float, mask) -> optax.GradientTransformation:
  """LAMB: Adam's direction plus decoupled weight decay, each parameter's update scaled by the trust ratio
  ||w|| / ||update||. As in the LAMB authors' BERT optimizer, the parameters without weight decay (LayerNorm,
  biases) are also excluded from the trust ratio (`exclude_from_layer_adaptation` defaults to the decay exclusions).
  The ratio is per layer in either layer layout (`scale_by_layerwise_trust_ratio`).
  """
  return optax.chain(
    optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
    optax.add_decayed_weights(weight_decay, mask),
    optax.masked(scale_by_layerwise_trust_ratio(), mask),
    optax.scale_by_learning_rate(learning_rate),
  )


def clip_by_update_rms(adam_and_decay: optax.GradientTransformation, b2: float, eps: float):
  """`adam_and_decay`'s updates (an `optax.scale_by_adam` direction plus decoupled weight decay) divided, per
  tensor, by max(1, RMS_t), RMS_t = sqrt(mean(g_t^2 / max(v_t, eps^2))): g_t the gradient, v_t the bias-corrected
  second moment that the inner `scale_by_adam` (b2) has just updated with it. Leaves of scanned layers take one
  RMS per layer (`_layer_axes`), so both layer layouts get the same update."""

  def update_fn(grads, state, params=None):
    updates, state = adam_and_decay.update(grads, state, params)
    adam = optax.tree_utils.tree_get(state, "ScaleByAdamState")
    second_moment = optax.tree_utils.tree_bias_correction(adam.nu, b2, adam.count)

    def clip(path, update, grad, v):
      ratio = jnp.square(grad) / jnp.maximum(v, eps**2)
      rms = jnp.sqrt(jnp.mean(ratio, axis=_layer_axes(path, grad), keepdims=True))
      return update / jnp.maximum(1.0, rms).astype(update.dtype)

    return jax.tree_util.tree_map_with_path(clip, updates, grads, second_moment), state

  return optax.GradientTransformation(adam_and_decay.init, update_fn)


def stable_adamw(
  learning_rate, b1: float, b2: float, eps: float, weight_decay: float, mask
) -> optax.GradientTransformation:
  """StableAdamW (Wortsman et al. 2023, "Stable and low-precision training for large-scale vision-language models",
  Algorithm 2; ModernBERT trains with it): AdamW whose learning rate is divided, per tensor, by max(1, RMS_t)
  (`clip_by_update_rms`), Adafactor's update clipping. The formula follows optimi's `StableAdamW` (which ModernBERT's
  training code imports): RMS_t from the bias-corrected second moment floored at eps^2, as in Wortsman's reference
  code too (eps itself is added to sqrt(v_t) in Adam's denominator, as in optax and optimi); and the decoupled weight
  decay takes the divided rate as well (Wortsman's reference code decays with the undivided one):
  params -= lr_t / max(1, RMS_t) * (m_t / (sqrt(v_t) + eps) + weight_decay * params), the decay on the tensors
  `mask` decays (AdamW's: `weight_decay_mask`). g_t is the gradient the optimizer is given: in `make_optimizer`'s
  chain, after global-norm clipping (max_grad_norm=inf: none).
  """
  return optax.chain(
    clip_by_update_rms(
      optax.chain(optax.scale_by_adam(b1=b1, b2=b2, eps=eps), optax.add_decayed_weights(weight_decay, mask)), b2, eps
    ),
    optax.scale_by_learning_rate(learning_rate),
  )


# The optimizers, by `config.optimizer`.
OPTIMIZERS = {"adamw": optax.adamw, "lamb": lamb, "stable_adamw": stable_adamw}

# The decay after warmup (`config.lr_schedule`):
#   "bert": Google BERT's optimization.py: the rate decays linearly from step 0 and warmup overrides it, so after
#     warmup it resumes at learning_rate * (1 - warmup / total): lr(s) = learning_rate * (total - s) / total.
#   "transformers": transformers' get_linear_schedule_with_warmup: the decay starts from the peak at the end of warmup,
#     lr(s) = learning_rate * (total - s) / (total - warmup).
#   "wsd": warmup-stable-decay (Hägele et al. 2024, "Scaling Laws and Compute-Optimal Training Beyond Fixed Training
#     Durations"; ModernBERT, Ettin): the peak holds after warmup, then the rate decays over the schedule's last
#     decay_steps, in one of WSD_DECAYS, to a floor (`wsd_schedule`).
# All three warm up linearly from 0 (lr(s) = learning_rate * s / warmup_steps); "bert" and "transformers" reach 0 at
# total_steps, "wsd" its floor.
LINEAR_SCHEDULES = ("bert", "transformers")
LR_SCHEDULES = (*LINEAR_SCHEDULES, "wsd")

# wsd's decay (`config.lr_decay`): the fraction of the peak left above the floor at t, the fraction of the decay
# done (0 to 1). "1-sqrt" is Hägele et al.'s, which ModernBERT and Ettin decay with.
WSD_DECAYS = {
  "linear": lambda t: 1 - t,
  "cosine": lambda t: 0.5 * (1 + jnp.cos(jnp.pi * t)),
  "1-sqrt": lambda t: 1 - jnp.sqrt(t),
}


def learning_rate_schedule(
  learning_rate: float, warmup_steps: int, total_steps: int, kind: str = "bert"
) -> optax.Schedule:
  """Linear warmup from 0 to `learning_rate`, then linear decay to 0 at `total_steps`, as `kind` says (one of
  LINEAR_SCHEDULES: from step 0, as the original BERT, or from the peak, as transformers)."""
  if not 0 <= warmup_steps <= total_steps:
    raise ValueError(f"warmup_steps={warmup_steps} must be within [0, num_train_steps={total_steps}].")
  if kind not in LINEAR_SCHEDULES:
    raise ValueError(f"lr_schedule={kind!r} is not a linear schedule; expected one of {LINEAR_SCHEDULES}.")
  start = learning_rate * (1 - warmup_steps / max(total_steps, 1)) if kind == "bert" else learning_rate
  decay = optax.linear_schedule(start, 0.0, max(total_steps - warmup_steps, 1))
  if warmup_steps == 0:
    return decay
  warmup = optax.linear_schedule(0.0, learning_rate, warmup_steps)
  return optax.join_schedules([warmup, decay], [warmup_steps])


def wsd_decay_steps(decay_fraction: float, total_steps: int) -> int:
  """The steps of wsd's decay: `decay_fraction` (`config.lr_decay_fraction`) of the schedule's, rounded."""
  return int(round(decay_fraction * total_steps))


def wsd_schedule(
  learning_rate: float, warmup_steps: int, total_steps: int, decay_steps: int, decay: str, floor: float
) -> optax.Schedule:
  """Warmup-stable-decay: linear warmup from 0 to `learning_rate` over `warmup_steps`, the peak until
  `total_steps - decay_steps`, then `decay` (one of WSD_DECAYS) down to `floor * learning_rate` at `total_steps`,
  where it stays: lr(s) = learning_rate * (floor + (1 - floor) * WSD_DECAYS[decay](t)), t = (s - decay_start) /
  decay_steps. "1-sqrt" with floor 0 is Hägele et al.'s learning_rate * (1 - sqrt(t)). No decay steps: the peak
  from the end of warmup on, past `total_steps` too."""
  if not 0 <= warmup_steps <= total_steps:
    raise ValueError(f"warmup_steps={warmup_steps} must be within [0, num_train_steps={total_steps}].")
  if not 0 <= decay_steps <= total_steps - warmup_steps:
    raise ValueError(
      f"wsd's decay of {decay_steps} steps must fit in the {total_steps - warmup_steps} steps after warmup_steps="
      f"{warmup_steps} (num_train_steps={total_steps})."
    )
  if decay not in WSD_DECAYS:
    raise ValueError(f"lr_decay={decay!r} is not supported; expected one of {tuple(WSD_DECAYS)}.")
  if not 0 <= floor <= 1:
    raise ValueError(f"lr_decay_floor={floor} must be in [0, 1] (a fraction of the peak learning rate).")
  decay_start, shape = total_steps - decay_steps, WSD_DECAYS[decay]

  def stable_then_decay(step):
    if not decay_steps:  # No decay: the peak throughout.
      return learning_rate * jnp.ones_like(step, jnp.float32)
    t = jnp.clip((step - decay_start) / decay_steps, 0.0, 1.0)
    return learning_rate * (floor + (1 - floor) * shape(t))

  if warmup_steps == 0:
    return stable_then_decay
  warmup = optax.linear_schedule(0.0, learning_rate, warmup_steps)
  return optax.join_schedules([warmup, lambda step: stable_then_decay(step + warmup_steps)], [warmup_steps])


@dataclasses.dataclass(frozen=True)
class Steps:
  """The schedule's step counts: warmup over `warmup_steps`, the schedule's end at `end_step`. Pretraining's come from
  the config (`Steps.of`); fine-tuning computes its own from epochs and rows (its run plan)."""

  warmup_steps: int
  end_step: int

  @classmethod
  def of(cls, config) -> "Steps":
    """`warmup_steps`, and `schedule_end_step` (0: `num_train_steps`)."""
    return cls(config.warmup_steps, config.schedule_end_step or config.num_train_steps)


def make_schedule(config, learning_rate=None, steps: Steps | None = None) -> optax.Schedule:
  """The schedule of kind `config.lr_schedule` peaking at `learning_rate` (default: config.learning_rate; may be
  traced), over `steps` (default: the config's). wsd's decay takes `lr_decay_fraction` of the steps, at most those
  after warmup: the checks keep the fractions within the schedule (config_checks), and this bound only drops a step
  that rounding adds where fine-tuning's warmup and decay fractions sum to 1."""
  peak = config.learning_rate if learning_rate is None else learning_rate
  steps = steps or Steps.of(config)
  if config.lr_schedule != "wsd":
    return learning_rate_schedule(peak, steps.warmup_steps, steps.end_step, config.lr_schedule)
  decay_steps = min(wsd_decay_steps(config.lr_decay_fraction, steps.end_step), steps.end_step - steps.warmup_steps)
  return wsd_schedule(peak, steps.warmup_steps, steps.end_step, decay_steps, config.lr_decay, config.lr_decay_floor)


def make_optimizer(config, learning_rate=None, steps: Steps | None = None) -> optax.GradientTransformation:
  """From the top-level config (checked by config_checks): `optimizer`, `learning_rate` (unless given), the
  schedule's `steps` (default: the config's), `adam_*`, `weight_decay`, `max_grad_norm` (inf: no clipping, since a
  finite gradient's norm is always below it; 0 is refused, which would zero every update)."""
  make = OPTIMIZERS[config.optimizer]
  return optax.chain(
    optax.clip_by_global_norm(config.max_grad_norm),
    make(
      make_schedule(config, learning_rate, steps),
      b1=config.adam_b1,
      b2=config.adam_b2,
      eps=config.adam_eps,
      weight_decay=config.weight_decay,
      mask=weight_decay_mask,
    ),
  )


def make_sweep_optimizer(config, steps: Steps | None = None) -> optax.GradientTransformation:
  """`make_optimizer` with the peak learning rate held in the optimizer state (`hyperparams["learning_rate"]`),
  so that the members of a vmapped sweep each train at their own; see `set_learning_rates`."""
  return optax.inject_hyperparams(lambda learning_rate: make_optimizer(config, learning_rate, steps))(
    learning_rate=config.learning_rate
  )


def set_learning_rates(opt_state, learning_rates: jax.Array):
  """A sweep's optimizer state (leading member axis) with member i's peak learning rate `learning_rates[i]`."""
  hyperparams = dict(opt_state.hyperparams, learning_rate=learning_rates.astype(jnp.float32))
  return opt_state._replace(hyperparams=hyperparams)
