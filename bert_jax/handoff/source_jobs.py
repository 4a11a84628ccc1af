"""The start of a job that reads a pretrained source onto the mesh and writes into a directory of its own
(`--mode=features`, `attention`, `heads`): the output directory, which must hold nothing yet; the mesh, with the
batch checked against it; the source read onto it; and, for a job over text lines, the input files."""

import dataclasses

from etils import epath

from bert_jax import paths, sharding
from bert_jax.handoff import pretrained


@dataclasses.dataclass(frozen=True)
class SourceJob:
  output: epath.Path
  mesh: object  # jax.sharding.Mesh
  loaded: pretrained.Pretrained  # Sharded on `mesh` by the config's logical axis rules.
  files: list[str]  # The input files, sorted (a job over text lines).


def start(config, section: str, workdir: str, lines: bool = True) -> SourceJob:
  """`config[section]`'s output_dir, batch_size, source (empty: the workdir's newest checkpoint) and, with `lines`,
  input_pattern, each checked before the source is read; raises naming the bad value."""
  settings = config[section]
  files = paths.glob(settings.input_pattern) if lines else []
  if lines and not files:
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
  return SourceJob(output, mesh, loaded, files)
