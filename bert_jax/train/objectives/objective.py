"""What an objective is: the `Objective` every module of `train/objectives/` defines (see `registry.py`)."""

import dataclasses
from collections.abc import Callable


def _no_frozen(config, model_cfg):
  return None


def _no_initial_params(config, run):
  return None


@dataclasses.dataclass(frozen=True)
class Objective:
  """One pretraining objective; see `registry.py`'s docstring for each field."""

  name: str
  model: Callable
  loss: Callable
  flops: Callable
  shown: Callable
  frozen: Callable = _no_frozen
  initial_params: Callable = _no_initial_params
