"""Fine-tuning: the tasks (`glue.py`, `squad*.py`, `ner.py`, `swag.py`: readers, official metrics, prediction files)
behind the `Task` contract (`contract.py`, `tasks.py` by name), their losses (`losses.py`), and the job: a sweep's
members (`members.py`), the plan and the job described once (`plan.py`), rows on the mesh and prediction
(`rows.py`), and the job on the loop (`job.py`)."""
