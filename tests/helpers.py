"""Small helpers several test files share, for looking into what a run wrote."""

from collections.abc import Mapping

from bert_jax.model.param_layout import SCANNED_KEY
from bert_jax.workdir import checkpoints, reading


def restore_config(workdir: str, step: int | None = None) -> dict:
  """The config a checkpoint was written with (newest step by default), as a plain dict."""
  with checkpoints.read_only_manager(workdir) as manager:
    step = manager.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"No checkpoint under {checkpoints.checkpoint_dir(workdir)}.")
    return reading.read_config(manager, step)


def is_scanned(params: Mapping) -> bool:
  """Whether `params` (a BertForPretraining or BertModel parameter tree) is in the scanned layout."""
  encoder = params.get("bert", params)
  return SCANNED_KEY in encoder


def write_checkpoint(workdir, config, history: dict, value: float = 1.0, step: int = 1, data_position=None) -> None:
  """A one-step checkpoint of a 4-parameter model (`value` each) in `workdir`, recording `config` and `history`: what
  the start checks read (config, data position, history, checksums), without training anything. The config is
  recorded as the jobs record theirs, its unset prediction-head fields resolved (without a source: the defaults)."""
  import dataclasses

  import jax.numpy as jnp
  import ml_collections

  from bert_jax.model.bert_config import PREDICTION_HEAD_FIELDS, model_config
  from bert_jax.train import step as step_lib

  model = dataclasses.asdict(model_config(config))
  recorded = ml_collections.ConfigDict(config.to_dict())
  recorded.model.update({name: model[name] for name in PREDICTION_HEAD_FIELDS})
  state = step_lib.TrainState(jnp.int32(step), {"w": jnp.full(4, value)}, {}, step_lib.initial_guard())
  manager = checkpoints.make_manager(str(workdir), 1)
  checkpoints.save(manager, step, state, data_position or {"examples": 0, "step": step}, recorded, None, history)
  checkpoints.finish(manager, step)
