"""A job described once, from its config (and, for fine-tuning, its task's metadata) alone: no data read, nothing
allocated but the mesh. Each job's `job_spec` makes one (`train/pretraining.py`, `finetune/plan.py`); its entry
function, its `loop.Job` and the dry run (`dry_run/ahead_of_time.py`) all take it, so the model, the compiled
run, the batch shapes, the FLOPs and the header's lines cannot drift apart between training and planning."""

import dataclasses
from collections.abc import Callable

import jax

from bert_jax import flops, progress
from bert_jax.model.bert_config import BertConfig
from bert_jax.train.run import Run


@dataclasses.dataclass(frozen=True)
class JobSpec:
  """What a job computes per step; see the module docstring."""

  name: str  # The job, as the dry run's report names it.
  model_cfg: BertConfig
  run: Run  # Frozen inputs described, not read.
  train_batch: dict  # Feature -> (global shape, dtype) of a train step's batch; a leading member axis with members.
  eval_batch: dict  # Of an evaluation step's batch (no member axis: every member scores the same rows).
  eval_step: Callable  # Jitted (params, eval batch, *frozen args if `eval_reads_frozen`) -> outputs.
  eval_reads_frozen: bool
  tokens_per_step: int  # Token positions a train step reads (padding included; every member's with members).
  train_flops: float  # Model FLOPs of one train step (forward and backward).
  eval_flops: float  # Model FLOPs of one evaluation step (forward).
  batch_row: str  # What a train step reads, as the header's and the report's batch line start.

  def ticker(self, config, last_step: int, first_step: int, **shown) -> progress.Progress:
    """The progress lines of a run of this job to `last_step`, from `first_step`: tokens/s, and MFU against the
    peak of every device (`config.peak_tflops_per_device`, else the device kind's); `shown`: what the lines show
    (`progress.Progress`'s keywords)."""
    peak = flops.peak_flops_per_device(jax.devices()[0].device_kind, config.peak_tflops_per_device)
    peak_flops = peak * jax.device_count() if peak else None
    return progress.Progress(last_step, self.tokens_per_step, first_step, self.train_flops, peak_flops, **shown)

  def header_rows(self) -> list[tuple[str, str]]:
    """The model and devices rows of the run's header."""
    return [
      ("model", progress.model_row(self.model_cfg, self.run.num_params)),
      ("devices", progress.devices_row(self.run.mesh)),
    ]
