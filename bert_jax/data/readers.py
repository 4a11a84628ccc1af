"""How the pretraining stream is divided: a fixed number of virtual readers (`data.num_readers`), the units of the
corpus each reads, and the readers each host runs. Pure bookkeeping (no TensorFlow), so config checks can use it.

The global batch of a step is the readers' batches in reader order, and each host runs the readers of its rows of
it: whatever the host count, the global stream is the same.
"""

import os


def host_readers(num_readers: int, batch_size: int, process_index: int, process_count: int) -> dict[int, slice]:
  """The readers host `process_index` of `process_count` runs, each with the rows of its batches the host keeps.

  The host's rows of the global batch are a contiguous block (as `jax.make_array_from_process_local_data` takes
  them), reader r's rows are `[r, r + 1) * batch_size / num_readers`: the host runs every reader whose rows overlap
  its own. With more hosts than readers, hosts share a reader: each computes its batches and keeps its part.
  """
  if batch_size % num_readers or batch_size % process_count:
    raise ValueError(
      f"batch_size={batch_size} must divide over data.num_readers={num_readers} readers and {process_count} hosts."
    )
  per_reader, per_host = batch_size // num_readers, batch_size // process_count
  first, stop = process_index * per_host, (process_index + 1) * per_host
  return {
    reader: slice(
      max(first, reader * per_reader) - reader * per_reader, min(stop, (reader + 1) * per_reader) - reader * per_reader
    )
    for reader in range(first // per_reader, (stop - 1) // per_reader + 1)
  }


def reader_units(manifest: dict, reader: int, num_readers: int) -> list[tuple[int, int, int]]:
  """(shard, stripe, stripes) of each unit `reader` reads: the documents `stripe::stripes` of the shard.

  With at least as many shards as readers a unit is a whole shard (reader r: shards r::num_readers); with fewer,
  every shard is cut into ceil(num_readers / shards) stripes and the units are dealt to the readers in turn.
  """
  num_shards = len(manifest["shards"])
  stripes = -(-num_readers // num_shards)
  units = [(shard, stripe, stripes) for shard in range(num_shards) for stripe in range(stripes)]
  return units[reader::num_readers]


def reader_files(prepared_dir: str, manifest: dict, readers, num_readers: int) -> list[str]:
  """The shard files that the given readers (of `num_readers`) read (to name a corrupt one)."""
  shards = sorted({shard for r in readers for shard, _, _ in reader_units(manifest, r, num_readers)})
  return [os.path.join(prepared_dir, manifest["shards"][shard]["file"]) for shard in shards]


def uneven_share(num_shards: int, num_readers: int) -> str:
  """Why `num_shards` shards do not divide evenly over `num_readers` readers (`reader_units`), or "" when they do.
  Readers whose units are fewer finish their pass sooner and start again, so their documents are read more often
  than the others' (a 17-to-16 split reads some shards 6% more often)."""
  stripes = -(-num_readers // num_shards)
  units = num_shards * stripes
  if units % num_readers == 0:
    return ""
  fewer, more = units // num_readers, units // num_readers + 1
  return (
    f"{num_shards} shards over data.num_readers={num_readers} readers: {units % num_readers} readers read {more} "
    f"unit(s) and {num_readers - units % num_readers} read {fewer}, so the documents of the latter are read "
    f"{more / fewer - 1:.0%} more often"
  )
