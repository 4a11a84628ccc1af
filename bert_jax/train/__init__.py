"""Training: the train state and pure steps (`step.py`), the one place that compiles them (`run.py`), the loop
(`loop.py`), where a run starts (`start_order.py`), the pretraining objective (`pretraining.py`), the optimizers
(`optim.py`) and the guard against non-finite steps (`guard.py`)."""
