"""The masking rate as a schedule over training (`data.masking_phases`, phases as `phases.py` writes them): each phase's
rates read and checked, the schedule resolved to the stream's batches (`MaskingRates`), and the run header's line. No
TensorFlow, so the config checks read it; the pipeline's side (each instance's thresholds, each batch's trim):
`masking.py`.

Every instance is selected at `data.masked_lm_prob`, and each prediction carries the lowest rate at which it is kept
(`masking.mask_tokens(..., thresholds=True)`). After batching, each reader batch b is trimmed to the rate of its place
in the stream (`masking.trim_to_rate`): within phase p (reader batches `bounds[p]` to `bounds[p + 1]`), `firsts[p] +
(b - bounds[p]) / (bounds[p + 1] - bounds[p]) x (lasts[p] - firsts[p])`; past the last bound, the last phase's last
rate. The rate is a function of b alone: a resume, on any host count, trims as the run it continues.
"""

import dataclasses

from bert_jax.data import phases
from bert_jax.data.batch_warmup import BatchSchedule

KEY = "data.masking_phases"


@dataclasses.dataclass(frozen=True)
class PhaseRates:
  """One phase of the schedule as written (`phase.begin`), with its rates: `first` to `last` (equal: constant)."""

  phase: phases.Phase
  first: float
  last: float

  @property
  def written(self) -> str:
    """The phase as the config wrote it."""
    value = self.phase.first if not self.phase.interpolated else f"{self.phase.first}->{self.phase.last}"
    return f"{self.phase.begin}: {value}"


def phase_rates(text: str) -> list[PhaseRates]:
  """The phases of `data.masking_phases` with their rates, as numbers; raises naming the key and the bad phase (not
  `BEGIN: RATE`, a rate that is not a finite number). Their range: `config_checks.training`."""
  return [
    PhaseRates(phase, phases.value(phase.first, KEY, "a masking rate"), phases.value(phase.last, KEY, "a masking rate"))
    for phase in phases.parse(text, KEY)
  ]


@dataclasses.dataclass(frozen=True)
class MaskingRates:
  """The schedule in the stream's batches (each `BatchSchedule.start` rows of the global stream): phase p spans reader
  batches `bounds[p]` to `bounds[p + 1]` (P + 1 bounds) and goes from `firsts[p]` to `lasts[p]`. Plain tuples: the
  pipeline takes it whole, and its trim is traced once per schedule."""

  bounds: tuple[int, ...]
  firsts: tuple[float, ...]
  lasts: tuple[float, ...]

  @classmethod
  def of(cls, config) -> "MaskingRates | None":
    """A checked pretraining config's schedule (`data.masking_phases`, the batch schedule, `phases.end_step`); None
    without one (every batch at `data.masked_lm_prob`)."""
    rates = phase_rates(config.data.masking_phases)
    if not rates:
      return None
    bounds = phases.bounds([r.phase for r in rates], BatchSchedule.of(config), phases.end_step(config), KEY)
    return cls(tuple(bounds), tuple(r.first for r in rates), tuple(r.last for r in rates))


def describe(config) -> str:
  """The run header's line of a checked config's schedule ('' without one): each phase's rate and steps, and the
  rate every instance is selected at."""
  rates = phase_rates(config.data.masking_phases)
  if not rates:
    return ""
  spans = phases.resolved([r.phase for r in rates], BatchSchedule.of(config), phases.end_step(config), KEY)
  parts = []
  for (begin, end, _, _), rate in zip(spans, rates, strict=True):
    value = _percent(rate.first) if rate.first == rate.last else f"{_percent(rate.first)}->{_percent(rate.last)}"
    parts.append(f"{value} (steps {begin + 1:,}-{end:,})")
  return (
    f"by phase: {', '.join(parts)}; selected at {_percent(config.data.masked_lm_prob)} "
    "(data.masked_lm_prob), each step's rows trimmed to its rate"
  )


def _percent(rate: float) -> str:
  return f"{100 * rate:.3g}%"
