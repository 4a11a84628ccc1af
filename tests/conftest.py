"""Every test runs on CPU with 8 fake devices; tests that want one device take `jax.devices()[:1]`."""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402

from bert_jax.model_config import BertConfig  # noqa: E402
from configs import default, tiny  # noqa: E402


@pytest.fixture
def small_model_config() -> BertConfig:
  """A BERT small enough to compile in a second, with every feature of the real one."""
  return BertConfig(
    vocab_size=101, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=48, max_position_embeddings=40
  )


@pytest.fixture
def small_config():
  """configs/tiny.py shrunk further: a whole training run takes seconds."""
  config = tiny.get_config()
  config.data.source = "synthetic"  # The loop's own tests; the pipeline has its own, and test_main runs both.
  config.model.update(
    vocab_size=101, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=48, max_position_embeddings=40
  )
  config.data.max_seq_length = 32
  config.data.max_predictions_per_seq = 5
  config.batch_size = 8
  config.num_train_steps = 6
  config.warmup_steps = 2
  config.log_every_steps = 2
  config.eval_every_steps = 3
  config.eval_steps = 1
  config.checkpoint_every_steps = 3
  return config


@pytest.fixture(scope="session", autouse=True)
def compilation_cache(tmp_path_factory):
  """Runs in one session compile the same programs; XLA's persistent cache makes the repeats cheap."""
  import jax

  jax.config.update("jax_compilation_cache_dir", str(tmp_path_factory.mktemp("xla_cache")))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


@pytest.fixture(scope="session")
def data_config():
  """Makes `config.data` of configs/default.py with some keys changed (what corpus preparation reads)."""

  def make(**overrides):
    data = default.get_config().data
    data.update(overrides)
    return data

  return make
