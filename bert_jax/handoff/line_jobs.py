"""The start of a job over text lines with a pretrained encoder (`--mode=features`, `--mode=attention`): the input
files, an output directory that holds nothing yet, the mesh, and the encoder read onto it."""

import dataclasses

from etils import epath

from bert_jax import paths, sharding
from bert_jax.handoff import pretrained


@dataclasses.dataclass(frozen=True)
class LineJob:
  files: list[str]  # The input files, sorted.
  output: epath.Path
  mesh: object  # jax.sharding.Mesh
  loaded: pretrained.Pretrained  # Sharded on `mesh` by the config's logical axis rules.


def start(config, section: str, workdir: str) -> LineJob:
  """`config[section]`'s input_pattern, output_dir, batch_size and source (empty: the workdir's newest checkpoint),
  checked before the encoder is read; raises naming the bad value."""
  settings = config[section]
  files = paths.glob(settings.input_pattern)
  if not files:
    raise FileNotFoundError(f"{section}.input_pattern={settings.input_pattern!r} matches no file.")
  output = epath.Path(settings.output_dir)
  if output.exists() and any(output.iterdir()):  # Two runs' outputs must never mix; nothing is overwritten.
    raise FileExistsError(f"{section}.output_dir={output} is not empty; remove it or choose another directory.")
  mesh = sharding.make_mesh(config.mesh.to_dict())
  if settings.batch_size % sharding.data_parallel_size(mesh):
    raise ValueError(
      f"{section}.batch_size={settings.batch_size} does not split over the {sharding.data_parallel_size(mesh)} "
      "data-parallel devices of the mesh."
    )
  rules = config.logical_axis_rules
  loaded = pretrained.load(settings.source or workdir, scan_layers=config.model.scan_layers, mesh=mesh, rules=rules)
  return LineJob(files, output, mesh, loaded)
