"""Training, for every job: the train state and pure steps (`step.py`), the one place that compiles them
(`run.py`), a job described once (`job_spec.py`), THE loop (`loop.py`) and THE start order (`start_order.py`),
the optimizers (`optim.py`) and the guard against non-finite steps (`guard.py`). Pretraining is a job on them
(`pretraining.py`, its start policy `pretraining_start.py`, the sources `init_from` names `init_from.py`), training
one of the objectives of `objectives/` (BERT, ELECTRA, distillation), chosen by name."""
