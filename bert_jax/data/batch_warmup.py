"""How many rows each pretraining step reads: `batch_size`, or, with a batch-size warmup (ModernBERT's recipe,
`batch_warmup_tokens` > 0), `batch_warmup_start` rows first, then 2, 3, ... times that, each size for the same
number of steps, and `batch_size` once the smaller sizes have read `batch_warmup_tokens` token positions (rows x
`data.max_seq_length`, padding included, as a checkpoint's `token_positions_seen`; rounded up to whole steps).

The sizes are those of ModernBERT's training code (`BatchSizeWarmupScheduler` in its src/sequence_packer.py): it
grows the batch from its microbatch on every GPU by one microbatch on every GPU at a time, the warmup's tokens shared
out so that each size lasts as many steps (so the batch grows linearly in steps, over the first N tokens). It counts
tokens as they pass; here they are known ahead, so a step's size is a function of the step alone: a resume restores
the step, and with it the sizes of every step to come and `rows_through` every step before.

Each size runs its own compiled train step (`jax.jit` compiles once per batch shape), rather than one full-batch
program whose unused rows carry zero weight. The cost of each:
- several programs: `batch_size / batch_warmup_start` compilations (at most MAX_SIZES), each at the first step of its
  size in a launch, and none takes more time or memory than the full batch's: configs/modernbert_base.py's full
  batch compiled in 110 s on a 2-core host, so its five smaller sizes add at most about nine minutes to a run of weeks.
- one program: every warmup step would compute `batch_size` rows. With sizes S, 2S, ... (K - 1)S each held for n
  steps, the real rows are n S K (K - 1) / 2 and the computed ones n (K - 1) K S: twice as many, whatever K, so the
  waste is the warmup's own compute (50B token positions for ModernBERT-base, about 3% of its phase 1). And every
  loss would need a weight per row.
The data readers batch `start` rows together (every size is a multiple of it), and a step takes `size / start` of
their batches (`sources.PipelineSource.take`): each reader reads the rows it reads without the warmup, in order.
"""

import dataclasses

# Sizes a warmup may have, batch_size's included: each compiles its own train step.
MAX_SIZES = 16


@dataclasses.dataclass(frozen=True)
class BatchSchedule:
  """The rows of every step (steps count from 1). Without a warmup, `start` is `batch_size` and `steps_per_size` 0."""

  batch_size: int  # Rows of every step after the warmup.
  start: int  # The first size; every size is a multiple of it (the rows of one batch of the data readers together).
  steps_per_size: int  # Steps at each size below batch_size.
  seq_length: int  # Token positions per row.

  @classmethod
  def warmup(cls, batch_size: int, start: int, tokens: int, seq_length: int) -> "BatchSchedule":
    """The schedule whose sizes below `batch_size` (`start`, 2 x `start`, ...) read at least `tokens` token positions,
    each in as many steps; no warmup for `tokens` 0. The values as `config_checks` checks them: `start` divides
    `batch_size` and is smaller."""
    if not tokens:
      return cls(batch_size, batch_size, 0, seq_length)
    sizes = batch_size // start
    positions_per_step_of_each = seq_length * start * sizes * (sizes - 1) // 2  # One step at each size below.
    return cls(batch_size, start, -(-tokens // positions_per_step_of_each), seq_length)

  @classmethod
  def of(cls, config) -> "BatchSchedule":
    """A pretraining config's (checked): `batch_size`, `batch_warmup_start`, `batch_warmup_tokens`."""
    return cls.warmup(
      config.batch_size, config.batch_warmup_start, config.batch_warmup_tokens, config.data.max_seq_length
    )

  @property
  def warms_up(self) -> bool:
    return self.steps_per_size > 0

  @property
  def sizes(self) -> tuple[int, ...]:
    """Every size, smallest first: one compiled train step each."""
    return tuple(range(self.start, self.batch_size + 1, self.start))

  @property
  def warmup_steps(self) -> int:
    """The steps below `batch_size`: 1 to this."""
    return (len(self.sizes) - 1) * self.steps_per_size

  def size(self, step: int) -> int:
    """The rows of step `step` (from 1): start x (1 + (step - 1) // steps_per_size), at most batch_size."""
    if not self.warms_up or step > self.warmup_steps:
      return self.batch_size
    return self.start * (1 + (step - 1) // self.steps_per_size)

  def rows_through(self, step: int) -> int:
    """The rows of steps 1 to `step` (0: none)."""
    if step >= self.warmup_steps:  # Every size below batch_size for steps_per_size steps, then batch_size.
      below = len(self.sizes) - 1
      return self.start * self.steps_per_size * below * (below + 1) // 2 + (step - self.warmup_steps) * self.batch_size
    done = step // self.steps_per_size  # Sizes finished: start x (1 + ... + done), then steps of the next one.
    return self.start * (
      self.steps_per_size * done * (done + 1) // 2 + (step - done * self.steps_per_size) * (done + 1)
    )

  def tokens_through(self, step: int) -> int:
    """The token positions (padding included) of steps 1 to `step`."""
    return self.rows_through(step) * self.seq_length

  def step_reaching(self, tokens: float) -> int:
    """The first step by whose end steps 1 to it have read at least `tokens` token positions: a schedule's length
    in tokens as steps (a config's `num_train_steps`, `warmup_steps`)."""
    low, high = 0, self.warmup_steps + -(-int(tokens) // (self.batch_size * self.seq_length)) + 1
    while low < high:  # tokens_through grows with the step: the first step at or past `tokens`.
      middle = (low + high) // 2
      low, high = (middle + 1, high) if self.tokens_through(middle) < tokens else (low, middle)
    return low

  def describe(self) -> str:
    """The run header's line of the warmup."""
    return (
      f"{self.start:,} to {self.batch_size:,} rows, {self.start:,} more every {self.steps_per_size:,} steps (steps 1 "
      f"to {self.warmup_steps:,}: {self.tokens_through(self.warmup_steps):,} token positions), then "
      f"{self.batch_size:,}; {len(self.sizes)} compiled train steps, one per size; the learning-rate schedule counts "
      "steps"
    )
