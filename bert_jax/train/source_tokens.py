"""What a mixture run has read of each source (`data/mixture.py`): the real tokens of the rows drawn from it, over the
whole run (a resume carries them on from its checkpoint's history), for the progress line, TensorBoard and the history
every checkpoint keeps.

Each host counts the rows it keeps of every batch (their `source`, which the pipeline adds to a mixture's rows); the
hosts' counts are summed where the loop reports or saves, which every host does at the same steps.
"""

import jax
import numpy as np
from jax.experimental import multihost_utils

HISTORY_KEY = "source_tokens"  # In the history: source name -> real tokens read.


class SourceTokens:
  """The real tokens read of each of `names` (a mixture's sources, in order; none: nothing counted), from `seen`
  (name -> tokens, a resumed checkpoint's history)."""

  def __init__(self, names: tuple[str, ...], seen: dict | None = None):
    self.names = names
    seen = seen or {}
    self._total = np.array([seen.get(name, 0) for name in names], np.int64)
    self._unsynced = np.zeros(len(names), np.int64)

  def count(self, host_batch: dict) -> None:
    """Takes a host batch's `source` out of it (the model never sees it) and counts its rows' real tokens."""
    drawn = host_batch.pop("source", None)
    if drawn is None or not self.names:
      return
    real = (np.asarray(host_batch["input_mask"]) > 0).sum(axis=1)
    self._unsynced += np.bincount(np.asarray(drawn), weights=real, minlength=len(self.names)).astype(np.int64)

  def sync(self) -> dict:
    """Every host's counts summed into the run's totals (collective: every host calls it at the same step); returns
    the history's entry."""
    counts = self._unsynced
    if jax.process_count() > 1:
      counts = np.asarray(multihost_utils.process_allgather(counts)).sum(axis=0)
    self._total += counts
    self._unsynced[:] = 0
    return dict(zip(self.names, self._total.tolist(), strict=True))

  def shares(self) -> dict:
    """`share/<name>`: each source's share of the tokens read so far (TensorBoard's scalars; the progress line shows
    them, `progress.Progress.report`)."""
    total = max(int(self._total.sum()), 1)
    return {f"share/{name}": float(count) / total for name, count in zip(self.names, self._total, strict=True)}
