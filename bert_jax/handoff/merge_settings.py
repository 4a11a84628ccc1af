"""What `--mode=merge` is asked for (`config.merge`), read and checked without I/O: the config checks read it
before anything runs, and the merge job (`merge.py`) reads it the same way. Nothing imported but the standard
library."""

import dataclasses
import math

ITEMS = ("params", "ema")  # What each checkpoint gives the mean: its parameters, or their moving average.


@dataclasses.dataclass(frozen=True)
class Request:
  """`config.merge`, parsed: `count()` checkpoints of one model, averaged with `weights`."""

  sources: tuple[str, ...]  # The paths named (empty: the workdir).
  last: int  # The newest this many steps of the one workdir (0: not asked).
  steps: tuple[int, ...]  # These steps of the one workdir (empty: not asked).
  weights: tuple[float, ...] | None  # One per checkpoint, as given; None: equal.
  item: str  # One of ITEMS.
  output_dir: str

  def count(self) -> int:
    """How many checkpoints are averaged (known before any is read)."""
    return self.last or len(self.steps) or max(len(self.sources), 1)

  def what(self) -> str:
    """How the checkpoints are named, for messages: "merge.last=3", "merge.steps=(4, 6)", "merge.sources (2)"."""
    if self.last:
      return f"merge.last={self.last}"
    if self.steps:
      return f"merge.steps={self.steps}"
    return f"merge.sources ({len(self.sources)})" if self.sources else "the workdir"


def _items(text: str) -> list[str]:
  """The comma-separated entries of `text`, stripped; none for an empty string."""
  return [entry.strip() for entry in text.split(",")] if text.strip() else []


def _weights(text: str) -> tuple[float, ...] | None:
  """`merge.weights` as numbers, each refused unless it is finite and positive, naming it and its place."""
  entries = _items(text)
  if not entries:
    return None
  weights = []
  for place, entry in enumerate(entries, 1):
    try:
      weight = float(entry)
    except ValueError:
      raise ValueError(f"merge.weights={text!r}: weight {place}, {entry!r}, is not a number.") from None
    if not (math.isfinite(weight) and weight > 0):
      raise ValueError(
        f"merge.weights={text!r}: weight {place} is {entry}; every weight must be a positive finite number (the "
        "mean divides by their sum)."
      )
    weights.append(weight)
  return tuple(weights)


def _steps(text: str) -> tuple[int, ...]:
  """`merge.steps` as step numbers, ascending; refused naming an entry that is not one, or a step named twice."""
  steps = []
  for entry in _items(text):
    if not entry.isdigit():
      raise ValueError(f"merge.steps={text!r}: {entry!r} is not a step number.")
    steps.append(int(entry))
  twice = sorted({step for step in steps if steps.count(step) > 1})
  if twice:
    raise ValueError(f"merge.steps={text!r} names step(s) {twice} twice.")
  return tuple(sorted(steps))


def parse(settings) -> Request:
  """`config.merge` as a `Request`, every value checked that can be without reading a file; raises ValueError naming
  the key, its value and what was expected."""
  sources = tuple(_items(settings.sources))
  if "" in sources:
    raise ValueError(f"merge.sources={settings.sources!r} has an empty entry.")
  twice = sorted({source for source in sources if sources.count(source) > 1})
  if twice:
    raise ValueError(f"merge.sources names {twice} twice.")
  if settings.last < 0:
    raise ValueError(f"merge.last={settings.last} must be non-negative (0: not asked).")
  request = Request(
    sources=sources,
    last=settings.last,
    steps=_steps(settings.steps),
    weights=_weights(settings.weights),
    item="ema" if settings.ema else "params",
    output_dir=settings.output_dir,
  )
  if not request.output_dir:
    raise ValueError("merge.output_dir is empty: name the bundle to write (local or gs://).")
  if request.last and request.steps:
    raise ValueError(
      f"merge.last={request.last} and merge.steps={settings.steps!r} both name the steps: set one of them."
    )
  if (request.last or request.steps) and len(sources) > 1:
    raise ValueError(
      f"{request.what()} names steps of one workdir, but merge.sources names {len(sources)}: {list(sources)}."
    )
  if request.weights is not None and len(request.weights) != request.count():
    raise ValueError(
      f"merge.weights has {len(request.weights)} weight(s) for the {request.count()} checkpoint(s) of "
      f"{request.what()}: expected one weight per checkpoint."
    )
  if request.count() == 1 and request.item == "params":
    raise ValueError(
      f"{request.what()} names one checkpoint: its mean is itself. Name more (merge.last, merge.steps, "
      "merge.sources), or set merge.ema to write out its moving average (--mode=export writes its parameters)."
    )
  return request
