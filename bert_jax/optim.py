"""BERT's optimizer: AdamW with weight decay except on LayerNorm and biases, linear warmup then linear decay,
global-norm clipping."""

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


def make_optimizer(config) -> optax.GradientTransformation:
  """From the top-level config: `learning_rate`, `warmup_steps`, `num_train_steps`, `adam_*`,
  `weight_decay`, `max_grad_norm`."""
  schedule = learning_rate_schedule(config.learning_rate, config.warmup_steps, config.num_train_steps)
  return optax.chain(
    optax.clip_by_global_norm(config.max_grad_norm),
    optax.adamw(
      schedule,
      b1=config.adam_b1,
      b2=config.adam_b2,
      eps=config.adam_eps,
      weight_decay=config.weight_decay,
      mask=weight_decay_mask,
    ),
  )
