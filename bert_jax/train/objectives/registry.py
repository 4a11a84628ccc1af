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

The pretraining job (`train/pretraining.py`: its job spec, which its loop job and the dry run use) asks
`of(config.objective)`; nothing branches on the name. Adding an objective is one module in this folder that defines
its `OBJECTIVE` (an `objective.Objective`) and one entry in `MODULES`; its keys' ranges and the keys it needs go with
every objective's checks (`config_checks/training.py`, `check_objective`).
"""

import importlib

from bert_jax.train.objectives.objective import Objective

# config.objective -> the module of this folder that defines it, imported when first asked for (`of`): the config
# checks read the names without importing any objective.
MODULES = {
  "bert": "bert",
  "distillation": "distillation",
  "electra": "electra",
  "span_boundary": "span_boundary",
}

NAMES = tuple(MODULES)  # What config_checks allows (it refuses others before anything is imported).


def of(name: str) -> Objective:
  """The objective `name` (one of NAMES)."""
  if name not in MODULES:
    raise ValueError(f"objective={name!r}; expected one of {NAMES}.")
  return importlib.import_module(f"bert_jax.train.objectives.{MODULES[name]}").OBJECTIVE
