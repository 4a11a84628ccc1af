"""`config.contrastive` read and checked (`Contrastive`): the embeddings task's loss settings and the hard negatives
of its training rows. Light (no JAX): config checks read it."""

import dataclasses


def matryoshka_dims(text: str) -> tuple[int, ...]:
  """`contrastive.matryoshka_dims` ("768,512,...") as a tuple; refuses what is not distinct positive integers."""
  try:
    dims = tuple(int(x) for x in text.split(",")) if text.strip() else ()
  except ValueError:
    raise ValueError(f"contrastive.matryoshka_dims={text!r} is not a comma-separated list of integers.") from None
  if any(d < 1 for d in dims) or len(set(dims)) != len(dims):
    raise ValueError(f"contrastive.matryoshka_dims={text!r}: expected distinct positive dimensions, got {dims}.")
  return dims


def check_matryoshka_dims(dims, dim: int) -> None:
  """Refuses Matryoshka dimensions outside (0, dim], naming them."""
  bad = [d for d in dims if not 0 < d <= dim]
  if bad:
    raise ValueError(f"contrastive.matryoshka_dims={tuple(dims)}: {bad} outside 1..{dim}, the embedding's dimension.")


@dataclasses.dataclass(frozen=True)
class Contrastive:
  """config.contrastive, checked: the loss's scale, direction and Matryoshka dimensions, and the hard negatives each
  training row carries."""

  scale: float
  symmetric: bool
  matryoshka_dims: tuple[int, ...]
  hard_negatives: int

  @classmethod
  def from_config(cls, contrastive) -> "Contrastive":
    if not contrastive.scale > 0:
      raise ValueError(f"contrastive.scale={contrastive.scale}; expected a positive scale (1 / temperature).")
    if contrastive.hard_negatives < 0:
      raise ValueError(f"contrastive.hard_negatives={contrastive.hard_negatives}; expected 0 or more.")
    return cls(
      float(contrastive.scale),
      bool(contrastive.symmetric),
      matryoshka_dims(contrastive.matryoshka_dims),
      int(contrastive.hard_negatives),
    )
