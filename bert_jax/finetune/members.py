"""A fine-tuning sweep's members: every (learning rate, seed) pair `config.sweep` names, trained together in one
program (`finetune/job.py`). Light: config checks read it."""

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class Member:
  """One model of a fine-tuning sweep: its peak learning rate and its seed (head initialisation and dropout)."""

  learning_rate: float
  seed: int


def sweep_members(config) -> tuple[Member, ...]:
  """Every (learning rate, seed) pair of `config.sweep`, learning rate major."""
  text = config.sweep.learning_rates
  try:
    rates = [float(x) for x in text.split(",")] if text else [config.learning_rate]
  except ValueError:
    raise ValueError(f"sweep.learning_rates={text!r} is not a comma-separated list of numbers.") from None
  if not all(0 < rate < math.inf for rate in rates):
    raise ValueError(f"sweep.learning_rates={text!r}: every learning rate must be positive and finite, got {rates}.")
  return tuple(Member(rate, config.seed + index) for rate in rates for index in range(config.sweep.seeds))
