#!/usr/bin/env bash
# Runs one shell command line on the workers (WORKERS, default all), or opens a shell on one. Settings: launch/env.sh.
#   launch/ssh.sh 'bert_jax_venv/bin/python -c "import jax; print(jax.device_count())"'   # while no job runs
#   launch/ssh.sh 'df -h ~ && free -g'
#   WORKERS=1 launch/ssh.sh             # an interactive shell on worker 1 (with no command: worker 0 for "all")
set -euo pipefail
# shellcheck source=env.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

if (($# == 0)); then
  worker="$WORKERS"
  if [[ $worker == all ]]; then
    worker=0
  fi
  exec gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${TPU_FLAGS[@]}" --worker="$worker" \
    ${SSH_FLAG_LIST[@]+"${SSH_FLAG_LIST[@]}"}
fi
tpu_ssh "$WORKERS" "$*"
