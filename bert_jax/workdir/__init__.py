"""Everything that reads or writes a run's workdir: Orbax checkpoints (`checkpoints.py`), the checksums that prove
a step reads back as written (`checksums.py`), and the lease that lets one run at a time write (`lease.py`)."""
