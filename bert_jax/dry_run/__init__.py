"""Before booking a slice: compile a job's steps ahead of time for a mesh or a real Cloud TPU topology and report
what they need per chip (`ahead_of_time.py`), the TPU topologies themselves (`tpu_topology.py`), the collectives in
the compiled HLO (`hlo_stats.py`), and the largest batch that fits (`planner.py`)."""
