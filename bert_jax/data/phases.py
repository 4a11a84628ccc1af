"""Schedules over training written as phases (`data.mixture_phases`, `data.masking_phases`): pure bookkeeping, no
TensorFlow, so the config checks read them.

A schedule is phases separated by ";", each `BEGIN: VALUE`. BEGIN is where the phase begins: the steps before it (an
integer; the first phase begins at 0), or the token positions read before it (`2.5e9tokens`: the phase begins after
the first step by whose end the run has read that many, `batch_warmup.BatchSchedule.step_reaching`). VALUE is the
phase's value, or `FIRST->LAST` for one interpolated linearly within the phase, by the rows read (so by tokens), from
its beginning to the next phase's (the last phase: to `num_train_steps`).

The stream evaluates a schedule per batch of the data readers (`batch_warmup.BatchSchedule.start` rows of the global
stream): `Schedule.bounds` gives each phase's beginning in those batches, so a row's value is a function of its place in
the stream, the same on any host count and after any resume.
"""

import dataclasses
import math
import re

_TOKENS = re.compile(r"^([0-9.eE+]+)\s*tokens$")


@dataclasses.dataclass(frozen=True)
class Phase:
  """One phase as written: `begin` (steps, or `tokens` token positions, whichever was written) and its value text."""

  begin_steps: int | None
  begin_tokens: float | None
  first: str
  last: str  # == first unless interpolated.

  @property
  def begin(self) -> str:
    return f"{self.begin_tokens:g}tokens" if self.begin_tokens is not None else str(self.begin_steps)

  @property
  def interpolated(self) -> bool:
    return self.first != self.last


def parse(text: str, key: str) -> tuple[Phase, ...]:
  """The phases of `text` (the value of config key `key`), in order; raises naming the key and the bad part. Empty
  text: no phases."""
  phases = []
  for part in (p.strip() for p in text.split(";")):
    if not part:
      continue
    begin, colon, value = part.partition(":")
    if not colon or not value.strip():
      raise ValueError(f"{key}: phase {part!r} is not BEGIN: VALUE (e.g. '0: 0.3; 1000: 0.15' or '0: 0.3->0.05').")
    begin, value = begin.strip(), value.strip()
    steps = tokens = None
    if begin.isdigit():
      steps = int(begin)
    elif match := _TOKENS.match(begin):
      try:
        tokens = float(match.group(1))
      except ValueError:
        tokens = math.nan
      if not math.isfinite(tokens) or tokens < 0:
        raise ValueError(f"{key}: phase {part!r} begins at {begin!r}, not a number of tokens.")
    else:
      raise ValueError(
        f"{key}: phase {part!r} begins at {begin!r}: expected the steps before it (an integer) or the token positions "
        "read before it (e.g. 2.5e9tokens)."
      )
    first, arrow, last = value.partition("->")
    phases.append(Phase(steps, tokens, first.strip(), (last if arrow else first).strip()))
  if phases and (phases[0].begin_steps, phases[0].begin_tokens) not in ((0, None), (None, 0.0)):
    raise ValueError(f"{key}: the first phase begins at {phases[0].begin!r}; it must begin at 0.")
  return tuple(phases)


def value(text: str, key: str, what: str) -> float:
  """A phase's number (a rate, a temperature), finite; raises naming the key."""
  try:
    number = float(text)
  except ValueError:
    number = math.nan
  if not math.isfinite(number):
    raise ValueError(f"{key}: {text!r} is not {what} (a finite number).")
  return number


def end_step(config) -> int:
  """Where a pretraining run's schedules end: the learning-rate schedule's end (`schedule_end_step`, else
  `num_train_steps`); a schedule interpolated over its last phase reaches its last value there."""
  return config.schedule_end_step or config.num_train_steps


def begin_steps(phases: tuple[Phase, ...], batches, key: str) -> list[int]:
  """The steps before each phase (`batches`: the run's `BatchSchedule`, which turns tokens into steps); raises if
  phases are out of order (each must begin after the one before)."""
  steps = [p.begin_steps if p.begin_steps is not None else batches.step_reaching(p.begin_tokens) for p in phases]
  for before, after, phase_a, phase_b in zip(steps, steps[1:], phases, phases[1:], strict=False):
    if after <= before:
      raise ValueError(
        f"{key}: phases out of order: {phase_b.begin!r} (step {after}) does not begin after {phase_a.begin!r} (step "
        f"{before})."
      )
  return steps


def resolved(phases: tuple[Phase, ...], batches, end_step: int, key: str) -> list[tuple[int, int, str, str]]:
  """(first step, last step, first value, last value) of each phase: its steps are first + 1 to last; the last phase
  ends at `end_step` (the run's `num_train_steps`) or, past it, runs on at its last value."""
  steps = begin_steps(phases, batches, key)
  ends = [*steps[1:], max(end_step, steps[-1] + 1)]
  return [(begin, end, p.first, p.last) for begin, end, p in zip(steps, ends, phases, strict=True)]


def bounds(phases: tuple[Phase, ...], batches, end_step: int, key: str) -> list[int]:
  """Each phase's beginning in batches of `batches.start` rows, and the last one's end: the P + 1 boundaries the
  stream interpolates between."""
  spans = resolved(phases, batches, end_step, key)
  return [batches.rows_through(step) // batches.start for step in [s[0] for s in spans] + [spans[-1][1]]]


def same_before(old: list, new: list, at_step: int) -> bool:
  """Whether two resolved schedules (`resolved`) give every step up to `at_step` the same values: the phases that
  begin before it are the same, each to its end where it interpolates (its values depend on where it ends), else up
  to `at_step`. A resume at `at_step` may change what comes after: a schedule changed at a boundary it declares."""

  def before(spans):
    return [
      (begin, end if first != last else min(end, at_step), first, last)
      for begin, end, first, last in spans
      if begin < at_step
    ]

  return before(old) == before(new)


def step_list(text: str, key: str) -> list[int]:
  """The steps of a list of steps and ranges (`data_order.steps`: "1", "1000-1002,5000"), ascending; raises naming
  `key` and the bad part."""
  steps = set()
  for part in (p.strip() for p in text.split(",") if p.strip()):
    first, dash, last = part.partition("-")
    if not first.strip().isdigit() or (dash and not last.strip().isdigit()) or int(first) < 1:
      raise ValueError(f"{key}: {part!r} is not a step (from 1) or a range of steps (e.g. '1000-1002').")
    low, high = int(first), int(last) if dash else int(first)
    if high < low:
      raise ValueError(f"{key}: {part!r} ends before it begins.")
    steps.update(range(low, high + 1))
  if not steps:
    raise ValueError(f"{key} is empty: name a step (e.g. '1') or a range ('1000-1002').")
  return sorted(steps)
