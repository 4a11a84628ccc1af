"""What a checkpoint's checksums cost: hashing a whole train state (parameters and optimizer state), as every save
and every restore does (bert_jax/workdir/checksums.py).

    python -m bert_jax.benchmarks.checksum_speed --preset=base

Reports the first call (compile included) and the best of the following ones, on the first local device.
"""

import time

import jax
from absl import app, flags

from bert_jax.model.bert_config import preset
from bert_jax.train import pretraining
from bert_jax.workdir import checksums
from configs import default

_PRESET = flags.DEFINE_string("preset", "base", "Model size preset (bert_jax.model.bert_config.PRESETS).")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Timed calls after the first.")


def main(argv):
  del argv
  config = default.get_config()
  config.model.update(preset(_PRESET.value))
  config.data.source = "synthetic"
  config.mesh.update(data=1, fsdp=1, tensor=1)
  run = pretraining.make_run(config, jax.devices()[:1])
  state = jax.block_until_ready(run.init_state(config.seed))
  optimizer = {"step": state.step, "opt_state": state.opt_state, "guard": state.guard}
  num_params = sum(leaf.size for leaf in jax.tree.leaves(state.params))
  num_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves((state.params, optimizer)))
  times = []
  for _ in range(1 + _ROUNDS.value):
    start = time.perf_counter()
    checksums.arrays(state.params, "params")
    checksums.arrays(optimizer, "optimizer")
    times.append(time.perf_counter() - start)
  print(
    f"{jax.devices()[0].platform} x1; {_PRESET.value}: {num_params / 1e6:.1f} M parameters, train state "
    f"{num_bytes / 1e9:.2f} GB; checksums: first call {times[0]:.2f} s (compile included), then {min(times[1:]):.2f} s"
  )


if __name__ == "__main__":
  app.run(main)
