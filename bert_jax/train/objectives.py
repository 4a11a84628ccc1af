"""Pretraining objectives by name (`config.objective`): what differs between them, so that every one trains on the
same step, loop, sharding, checkpoints and hand-off. An objective is a model, a loss and what they count, not a
fork of the trainer.

An `Objective` gives:
- `model(config, model_cfg)`: the module the run trains (the train state holds its parameters);
- `frozen(config, model_cfg)`: parameters its loss reads and never trains (a distillation teacher), described from
  metadata as a `run.Frozen`, or None; the run reads them onto its mesh before anything is written;
- `loss(config, frozen)`: the step's `Loss` (`train/step.py`);
- `flops(config, model_cfg, frozen, training)`: model FLOPs of a train step, or (not `training`) of the eval
  step's forward passes (flops.py holds the formulas);
- `shown(config, evaluation)`: the metrics a progress line (or, `evaluation`, an eval line) shows;
- `initial_params(config, run)`: what a new run starts from when `init_from` names nothing (a distillation
  student: its teacher's layers), as (params, a line saying what they are), or None: a fresh initialisation.

`pretraining.make_run`, `PretrainingJob` and the dry run ask `of(config.objective)`; none of them branches on the
name. Adding an objective is one module that defines its `OBJECTIVE` and one entry in `of`'s table (and `NAMES`).
"""

import dataclasses
from collections.abc import Callable

# config.objective: the names `of` knows (config_checks refuses others before anything is imported).
NAMES = ("bert", "distillation", "electra")


def _no_frozen(config, model_cfg):
  return None


def _no_initial_params(config, run):
  return None


@dataclasses.dataclass(frozen=True)
class Objective:
  """One pretraining objective; see the module docstring."""

  name: str
  model: Callable
  loss: Callable
  flops: Callable
  shown: Callable
  frozen: Callable = _no_frozen
  initial_params: Callable = _no_initial_params


def of(name: str) -> Objective:
  """The objective `name` (one of NAMES)."""
  # Each defines its objective with this module's dataclass.
  from bert_jax.train import distillation, electra, pretraining

  table = {"bert": pretraining.OBJECTIVE, "distillation": distillation.OBJECTIVE, "electra": electra.OBJECTIVE}
  if name not in table:
    raise ValueError(f"objective={name!r}; expected one of {tuple(table)}.")
  return table[name]
