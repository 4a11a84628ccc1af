"""The shipped TPU configs (BERT-Large's two phases, ModernBERT's phase 1 and context extension at both sizes) fit
the Cloud TPU slice their docstrings name, compiled for it by XLA's TPU compiler (libtpu; no TPU), and the peak a
docstring gives is the one XLA computes."""

import re

import pytest

from bert_jax.dry_run import ahead_of_time
from configs import (
  ettin_base,
  large,
  large_phase2,
  modernbert_base,
  modernbert_context_extension,
  modernbert_large,
  modernbert_large_context_extension,
)
from tests.test_tpu_compile import requires_libtpu

pytestmark = pytest.mark.slow  # TPU compiles (libtpu): 1 to 3 minutes a config on this project's 2-core machine.

GIB = 2**30

SHIPPED = [
  ettin_base,
  large,
  large_phase2,
  modernbert_base,
  modernbert_large,
  modernbert_context_extension,
  modernbert_large_context_extension,
]


@requires_libtpu
@pytest.mark.parametrize("module", SHIPPED, ids=lambda module: module.__name__)
def test_the_shipped_tpu_configs_fit_the_slice_they_were_planned_for_at_the_peak_they_document(module):
  config = module.get_config()
  doc = module.__doc__
  assert config.dry_run.topology in doc and f"{config.batch_size:,}".replace(",", "") in doc.replace(",", "")
  report = ahead_of_time.compile_job(config, eval_step=False, all_flops=False)
  train = report["steps"]["train step"]
  assert train["fits"], train
  documented = re.findall(r"peak (\d+\.\d+)\s+GiB of", doc)  # The train step's, on the named slice, comes first.
  if documented:
    assert abs(train["peak_bytes"] / GIB - float(documented[0])) < 0.01, (documented[0], train["peak_bytes"] / GIB)
