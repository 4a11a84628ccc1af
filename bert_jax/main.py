"""Entry point, run on every host: `python -m bert_jax.main --config=configs/tiny.py --workdir=DIR`.

`--mode=prepare` prepares a corpus (once, on one machine); the default mode pretrains.

The only module that defines flags. `--config.key=value` overrides any key of the config file; an unknown key
is an error.
"""

import logging as std_logging
import sys

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from bert_jax import train
from bert_jax.data import prepare

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints and TensorBoard logs go (a path or gs://).")
_MODE = flags.DEFINE_enum(
  "mode",
  "pretrain",
  ["pretrain", "prepare"],
  "pretrain: train (resuming from the workdir). prepare: train the SentencePiece vocabulary if tokenizer.path is "
  "missing, then tokenize data.input_pattern / data.tfds_name into data.prepared_dir.",
)
flags.mark_flags_as_required(["config", "workdir"])


def _parse_flags(argv: list[str]) -> list[str]:
  try:
    return flags.FLAGS(argv)
  except (AttributeError, KeyError) as error:  # How ml_collections reports an unknown `--config.key`.
    overrides = [arg.split("=")[0] for arg in argv[1:] if arg.startswith("--config.")]
    sys.exit(
      f"Unknown config key {error} in the overrides {overrides}. Every key is defined, with a comment, "
      "in configs/default.py."
    )
  except flags.Error as error:
    sys.exit(f"{error}\nUsage: python -m bert_jax.main --config=configs/tiny.py --workdir=DIR [--config.key=value ...]")


def _quiet_library_info(record) -> bool:
  # Orbax logs several INFO lines per checkpoint; keep its warnings, and keep our own progress readable.
  return record.levelno > std_logging.INFO or "/orbax/" not in record.pathname


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  logging.get_absl_logger().addFilter(_quiet_library_info)
  logging.info(
    "JAX %s, process %d of %d, %d local / %d global devices (%s).",
    jax.__version__,
    jax.process_index(),
    jax.process_count(),
    jax.local_device_count(),
    jax.device_count(),
    jax.devices()[0].platform,
  )
  if _MODE.value == "prepare":
    prepare.prepare_for_run(_CONFIG.value, _WORKDIR.value)
  else:
    train.train_and_evaluate(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
