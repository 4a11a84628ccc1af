"""launch/colab_tiny.ipynb as shipped, executed by a Jupyter kernel from where a user opens it (the checkout's
launch/ directory): every cell, in order, magics included. The kernel runs in a virtualenv of its own that sees this
environment's packages but not bert_jax, so the notebook's install cell has to install the checkout (pip, with no
network); with no accelerator, its JAX cell keeps the CPU build. Then the whole demo run of configs/tiny.py, its
comparison with the unigram model on the held-out documents, the plot and TensorBoard.
"""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import sysconfig

import nbformat
import pytest
from nbclient import NotebookClient

from bert_jax import console

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "launch" / "colab_tiny.ipynb"
KERNEL = "bert_jax_notebook_test"


def _text(cell) -> str:
  """A code cell's printed text: streams, results and errors."""
  parts = []
  for output in cell.get("outputs", []):
    parts.append(output.get("text", "") or output.get("data", {}).get("text/plain", ""))
    parts.extend(output.get("traceback", []))
  return "".join(parts)


def _cell(notebook, start: str):
  (cell,) = [cell for cell in notebook.cells if cell.cell_type == "code" and cell.source.startswith(start)]
  return cell


def _kernel_environment(tmp_path: pathlib.Path) -> pathlib.Path:
  """A kernel spec (under the returned JUPYTER_PATH) whose Python is a fresh virtualenv seeing this one's packages
  through a .pth line, where the editable install of bert_jax (a .pth finder of its own) is not active."""
  venv = tmp_path / "kernel-venv"
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
  python = venv / "bin" / "python"
  purelib = subprocess.run(
    [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True
  ).stdout.strip()
  pathlib.Path(purelib, "outer_environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
  assert subprocess.run([python, "-c", "import bert_jax"], cwd=tmp_path, capture_output=True).returncode != 0
  home = tmp_path / "home"
  home.mkdir()
  env = {
    "HOME": str(home),  # The notebook's default WORKDIR outside Colab is ~/bert_tiny.
    "TMPDIR": str(tmp_path),  # TensorBoard's notebook records, to find its server afterwards.
    "JAX_PLATFORMS": "cpu",  # One CPU device, as on a Colab CPU runtime.
    "XLA_FLAGS": "",
    "PIP_NO_INDEX": "1",  # No network: the checkout's dependencies are all here already.
    "PIP_NO_BUILD_ISOLATION": "0",  # Build with this environment's setuptools, not one downloaded.
    "PATH": f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",  # `tensorboard`.
  }
  spec = tmp_path / "jupyter" / "kernels" / KERNEL
  spec.mkdir(parents=True)
  argv = [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"]
  spec.joinpath("kernel.json").write_text(
    json.dumps({"argv": argv, "display_name": KERNEL, "language": "python", "env": env})
  )
  return venv


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
  tmp_path = tmp_path_factory.mktemp("notebook")
  venv = _kernel_environment(tmp_path)
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  saved = {name: os.environ.get(name) for name in ("JUPYTER_PATH", "JUPYTER_RUNTIME_DIR", "MPLBACKEND")}
  os.environ.update(JUPYTER_PATH=str(tmp_path / "jupyter"), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
  os.environ.pop("MPLBACKEND", None)  # The kernel's own inline backend, as in Jupyter.
  try:
    client = NotebookClient(
      notebook, timeout=600, kernel_name=KERNEL, resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    )
    client.execute()  # Raises on the first cell that fails.
  finally:
    for name, value in saved.items():
      os.environ.pop(name, None) if value is None else os.environ.update({name: value})
    for info in (tmp_path / ".tensorboard-info").glob("pid-*.info"):  # The server %tensorboard started.
      try:
        os.kill(json.loads(info.read_text())["pid"], signal.SIGTERM)
      except ProcessLookupError:
        pass
  return dict(notebook=notebook, venv=venv, workdir=tmp_path / "home" / "bert_tiny")


def test_the_notebook_is_shipped_clean_with_one_repository_cell():
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
  assert all(cell.outputs == [] and cell.execution_count is None for cell in cells)
  (repository,) = [cell for cell in cells if "repository" in cell.metadata.get("tags", [])]
  assert cells[0] is repository and 'BERT_JAX_REPO = ""' in repository.source  # Default: the clone it sits in.


@pytest.mark.slow
def test_the_notebook_as_shipped_installs_the_checkout_and_its_demo_beats_word_frequencies(executed):
  notebook, venv, workdir = executed["notebook"], executed["venv"], executed["workdir"]
  code = [cell for cell in notebook.cells if cell.cell_type == "code"]
  assert all(cell.execution_count for cell in code)
  # The install cell installed the checkout into the kernel's environment; the JAX cell found no accelerator.
  assert f"Installing bert_jax from {ROOT}" in _text(_cell(notebook, "import subprocess"))
  assert list(venv.glob("lib/python*/site-packages/__editable__*bert_jax*"))
  assert "Accelerator: none (CPU); JAX build: cpu." in _text(_cell(notebook, "# The JAX build"))
  assert "backend 'cpu', 1 devices" in _text(_cell(notebook, "import jax"))
  # The training cell shows the console: header, progress lines, summary; no library noise.
  training = _text(_cell(notebook, "from bert_jax import console\n"))
  assert " Pretraining\n" in training and " Training finished at step 550\n" in training, training[-3000:]
  assert re.search(r" step 550/550 \| loss [\d.]+ \| mlm_loss [\d.]+ \(unigram ", training)
  assert not any(map(console.native_noise, training.splitlines())), training
  assert "Sharding callback duration" not in training and "Unable to initialize backend" not in training
  # What the demo learned, on held-out documents: clearly more than word frequencies.
  comparison = _text(_cell(notebook, "import json"))
  found = {
    name: (float(model), float(unigram))
    for name, model, unigram in re.findall(r"(mlm_\w+) +model ([\d.]+) \| unigram ([\d.]+)", comparison)
  }
  assert found["mlm_accuracy"][0] >= 0.15 and found["mlm_accuracy"][0] > 1.5 * found["mlm_accuracy"][1], comparison
  assert found["mlm_loss"][0] < found["mlm_loss"][1] - 0.2, comparison
  assert "Held-out evaluation at step 550:" in comparison
  # The loss curves: read back, plotted inline and saved; TensorBoard started on the workdir.
  assert "logged steps: loss" in _text(_cell(notebook, "import numpy as np"))
  plot = _cell(notebook, "import matplotlib.pyplot as plt")
  assert any("image/png" in output.get("data", {}) for output in plot.outputs)
  assert (workdir / "train_curves.png").read_bytes().startswith(b"\x89PNG")
  tensorboard = _cell(notebook, "%load_ext tensorboard")
  assert any(output.output_type == "display_data" for output in tensorboard.outputs), tensorboard.outputs
