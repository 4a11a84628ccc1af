"""The equal-compute benchmark's contestants (bert_jax/benchmarks/objectives.py): each a valid config at every size
it offers, changing only what its recipe changes; its table paired by seed; a contestant stopped by SIGTERM (in its
pretraining or in finetune_glue) recorded nowhere as finished. Each check (tests/objectives_checks.py,
tests/finetune_glue_checks.py) runs in a fresh interpreter: the benchmark defines absl flags that other benchmark
modules, imported by other tests in the same process, define too."""

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# A fresh interpreter per check, 5 to 9 CPU-seconds each; bert_jax/benchmarks/ is measuring code, which the fast tier
# leaves out (docs/testing.md, "Two tiers").
pytestmark = pytest.mark.slow


def _check(call: str, checks: str = "objectives_checks") -> None:
  code = f"from tests import {checks} as checks; checks.{call}"
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.parametrize("size", ["tiny", "mini"])
def test_every_contestant_is_a_valid_config_at_every_size_with_the_encoder_that_size_names(size):
  _check(f"every_contestant_is_a_valid_config_at_every_size_with_the_encoder_that_size_names({size!r})")


def test_random_weights_are_fine_tuned_once_per_architecture_and_only_when_asked():
  _check("random_weights_are_fine_tuned_once_per_architecture_and_only_when_asked()")


def test_the_paired_table_sets_each_contestant_against_bert_and_its_architectures_random_weights():
  _check("the_paired_table_sets_each_contestant_against_bert_and_its_architectures_random_weights()")


def test_a_contestant_stopped_before_its_last_step_writes_no_result(tmp_path):
  _check(f"a_contestant_stopped_before_its_last_step_writes_no_result({str(tmp_path)!r})")


def test_a_fine_tuning_stopped_before_its_last_step_writes_no_metrics(tmp_path):
  _check(f"a_fine_tuning_stopped_before_its_last_step_writes_no_metrics({str(tmp_path)!r})", "finetune_glue_checks")


def test_random_weights_are_those_of_the_model_the_pretrained_run_fine_tunes(tmp_path):
  _check(
    f"random_weights_are_those_of_the_model_the_pretrained_run_fine_tunes({str(tmp_path)!r})", "finetune_glue_checks"
  )


def test_the_modernbert_recipe_is_the_references_per_task_and_flags_override_it_only_where_given(tmp_path):
  _check(
    f"the_modernbert_recipe_is_the_references_per_task_and_flags_override_it_only_where_given({str(tmp_path)!r})",
    "finetune_glue_checks",
  )
