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

The pretraining job (`train/pretraining.py`: its description, which its loop job and the dry run use) asks
`of(config.objective)`; nothing branches on the name. Adding an objective is one module in this folder that defines
its `OBJECTIVE` (an `objective.Objective`) and one entry in `of`'s table (and `NAMES`).
"""

from bert_jax.train.objectives.objective import Objective

# config.objective: the names `of` knows (config_checks refuses others before anything is imported).
NAMES = ("bert", "distillation", "electra", "span_boundary")


def of(name: str) -> Objective:
  """The objective `name` (one of NAMES)."""
  # Imported when first asked for: config checks read NAMES without importing any objective.
  from bert_jax.train.objectives import bert, distillation, electra, span_boundary

  table = {
    "bert": bert.OBJECTIVE,
    "distillation": distillation.OBJECTIVE,
    "electra": electra.OBJECTIVE,
    "span_boundary": span_boundary.OBJECTIVE,
  }
  if name not in table:
    raise ValueError(f"objective={name!r}; expected one of {tuple(table)}.")
  return table[name]
