"""Every shipped config passes the checks, and the two BERT-Large phases fit together."""

import importlib
import pathlib

import pytest

from bert_jax import pretraining
from bert_jax.optim import make_schedule
from configs import large, large_phase2

NAMES = sorted(p.stem for p in (pathlib.Path(__file__).parents[1] / "configs").glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("name", NAMES)
def test_every_config_passes_the_checks(name):
  config = importlib.import_module(f"configs.{name}").get_config()
  pretraining.check_config(config)


def test_phase_two_continues_phase_one_on_the_same_schedule():
  phase_1, phase_2 = large.get_config(), large_phase2.get_config()
  assert phase_1.model == phase_2.model and phase_1.optimizer == phase_2.optimizer  # Checkpoints load as they are.
  assert phase_1.schedule_end_step == phase_2.schedule_end_step == phase_2.num_train_steps == 1_000_000
  assert phase_1.num_train_steps == 900_000  # The paper: 90% of steps at 128, the rest at 512.
  assert (phase_1.data.max_seq_length, phase_2.data.max_seq_length) == (128, 512)
  assert phase_2.data.max_predictions_per_seq == 80 and phase_2.init_from
  schedule_1, schedule_2 = make_schedule(phase_1), make_schedule(phase_2)
  for step in (10_000, 899_999, 900_000):
    assert float(schedule_1(step)) == float(schedule_2(step))
  assert float(schedule_2(900_000)) == pytest.approx(1e-5, rel=1e-3)  # A tenth of the peak left for phase 2.
