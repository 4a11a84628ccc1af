"""GLUE's files, apart from its tasks (`glue.py`): reading the TSVs (UTF-8 with or without a BOM, columns found by
header name, undecodable and short lines named), and the file names the GLUE server takes."""

import contextlib
import io

from absl import logging
from etils import epath

# The file names the GLUE server expects in the submission zip, by (task, test split).
SUBMISSION_FILES = {
  ("cola", "test"): "CoLA.tsv",
  ("sst2", "test"): "SST-2.tsv",
  ("mrpc", "test"): "MRPC.tsv",
  ("stsb", "test"): "STS-B.tsv",
  ("qqp", "test"): "QQP.tsv",
  ("mnli", "test_matched"): "MNLI-m.tsv",
  ("mnli", "test_mismatched"): "MNLI-mm.tsv",
  ("mnli", "ax"): "AX.tsv",
  ("qnli", "test"): "QNLI.tsv",
  ("rte", "test"): "RTE.tsv",
  ("wnli", "test"): "WNLI.tsv",
}


def submission_file_name(task_name: str, split: str) -> str:
  """The file name the GLUE server expects for a task's test split, e.g. ("mnli", "test_matched") -> MNLI-m.tsv."""
  key = (task_name.lower().replace("-", ""), split)
  if key not in SUBMISSION_FILES:
    raise ValueError(
      f"No GLUE submission file for task {task_name!r} split {split!r}; known: {list(SUBMISSION_FILES)}."
    )
  return SUBMISSION_FILES[key]


@contextlib.contextmanager
def open_text(path: epath.Path):
  """`path` as text for csv: UTF-8 without a leading BOM (Microsoft's MRPC files have one), newlines left to csv
  (they may be CRLF)."""
  with path.open("rb") as raw, io.TextIOWrapper(raw, encoding="utf-8-sig", newline="") as text:
    yield text


def undecodable_line(path: epath.Path) -> tuple[int, int]:
  """(1-based line number, first bad byte) of the first line of `path` that is not UTF-8."""
  for number, line in enumerate(path.read_bytes().splitlines(keepends=True), start=1):
    try:
      line.decode("utf-8-sig" if number == 1 else "utf-8")
    except UnicodeDecodeError as error:
      return number, line[error.start]
  return 0, 0


def column_finder(path, header: list[str], layout: str):
  """A function from candidate header names to the index of the first one present; raises naming the file."""

  def find(names: tuple[str, ...]) -> int:
    for name in names:
      if name in header:
        return header.index(name)
    raise ValueError(f"{path}:1: no column named {' or '.join(names)} in the header {header}; expected {layout}")

  return find


def log_short_lines(path, lines: list[int]) -> None:
  """One warning naming the lines of `path` skipped for missing fields (the first ten)."""
  if lines:
    shown = ", ".join(str(line) for line in lines[:10])
    logging.warning(
      "%s: skipped %d lines with missing fields (lines %s%s).", path, len(lines), shown, ", ..." * (len(lines) > 10)
    )
