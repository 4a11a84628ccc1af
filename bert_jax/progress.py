"""What a running job shows: console progress lines and TensorBoard scalars in the workdir.

Only process 0 writes; other processes create no files.
"""

import tempfile
import time
from collections.abc import Callable

import jax
from absl import logging
from etils import epath

from bert_jax import paths


class MetricWriter:
  """TensorBoard event files under `<workdir>/tensorboard/<name>` (process 0 only).

  A remote workdir (gs://) gets its event files through epath: they are written to a local directory and copied
  at most every `copy_every_seconds` and on close, so TensorBoard pointed at the workdir follows the run. A copy
  that fails is logged and retried at the next one: TensorBoard files never stop training.
  """

  def __init__(self, workdir: str, name: str, copy_every_seconds: float = 60.0):
    self._writer, self._local = None, None
    if jax.process_index() == 0:
      # Deferred: importing TensorFlow costs seconds; only a running job needs it.
      from bert_jax.tensorflow_cpu import tf

      self._tf = tf
      self._target = f"{workdir}/tensorboard/{name}"
      if not paths.is_local(self._target):
        self._local = tempfile.TemporaryDirectory()
        self._copy_every, self._last_copy = copy_every_seconds, time.monotonic()
      directory = self._local.name if self._local else self._target
      with paths.writing(directory):  # Made here, so that a full disk is named in one line, not in TensorFlow's log.
        epath.Path(directory).mkdir(parents=True, exist_ok=True)
      try:
        self._writer = tf.summary.create_file_writer(directory)
      except tf.errors.OpError as error:  # The event file: "<path>; <cause>\n\t<what it did> [Op:...]".
        path, _, cause = error.message.splitlines()[0].split(" [Op:")[0].rpartition("; ")
        raise paths.WriteError(f"Cannot write {path or directory}: {cause}.") from error

  def _copy(self) -> None:
    try:
      paths.copy_tree(self._local.name, self._target)
    except Exception as error:  # noqa: BLE001 - any storage error: the next copy tries again.
      logging.warning("Could not copy TensorBoard files to %s (will retry): %s", self._target, error)
    self._last_copy = time.monotonic()

  def write(self, step: int, scalars: dict) -> None:
    if self._writer is None:
      return
    with self._writer.as_default():
      for name, value in scalars.items():
        self._tf.summary.scalar(name, value, step=step)
    self._writer.flush()
    if self._local and time.monotonic() - self._last_copy >= self._copy_every:
      self._copy()

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()
      if self._local:
        self._copy()
        self._local.cleanup()


def summarize(metric_sums: dict, num_steps: int) -> dict:
  """Sums from the steps (see train/step.py) -> means for people: every `<prefix>_<name>` sum divided by its
  `<prefix>_count`; `loss` and `grad_norm` (already batch means) averaged over the steps that were applied;
  `skipped_steps` and `nonfinite_steps`, the steps the guard skipped (see `train_step.train_step`)."""
  summary = {}
  for name, value in metric_sums.items():
    prefix = name.split("_")[0]
    if f"{prefix}_count" in metric_sums and not name.endswith("_count"):
      summary[name] = value / max(metric_sums[f"{prefix}_count"], 1e-5)
  skipped = metric_sums.get("skipped_count", 0)
  if "skipped_count" in metric_sums:
    summary.update(skipped_steps=skipped, nonfinite_steps=metric_sums["nonfinite_count"])
  for per_step in ("loss", "grad_norm"):
    if per_step in metric_sums:
      summary[per_step] = metric_sums[per_step] / max(num_steps - skipped, 1)
  return {name: float(value) for name, value in summary.items()}


def model_row(model, num_params: int) -> str:
  """A run header's model row (`model`: a BertConfig; its family's name, e.g. "ModernBERT L22 H768 A12")."""
  return (
    f"{model.title} (feed-forward {model.intermediate_size}), "
    f"vocabulary {model.vocab_size:,}, {model.dtype}: {num_params:,} parameters"
  )


def devices_row(mesh) -> str:
  """A run header's devices row: how many of which kind, in how many processes, and the mesh over them."""
  device = jax.devices()[0]
  kind = device.platform if device.device_kind == device.platform else f"{device.device_kind} ({device.platform})"
  axes = " x ".join(f"{name} {size}" for name, size in mesh.shape.items())
  return f"{jax.device_count()} x {kind} in {jax.process_count()} process(es); mesh {axes}"


def format_metrics(summary: dict, shown: tuple[str, ...], baseline: dict | None = None) -> str:
  """` | name value` for each of `shown` in `summary` (accuracy shortened to acc), with `baseline`'s value beside
  it in brackets where it has one (the unigram model's, see `shards.unigram_baseline`)."""
  baseline = baseline or {}
  return "".join(
    f" | {name.replace('accuracy', 'acc')} {summary[name]:.4f}"
    + (f" (unigram {baseline[name]:.4f})" if name in baseline else "")
    for name in shown
    if name in summary
  )


def duration(seconds: float) -> str:
  seconds = int(seconds)
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def lines_row(job: str, lines: int, total_lines: int, tokens: int, seconds: float, unit: str = "lines") -> str:
  """A progress line of a job over text lines (or other `unit`s: texts): "features: 320/1,000 lines | 5,120
  tokens/s | ETA 0:00:12"."""
  rate = lines / max(seconds, 1e-9)
  eta = (total_lines - lines) / rate if rate else 0
  return f"{job}: {lines:,}/{total_lines:,} {unit} | {tokens / max(seconds, 1e-9):,.0f} tokens/s | ETA {duration(eta)}"


class Progress:
  """Console lines: step, loss, the metrics named in `shown` (beside each, in brackets, its value in `baseline`:
  the unigram model's, see `shards.unigram_baseline`), the rows' fill (and instances per row when `packed`), the
  batch while a summary has one (`batch_size`: a batch-size warmup's), tokens/s, model FLOPs utilisation and ETA,
  measured since the previous line. Tokens/s and MFU count real tokens only: a step's tokens and model FLOPs are
  scaled by the fill of its rows (`row_fill` in the summary), so padding earns nothing. MFU needs the model FLOPs of a
  step of `tokens_per_step` and the peak FLOP/s of all devices (see flops.py). `tokens_through(step)`: the token
  positions of steps 1 to `step` when steps differ (a batch-size warmup's), else `step x tokens_per_step`; the ETA is
  the tokens left at the measured rate."""

  def __init__(
    self,
    total_steps: int,
    tokens_per_step: int,
    first_step: int,
    flops_per_step: float | None = None,
    peak_flops: float | None = None,
    shown: tuple[str, ...] = ("mlm_loss", "mlm_accuracy", "nsp_accuracy"),
    packed: bool = False,
    baseline: dict | None = None,
    tokens_through: Callable[[int], int] | None = None,
  ):
    self._shown, self._packed, self._baseline = shown, packed, baseline or {}
    self._total, self._tokens_per_step = total_steps, tokens_per_step
    self._tokens_through = tokens_through or (lambda step: step * tokens_per_step)
    self._flops_per_step, self._peak_flops = flops_per_step, peak_flops
    self._last_step, self._last_time = first_step, time.perf_counter()
    # What the lines measured, for the run's summary: steps timed, their seconds and real tokens.
    self.timed_steps, self.timed_seconds, self.real_tokens = 0, 0.0, 0.0
    self.first_step_seconds: float | None = None  # The first (compiling) step's, when the loop measured it.

  def exclude(self, seconds: float) -> None:
    """Leaves time spent outside training steps (evaluation, checkpoints) out of the speed."""
    self._last_time += seconds

  def report(self, step: int, summary: dict) -> dict:
    """Logs one line for `step`; returns the speed figures it measured (none on the line of the first step, which
    compiles: its time is no measure of speed, and the line says how long it took instead)."""
    now = time.perf_counter()
    steps = step - self._last_step
    fill = summary.get("row_fill", 1.0)
    speed, rate = {}, "compiling step"
    if self.first_step_seconds is not None:
      rate += f" {self.first_step_seconds:.1f} s"
    eta = "-"
    if steps > 0:  # Not the line of the first (compiling, untimed) step.
      seconds = now - self._last_time
      tokens = self._tokens_through(step) - self._tokens_through(self._last_step)
      self.timed_steps += steps
      self.timed_seconds += seconds
      self.real_tokens += fill * tokens
      speed = {"tokens_per_sec": fill * tokens / seconds, "seconds_per_step": seconds / steps}
      rate = f"{speed['tokens_per_sec']:,.0f} tok/s"
      if self._flops_per_step and self._peak_flops:  # The model FLOPs of these steps' tokens.
        speed["mfu"] = fill * self._flops_per_step * tokens / self._tokens_per_step / seconds / self._peak_flops
        rate += f" | MFU {100 * speed['mfu']:.1f}%"
      eta = duration(seconds / tokens * (self._tokens_through(self._total) - self._tokens_through(step)))
    self._last_step, self._last_time = step, now
    metrics = format_metrics(summary, self._shown, self._baseline)
    if summary.get("skipped_steps"):
      metrics += f" | skipped {summary['skipped_steps']:.0f}"
    if "row_fill" in summary:
      metrics += f" | fill {fill:.3f}"
    if "batch_size" in summary:
      metrics += f" | batch {summary['batch_size']:,}"
    if self._packed:
      metrics += f" | {summary.get('row_instances', float('nan')):.2f} inst/row"
    shares = [f"{key[6:]} {value:.1%}" for key, value in summary.items() if key.startswith("share/")]
    if shares:  # A mixture's sources: each one's share of the tokens read (train/source_tokens.py).
      metrics += f" | {' '.join(shares)}"
    logging.info(
      "step %d/%d | loss %.4f%s | %s | ETA %s", step, self._total, summary.get("loss", float("nan")), metrics, rate, eta
    )
    return speed


def launch_row(ticker: Progress | None, first_step: int, step: int, seconds: float) -> str:
  """A run summary's steps row: this launch's steps, the tokens of its timed steps (real ones only, where the
  summaries carry the rows' fill) and their speed, and the launch's time in all."""
  speed = ""
  if ticker and ticker.timed_seconds:
    speed = (
      f", {ticker.real_tokens:,.0f} tokens in {ticker.timed_steps} timed steps: "
      f"{ticker.real_tokens / ticker.timed_seconds:,.0f} tokens/s"
    )
  return f"{step - first_step} this launch (from step {first_step}){speed}; {duration(seconds)} in all"


class ProfileWindow:
  """A `jax.profiler` trace of steps [start_step, start_step + num_steps) into `<workdir>/tensorboard` (process 0
  only), where TensorBoard's profile plugin finds it (`plugins/profile/<time>/`). `start_step` 0: no trace. A run
  that resumes past `start_step` traces nothing. A remote workdir (gs://) gets the trace through a local directory,
  copied when the trace ends."""

  def __init__(self, workdir: str, start_step: int, num_steps: int):
    self._start, self._end = start_step, start_step + num_steps - 1
    self._enabled = start_step > 0 and jax.process_index() == 0
    self._target = f"{workdir}/tensorboard"
    self._local, self._tracing = None, False

  def before(self, step: int) -> None:
    """Before running `step`: starts the trace at `start_step`."""
    if not self._enabled or step != self._start:
      return
    if not paths.is_local(self._target):
      self._local = tempfile.TemporaryDirectory()
    jax.profiler.start_trace(self._local.name if self._local else self._target)
    self._tracing = True

  def after(self, step: int, outputs) -> float:
    """After dispatching `step` (its `outputs`): ends the trace after the last step of the window, once the step has
    run. Returns the seconds that took (to leave out of the speed)."""
    if not self._tracing or step < self._end:
      return 0.0
    start = time.perf_counter()
    jax.block_until_ready(outputs)
    self.close()
    logging.info("Profile of steps %d-%d written to %s (TensorBoard's Profile tab).", self._start, step, self._target)
    return time.perf_counter() - start

  def close(self) -> None:
    """Ends a trace still running (a run stopped inside the window)."""
    if not self._tracing:
      return
    jax.profiler.stop_trace()
    self._tracing = False
    if self._local:
      paths.copy_tree(self._local.name, self._target)
      self._local.cleanup()
