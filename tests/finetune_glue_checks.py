"""The checks of tests/test_benchmark_objectives.py for bert_jax/benchmarks/finetune_glue.py, run there each in a
fresh interpreter (its absl flags --glue_dir, --vocab ... are defined by other benchmark modules too)."""

import pathlib
from unittest import mock

import pytest
from absl.testing import flagsaver

from bert_jax.benchmarks import finetune_glue


def a_fine_tuning_stopped_before_its_last_step_writes_no_metrics(workdir: str):
  """job.finetune returns None when a SIGTERM stopped it: no metrics.json, which later runs would read back as final."""
  with flagsaver.as_parsed(workdir=workdir, glue_dir="/glue", vocab="vocab.txt", init_from="/pretrained"):
    with mock.patch.object(finetune_glue, "_config", return_value=None):
      with mock.patch.object(finetune_glue.job, "finetune", return_value=None) as finetune:
        with pytest.raises(SystemExit, match="sst2/pretrained/bert_jax:transformers stopped before its last step"):
          finetune_glue._run("sst2", "pretrained", "bert_jax:transformers")
  assert finetune.call_count == 1
  assert not list(pathlib.Path(workdir).rglob("metrics.json"))
