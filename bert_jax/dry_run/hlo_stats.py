"""What a compiled program communicates: the collectives in its optimised HLO text, counted per step.

SPMD partitioning inserts the collectives a sharding implies (FSDP: all-gathers of parameters in the forward and
backward passes, reduce-scatters of gradients; data parallelism: all-reduces of gradients). XLA's TPU backend
wraps many in async or fused computations and clones them, so one collective can appear several times in the
text; each is counted once by its channel id, times the trip count of every loop around it (a scan over layers
runs its body num_layers times; the condition's bound is the trip count). A reduce-scatter on TPU is an
all-reduce inside an `all-reduce-scatter` fusion and is reported as a reduce-scatter.

Bytes are per device per step, of each collective's result summed over its executions: a gathered parameter's full
size, a gradient's full size (all-reduce, and the all-reduce of TPU's reduce-scatter fusions).
"""

import collections
import dataclasses
import re

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute", "ragged-all-to-all")
_DTYPE_BYTES = {
  "pred": 1,
  "s4": 0.5,
  "u4": 0.5,
  "s8": 1,
  "u8": 1,
  "s16": 2,
  "u16": 2,
  "f16": 2,
  "bf16": 2,
  "s32": 4,
  "u32": 4,
  "f32": 4,
  "s64": 8,
  "u64": 8,
  "f64": 8,
  "c64": 8,
  "c128": 16,
}
_ARRAY = re.compile(r"\b(pred|[suf]\d+|bf16|c64|c128|f8\w*)\[([\d,]*)\]")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([^\s(]+)\s*\(.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([^\s=]+)\s*=\s*(.*?)\s([a-z][\w\-]*)\((.*)$")
_CALLED = re.compile(r"\b(?:calls|to_apply|true_computation|false_computation)=%([\w.\-]+)")
_CALLED_SETS = re.compile(r"\b(?:branch_computations|called_computations)=\{([^}]*)\}")
_WHILE = re.compile(r"condition=%([\w.\-]+), body=%([\w.\-]+)")
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_CONSTANT = re.compile(r"\b[su]32\[\](?:\{[^}]*\})? constant\((\d+)\)")


def _array_sizes(text: str) -> list[int]:
  sizes = []
  for dtype, dims in _ARRAY.findall(text):
    size = 1
    for dim in filter(None, dims.split(",")):
      size *= int(dim)
    sizes.append(int(size * _DTYPE_BYTES.get(dtype, 1)))
  return sizes


def _computations(hlo_text: str) -> tuple[dict[str, list[str]], str]:
  computations, entry, current = {}, "", None
  for line in hlo_text.splitlines():
    header = _HEADER.match(line)
    if header and not line.startswith(" "):
      current = header[2]
      computations[current] = []
      if header[1]:
        entry = current
    elif current is not None and line.strip() and line.strip() != "}":
      computations[current].append(line)
  return computations, entry


def _trip_count(line: str, condition: list[str]) -> int | None:
  known = _TRIP_COUNT.search(line)
  if known:
    return int(known[1])
  bounds = {int(value) for text in condition for value in _CONSTANT.findall(text)}
  return bounds.pop() if len(bounds) == 1 else None


@dataclasses.dataclass(frozen=True)
class Collectives:
  """Per kind: executions per step and bytes per device per step; `loops` the trip counts found (None: a loop
  whose bound could not be read, counted once)."""

  count: dict
  bytes: dict
  loops: tuple

  def describe(self) -> str:
    if not self.count:
      return "none"
    described = (
      f"{kind} {self.count[kind]} ({format_bytes(self.bytes[kind])})" for kind in KINDS if kind in self.count
    )
    return ", ".join(described)


def format_bytes(size: float | None) -> str:
  """GiB from a tenth of one, else MiB; "unknown" for None."""
  if size is None:
    return "unknown"
  return f"{size / 2**30:.2f} GiB" if abs(size) >= 2**30 / 10 else f"{size / 2**20:.1f} MiB"


def collectives(hlo_text: str) -> Collectives:
  """The collectives of an optimised HLO module (`compiled.as_text()`), per step."""
  computations, entry = _computations(hlo_text)
  seen = {}  # channel id (or instruction name) -> (kind, bytes, executions)
  loops = []
  stack = [(entry, 1)]
  visited = set()
  while stack:
    name, multiplier = stack.pop()
    if (name, multiplier) in visited or name not in computations:
      continue
    visited.add((name, multiplier))
    for line in computations[name]:
      instruction = _INSTRUCTION.match(line)
      if not instruction:
        continue
      result, opcode = instruction[2], instruction[3]
      while_loop = _WHILE.search(line) if opcode == "while" else None
      if while_loop:
        trips = _trip_count(line, computations.get(while_loop[1], []))
        loops.append(trips)
        stack.append((while_loop[2], multiplier * (trips or 1)))
        continue
      for called in _CALLED.findall(line):
        stack.append((called, multiplier))
      for group in _CALLED_SETS.findall(line):
        stack.extend((called.strip().lstrip("%"), multiplier) for called in group.split(",") if called.strip())
      kind = opcode.removesuffix("-start")
      if kind not in KINDS:
        continue
      if kind == "all-reduce" and name.startswith("all-reduce-scatter"):
        kind = "reduce-scatter"
      channel = re.search(r"channel_id=(\d+)", line)
      key = channel[1] if channel else f"{name}/{instruction[1]}"
      # An async all-gather's or permute's start returns its operands, then its outputs: the outputs count.
      sizes = _array_sizes(result)
      if opcode in ("all-gather-start", "collective-permute-start"):
        sizes = sizes[len(sizes) // 2 :]
      size = sum(sizes)
      previous = seen.get(key)
      if previous is None or previous[2] < multiplier:
        seen[key] = (kind, size, multiplier)
  count, total = collections.Counter(), collections.Counter()
  for kind, size, executions in seen.values():
    count[kind] += executions
    total[kind] += size * executions
  return Collectives(dict(count), dict(total), tuple(loops))
