"""launch/colab_tiny.ipynb as a user runs it, minus what needs Colab and the network: its own code cells, executed
in order in this process on CPU (8 fake devices), with the parameters cell overridden to a short run.

Skipped: cells tagged "install" (clone and pip install) and IPython's shell and magic lines (`!...`, `%...`),
which become `pass` so that an `if` around one stays valid Python.
"""

import json
import math
import pathlib

import matplotlib
import pytest
from absl import logging

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "launch" / "colab_tiny.ipynb"
SHORT_RUN = {"NUM_TRAIN_STEPS": 30, "LOG_EVERY_STEPS": 5}


def _python(cell: dict) -> str:
  """A code cell's source without IPython's shell and magic lines."""
  lines = []
  for line in "".join(cell["source"]).splitlines():
    code = line.lstrip()
    lines.append(line[: len(line) - len(code)] + "pass" if code.startswith(("!", "%")) else line)
  return "\n".join(lines)


def _code_cells() -> list[dict]:
  notebook = json.loads(NOTEBOOK.read_text())
  assert notebook["nbformat"] == 4
  return [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]


def test_the_notebook_is_clean_and_has_one_parameters_cell():
  cells = _code_cells()
  assert all(cell["outputs"] == [] and cell["execution_count"] is None for cell in cells)
  parameters = [cell for cell in cells if "parameters" in cell["metadata"].get("tags", [])]
  assert len(parameters) == 1
  namespace = {}
  exec(_python(parameters[0]), namespace)
  assert set(SHORT_RUN) | {"WORKDIR", "BERT_JAX_REPO"} <= set(namespace)


@pytest.fixture
def notebook_globals():
  """No display (figures render to files); what the notebook changes in this process is put back afterwards."""
  matplotlib.use("Agg")
  verbosity = logging.get_verbosity()
  yield
  import matplotlib.pyplot as plt

  plt.close("all")
  logging.set_verbosity(verbosity)


def test_the_notebook_pretrains_and_plots_a_falling_loss_curve(tmp_path, capsys, notebook_globals):
  workdir = tmp_path / "bert_tiny"
  namespace = {}
  for index, cell in enumerate(_code_cells()):
    tags = cell["metadata"].get("tags", [])
    if "install" in tags:
      continue
    exec(compile(_python(cell), f"{NOTEBOOK.name}, code cell {index}", "exec"), namespace)
    if "parameters" in tags:  # As papermill injects parameters: a cell right after the parameters cell.
      namespace.update(SHORT_RUN, WORKDIR=str(workdir))

  assert "backend 'cpu', 8 devices" in capsys.readouterr().out
  # The curve read back from TensorBoard: one finite value per logged step, falling.
  logged_steps = list(range(5, 31, 5))
  steps, loss = namespace["curves"]["loss"]
  assert steps.tolist() == logged_steps
  assert all(math.isfinite(value) for value in loss)
  assert loss[-1] < loss[0], loss.tolist()
  accuracy_steps, accuracy = namespace["curves"]["mlm_accuracy"]
  assert accuracy_steps.tolist() == logged_steps and all(0 <= value <= 1 for value in accuracy)
  # The figure shows those points and was saved.
  loss_axes, accuracy_axes = namespace["fig"].axes
  (loss_line,) = [line for line in loss_axes.get_lines() if line.get_label() == "loss"]
  assert list(loss_line.get_xdata()) == logged_steps and list(loss_line.get_ydata()) == loss.tolist()
  assert any(line.get_label() == "mlm_accuracy" for line in accuracy_axes.get_lines())
  assert (workdir / "train_curves.png").read_bytes().startswith(b"\x89PNG")
