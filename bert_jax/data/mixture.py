"""A mixture of prepared corpora (`data.mixture_sources`) drawn by a schedule of weights (`data.mixture_phases`): pure
bookkeeping, no TensorFlow, so the config checks read it; the stream draws by it in `mixed.py`.

Sources are `name=prepared_dir` pairs, comma-separated. Each phase (`phases.py`) draws a row's source with fixed
weights (`wiki=0.7,books=0.3`: a source not named is not drawn in that phase) or by a temperature over the sources'
token counts (`tau=0.7`: p proportional to n^tau, so tau 1 draws by size and 0 uniformly; `tau=0.7->0.3` anneals it
within the phase). Without phases, one phase at tau 1.
"""

import dataclasses
import math
import re

from bert_jax.data import phases

SOURCES_KEY, PHASES_KEY = "data.mixture_sources", "data.mixture_phases"
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
# A source absent from a phase: a logit no draw picks (finite, so that interpolation never makes a NaN).
ABSENT = -1e30


def sources(data) -> dict[str, str]:
  """name -> prepared directory of `data.mixture_sources`, in order; {} without a mixture. Raises naming the key."""
  named = {}
  for part in (p.strip() for p in data.mixture_sources.split(",")):
    if not part:
      continue
    name, equals, directory = (s.strip() for s in part.partition("="))
    if not equals or not directory or not _NAME.match(name):
      raise ValueError(
        f"{SOURCES_KEY}: {part!r} is not NAME=PREPARED_DIR (a name of letters, digits, '_', '-', '.'; e.g. "
        "'wiki=/data/wiki,books=gs://bucket/books')."
      )
    if name in named:
      raise ValueError(f"{SOURCES_KEY}: source {name!r} is named twice.")
    named[name] = directory
  return named


@dataclasses.dataclass(frozen=True)
class Draw:
  """One phase's draw: fixed `weights` (name -> weight), or temperatures `tau` (first, last)."""

  weights: dict | None = None
  tau: tuple[float, float] | None = None

  def logits(self, tokens: dict[str, int]) -> tuple[list[float], list[float]]:
    """The log-weights of every source (in the order of `tokens`: name -> token count) at the phase's beginning and
    end: a temperature's are tau x log n, interpolated linearly (so is tau); a source not drawn gets ABSENT."""
    if self.weights is not None:
      logits = [math.log(self.weights[name]) if name in self.weights else ABSENT for name in tokens]
      return logits, logits
    return tuple([tau * math.log(max(n, 1)) for n in tokens.values()] for tau in self.tau)

  def describe(self) -> str:
    if self.weights is not None:
      return "weights " + ", ".join(f"{name} {weight:g}" for name, weight in self.weights.items())
    first, last = self.tau
    return f"tau {first:g}" + (f" to {last:g}" if last != first else "")


def schedule(data) -> tuple[tuple[phases.Phase, ...], list[Draw]]:
  """The phases of `data.mixture_phases` (one at tau 1 when empty) and each one's draw, checked against the sources:
  weights positive and finite, of named sources; temperatures finite and >= 0. Raises naming the key and the phase."""
  names = sources(data)
  written = phases.parse(data.mixture_phases or "0: tau=1", PHASES_KEY)
  draws = []
  for phase in written:
    where = f"{PHASES_KEY}: phase {phase.begin!r}"
    if phase.first.startswith("tau=") or phase.last.startswith("tau="):
      taus = []
      for text in (phase.first, phase.last):
        if not text.startswith("tau="):
          raise ValueError(f"{where}: {text!r}: interpolate a temperature (tau=0.7->tau=0.3, or tau=0.7->0.3).")
        taus.append(phases.value(text[4:], where, "a temperature"))
      if min(taus) < 0:
        raise ValueError(f"{where}: temperature {min(taus):g} is negative; tau >= 0 (1: by size, 0: uniform).")
      draws.append(Draw(tau=tuple(taus)))
      continue
    if phase.interpolated:
      raise ValueError(f"{where}: weights cannot be interpolated; interpolate a temperature or add a phase.")
    weights = {}
    for part in (p.strip() for p in phase.first.split(",") if p.strip()):
      name, equals, weight = (s.strip() for s in part.partition("="))
      if not equals:
        raise ValueError(f"{where}: {part!r} is not SOURCE=WEIGHT or tau=T.")
      if name not in names:
        raise ValueError(f"{where}: {name!r} is not a source of {SOURCES_KEY} ({', '.join(names) or 'none'}).")
      value = phases.value(weight, where, f"{name}'s weight")
      if value <= 0:
        raise ValueError(
          f"{where}: {name}'s weight is {weight}; a weight is positive (leave a source out of a phase not to draw it)."
        )
      weights[name] = value
    draws.append(Draw(weights=weights))
  return written, draws


def planned_shares(draws: list[Draw], tokens: dict[str, int]) -> list[tuple[list[float], list[float]]]:
  """Each phase's share of rows per source at its beginning and end (softmax of `Draw.logits`)."""

  def shares(logits):
    top = max(logits)
    weights = [math.exp(x - top) for x in logits]
    return [w / sum(weights) for w in weights]

  return [tuple(shares(logits) for logits in draw.logits(tokens)) for draw in draws]


def describe(data, tokens: dict[str, int], spans: list) -> list[str]:
  """The run header's lines: each source with its tokens, and each phase (`phases.resolved` spans) with its draw and
  the planned share of rows per source."""
  written, draws = schedule(data)
  lines = [", ".join(f"{name} ({count:,} tokens)" for name, count in tokens.items())]
  for (begin, end, _, _), draw, (first, last) in zip(spans, draws, planned_shares(draws, tokens), strict=True):
    share = ", ".join(
      f"{name} {a:.1%}" + (f"->{b:.1%}" if abs(a - b) > 5e-4 else "")
      for name, a, b in zip(tokens, first, last, strict=True)
    )
    lines.append(f"steps {begin + 1:,}-{end:,}: {draw.describe()} ({share})")
  return lines
