"""The shipped BERT-Large configs fit the Cloud TPU slice their docstrings name, compiled for it by XLA's TPU compiler
(libtpu; no TPU)."""

import pytest

from bert_jax.dry_run import ahead_of_time
from configs import large, large_phase2
from tests.test_tpu_compile import requires_libtpu

pytestmark = pytest.mark.slow  # TPU compiles (libtpu): BERT-Large's steps for a v5p-128, about a minute each.


@requires_libtpu
@pytest.mark.parametrize("module", [large, large_phase2])
def test_the_shipped_bert_large_configs_fit_the_slice_they_were_planned_for(module):
  config = module.get_config()
  assert config.dry_run.topology in module.__doc__ and str(config.batch_size) in module.__doc__
  report = ahead_of_time.compile_job(config, eval_step=False, all_flops=False)
  assert report["steps"]["train step"]["fits"], report["steps"]["train step"]
