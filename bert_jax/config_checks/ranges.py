"""The numeric ranges a config key may take, and the check of a table of (key, range) pairs against a config."""

import dataclasses
import functools
import math
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class Range:
  """The values a numeric config key may take: from `low` to `high`, each end included unless open. NaN is in no
  range, and `inf` only in one that includes it."""

  low: float
  high: float = math.inf
  low_open: bool = False
  high_open: bool = True

  def __contains__(self, value) -> bool:
    above = self.low < value if self.low_open else self.low <= value
    below = value < self.high if self.high_open else value <= self.high
    return above and below

  def __str__(self) -> str:
    if self.high == math.inf and self.high_open:
      if self.low == 0:
        return "positive" if self.low_open else "non-negative"
      return f"greater than {self.low}" if self.low_open else f"at least {self.low}"
    return f"in {'(' if self.low_open else '['}{self.low}, {self.high}{')' if self.high_open else ']'}"


POSITIVE = Range(0, low_open=True)
NON_NEGATIVE = Range(0)
AT_LEAST_ONE = Range(1)


def check_ranges(config, ranges: Sequence[tuple]) -> None:
  """Raises ValueError naming the key, its value and its range for the first (dotted key, Range[, hint]) of `ranges`
  whose value is out of range; the hint follows the message."""
  for key, allowed, *hint in ranges:
    value = functools.reduce(lambda node, name: node[name], key.split("."), config)
    if value not in allowed:
      raise ValueError(" ".join([f"{key}={value} must be {allowed}.", *hint]))
