"""Steps that must not count: a loss, gradient norm or updated parameter that is not finite, and optionally a loss
spike. The jitted step (`train_step.train_step`) skips them on the device, so a checkpoint never holds non-finite
parameters; this module says which (`Guard`) and, on the host, watches the steps' flags (`Monitor`): it logs each
skipped step, counts them, and stops the run (`TrainingStopped`, a non-zero exit) on a non-finite step under
`guard.nonfinite="stop"` or after `guard.max_consecutive_skips` skipped steps in a row.

The monitor reads a step's flags one step late: when step n is dispatched it reads step n - 1's, which the device
has finished (step n waits on it), so watching never stalls the device queue. `flush` reads the newest step, before a
checkpoint is saved and at the end.
"""

import dataclasses

import jax
import numpy as np
from absl import logging

POLICIES = ("skip", "stop")


class TrainingStopped(RuntimeError):
  """The guard ended the run; the message names the step, why, and the newest checkpoint. That checkpoint holds no
  non-finite value, but the finite steps before the first skipped one were applied: a loss that climbed without
  turning non-finite (or spiking, with `guard.spike_factor`) is in it."""


@dataclasses.dataclass(frozen=True)
class Guard:
  """Which steps `train_step` skips: a non-finite loss, gradient norm or updated parameter, always; a loss above
  `spike_factor` x the running average loss (time constant `spike_window` steps, judged once that many steps were
  applied) when `spike_factor` > 0."""

  spike_factor: float = 0.0
  spike_window: int = 100

  @classmethod
  def from_config(cls, config) -> "Guard":
    return cls(spike_factor=config.guard.spike_factor, spike_window=config.guard.spike_window)


DEFAULT_GUARD = Guard()  # Non-finite steps only.


class Monitor:
  """Host side of the guard for one run (every member of a sweep alike: a member stuck alone does not stop the
  sweep; a non-finite step of any member under "stop" does)."""

  def __init__(self, config):
    self._stop_on_nonfinite = config.guard.nonfinite == "stop"
    self._max_consecutive = config.guard.max_consecutive_skips
    self._pending = None
    self._consecutive = 0
    self.skipped = 0
    self.newest_checkpoint: int | None = None  # Set by the loop: the step of the newest checkpoint it saved or resumed.

  def observe(self, step: int, metrics: dict) -> None:
    """Takes step `step`'s metrics (device arrays) and checks the previous step's."""
    flags = {name: metrics[name] for name in ("skipped_count", "nonfinite_count", "skipped_loss", "skipped_grad_norm")}
    previous, self._pending = self._pending, (step, flags)
    if previous is not None:
      self._check(*previous)

  def flush(self) -> None:
    """Checks the newest observed step (waits for it)."""
    previous, self._pending = self._pending, None
    if previous is not None:
      self._check(*previous)

  def _check(self, step: int, flags: dict) -> None:
    flags = {name: np.asarray(value) for name, value in jax.device_get(flags).items()}
    skipped = flags["skipped_count"] > 0
    if not skipped.any():
      self._consecutive = 0
      return
    nonfinite = bool((flags["nonfinite_count"] > 0).any())
    self.skipped += 1
    self._consecutive = self._consecutive + 1 if skipped.all() else 0
    why = "is not finite" if nonfinite else "is a spike above the running average"
    members = "" if skipped.ndim == 0 else f" (members {np.flatnonzero(skipped).tolist()})"
    detail = f"loss {flags['skipped_loss'].tolist()}, gradient norm {flags['skipped_grad_norm'].tolist()}"
    if nonfinite and self._stop_on_nonfinite:
      raise TrainingStopped(
        f"Step {step}{members}: {detail}: the step {why}. guard.nonfinite='stop' ends the run; the parameters "
        f"were not updated by it. {self._newest()} Lower the learning rate or set guard.nonfinite='skip'."
      )
    logging.warning("Skipped step %d%s: %s %s; parameters and optimizer state unchanged.", step, members, detail, why)
    if self._consecutive >= self._max_consecutive:
      raise TrainingStopped(
        f"Step {step}: {self._consecutive} consecutive steps skipped (guard.max_consecutive_skips="
        f"{self._max_consecutive}); the last: {detail}. The run stops. {self._newest()}"
      )

  def _newest(self) -> str:
    if self.newest_checkpoint is None:
      return "It has no checkpoint."
    return (
      f"Its newest checkpoint is step {self.newest_checkpoint}, with finite values only; the finite steps before the "
      "first skipped one were applied, so if the loss climbed before it (TensorBoard's train/loss), resume from an "
      "earlier step, and consider guard.spike_factor (e.g. 2) to skip such steps."
    )
