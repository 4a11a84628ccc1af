"""Everything that reads or writes a run's workdir: Orbax checkpoints (`checkpoints.py`: the items of a step, the
manager, saves), reading a step back verified (`reading.py`) against the checksums that prove it reads back as
written (`checksums.py`), and the lease that lets one run at a time write (`lease.py`)."""
