"""The shipped TPU configs (BERT-Large's two phases, ModernBERT's phase 1 and context extension at both sizes,
mmBERT's schedule) fit the Cloud TPU slice their docstrings name, compiled for it by XLA's TPU compiler (libtpu; no
TPU), and the peak a docstring gives is the one XLA computes. Ettin's config is ModernBERT-base's step on other data,
so it is held equal to it rather than compiled twice."""

import re

import pytest

from bert_jax.dry_run import ahead_of_time
from configs import (
  ettin_base,
  large,
  large_phase2,
  mmbert_base,
  modernbert_base,
  modernbert_context_extension,
  modernbert_large,
  modernbert_large_context_extension,
)
from tests.test_tpu_compile import requires_libtpu

pytestmark = pytest.mark.slow  # TPU compiles (libtpu): 1 to 3 minutes a config on this project's 2-core machine.

GIB = 2**30

SHIPPED = [
  large,
  large_phase2,
  mmbert_base,
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


def test_ettin_compiles_the_program_of_modernbert_base_and_documents_its_peak():
  """A mixture changes which documents fill the rows, not the step: every key the compiled step's shapes and memory
  depend on is ModernBERT-base's (only the learning rate's schedule differs), so its compile (in SHIPPED) stands for
  Ettin's, and Ettin's docstring gives the same peak."""
  ettin, base = ettin_base.get_config(), modernbert_base.get_config()
  assert ettin.model.to_dict() == base.model.to_dict()
  assert ettin.mesh.to_dict() == base.mesh.to_dict() and ettin.dry_run.topology == base.dry_run.topology
  for key in ("batch_size", "num_microbatches", "optimizer"):
    assert ettin[key] == base[key], key
  for key in ("max_seq_length", "max_predictions_per_seq", "pack_instances", "instances", "masked_lm_prob"):
    assert ettin.data[key] == base.data[key], key
  peaks = [re.findall(r"peak (\d+\.\d+)\s+GiB of", module.__doc__)[0] for module in (ettin_base, modernbert_base)]
  assert peaks[0] == peaks[1], peaks
