"""launch/colab_tiny.ipynb as a user runs it, minus what needs Colab and the network: its own code cells, executed
in order in a fresh Python process on one CPU device (a Colab CPU runtime), with the parameters cell overridden to
a short run.

Skipped: cells tagged "install" (clone and pip install) and IPython's shell and magic lines (`!...`, `%...`),
which become `pass` so that an `if` around one stays valid Python. A fresh process, as a fresh kernel: the run
changes process-wide state (logging, matplotlib), and a native crash in it fails this test, not the session.
"""

import json
import math
import os
import pathlib
import subprocess
import sys

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


def run_notebook(parameters: dict) -> dict:
  """Executes the notebook's code cells but the "install" ones; returns the notebook's globals."""
  namespace = {}
  for index, cell in enumerate(_code_cells()):
    tags = cell["metadata"].get("tags", [])
    if "install" in tags:
      continue
    exec(compile(_python(cell), f"{NOTEBOOK.name}, code cell {index}", "exec"), namespace)
    if "parameters" in tags:  # As papermill injects parameters: a cell right after the parameters cell.
      namespace.update(parameters)
  return namespace


def test_the_notebook_is_clean_and_has_one_parameters_cell():
  cells = _code_cells()
  assert all(cell["outputs"] == [] and cell["execution_count"] is None for cell in cells)
  parameters = [cell for cell in cells if "parameters" in cell["metadata"].get("tags", [])]
  assert len(parameters) == 1
  namespace = {}
  exec(_python(parameters[0]), namespace)
  assert set(SHORT_RUN) | {"WORKDIR", "BERT_JAX_REPO"} <= set(namespace)


def test_the_notebook_pretrains_and_plots_a_falling_loss_curve(tmp_path):
  workdir, results = tmp_path / "bert_tiny", tmp_path / "results.json"
  env = dict(os.environ, JAX_PLATFORMS="cpu", MPLBACKEND="Agg")
  env.pop("XLA_FLAGS", None)  # One device, as on a Colab CPU runtime.
  run = subprocess.run(
    [sys.executable, __file__, str(workdir), str(results)], cwd=ROOT, env=env, capture_output=True, text=True
  )
  assert run.returncode == 0, run.stderr[-3000:]
  assert "backend 'cpu', 1 devices" in run.stdout
  assert "step 30/30 | loss" in run.stderr  # The notebook shows the loop's progress lines.
  shown = json.loads(results.read_text())

  # The curve read back from TensorBoard: one finite value per logged step, falling.
  logged_steps = list(range(5, 31, 5))
  steps, loss = shown["curves"]["loss"]
  assert steps == logged_steps
  assert all(math.isfinite(value) for value in loss)
  assert loss[-1] < loss[0], loss
  accuracy_steps, accuracy = shown["curves"]["mlm_accuracy"]
  assert accuracy_steps == logged_steps and all(0 <= value <= 1 for value in accuracy)
  # The figure shows those points and was saved.
  loss_lines, accuracy_lines = shown["figure"]
  assert loss_lines["loss"] == [steps, loss]
  assert "mlm_accuracy" in accuracy_lines
  assert (workdir / "train_curves.png").read_bytes().startswith(b"\x89PNG")


if __name__ == "__main__":  # The test's child process: python tests/test_notebook.py WORKDIR RESULTS_JSON
  import numpy as np

  sys.path.insert(0, str(ROOT))  # Where the notebook's install cell puts the clone.
  workdir, results = sys.argv[1:]
  namespace = run_notebook({**SHORT_RUN, "WORKDIR": workdir})
  curves = {tag: [steps.tolist(), values.tolist()] for tag, (steps, values) in namespace["curves"].items()}
  figure = [
    {
      line.get_label(): [np.asarray(line.get_xdata()).tolist(), np.asarray(line.get_ydata()).tolist()]
      for line in axes.get_lines()
    }
    for axes in namespace["fig"].axes
  ]
  pathlib.Path(results).write_text(json.dumps({"curves": curves, "figure": figure}))
