"""BERT's optimizers: AdamW (the default, as in BERT) or LAMB (You et al. 2019, the 76-minute BERT), both with
weight decay except on LayerNorm and biases, linear warmup then linear decay, and global-norm clipping."""

import jax
import optax

# Only matrices decay: Dense kernels and embedding tables. LayerNorm scales/biases and all biases do not,
# as in the original BERT (`exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"]`).
_DECAYED_LEAVES = ("kernel", "embedding")


def weight_decay_mask(params):
  """A tree of bools, True where weight decay applies."""

  def decays(path, _):
    return getattr(path[-1], "key", None) in _DECAYED_LEAVES

  return jax.tree_util.tree_map_with_path(decays, params)


OPTIMIZERS = ("adamw", "lamb")


def lamb(learning_rate, b1: float, b2: float, eps: float, weight_decay: float, mask) -> optax.GradientTransformation:
  """LAMB: Adam's direction plus decoupled weight decay, each parameter's update scaled by the trust ratio
  ||w|| / ||update||. As in the LAMB authors' BERT optimizer, the parameters without weight decay (LayerNorm,
  biases) are also excluded from the trust ratio (`exclude_from_layer_adaptation` defaults to the decay exclusions).
  """
  return optax.chain(
    optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
    optax.add_decayed_weights(weight_decay, mask),
    optax.masked(optax.scale_by_trust_ratio(), mask),
    optax.scale_by_learning_rate(learning_rate),
  )


def learning_rate_schedule(learning_rate: float, warmup_steps: int, total_steps: int) -> optax.Schedule:
  """Linear warmup from 0 to `learning_rate`, then the original BERT's linear decay to 0 at `total_steps`."""
  if not 0 <= warmup_steps <= total_steps:
    raise ValueError(f"warmup_steps={warmup_steps} must be within [0, num_train_steps={total_steps}].")
  decay = optax.linear_schedule(
    learning_rate * (1 - warmup_steps / max(total_steps, 1)), 0.0, max(total_steps - warmup_steps, 1)
  )
  if warmup_steps == 0:
    return decay
  warmup = optax.linear_schedule(0.0, learning_rate, warmup_steps)
  return optax.join_schedules([warmup, decay], [warmup_steps])


def schedule_end_step(config) -> int:
  """The step at which the learning rate reaches zero: `schedule_end_step`, or `num_train_steps` if 0."""
  return config.schedule_end_step or config.num_train_steps


def make_schedule(config) -> optax.Schedule:
  return learning_rate_schedule(config.learning_rate, config.warmup_steps, schedule_end_step(config))


def make_optimizer(config) -> optax.GradientTransformation:
  """From the top-level config: `optimizer`, `learning_rate`, `warmup_steps`, `num_train_steps`,
  `schedule_end_step`, `adam_*`, `weight_decay`, `max_grad_norm`."""
  if config.optimizer not in OPTIMIZERS:
    raise ValueError(f"optimizer={config.optimizer!r} is not supported; expected one of {OPTIMIZERS}.")
  make = optax.adamw if config.optimizer == "adamw" else lamb
  return optax.chain(
    optax.clip_by_global_norm(config.max_grad_norm),
    make(
      make_schedule(config),
      b1=config.adam_b1,
      b2=config.adam_b2,
      eps=config.adam_eps,
      weight_decay=config.weight_decay,
      mask=weight_decay_mask,
    ),
  )
