#!/usr/bin/env bash
# Shows the slice's state and, on every worker, whether the job runs and its log's last lines. Settings: launch/env.sh.
#   launch/status.sh
set -euo pipefail
# shellcheck source=env.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

queued="$(queued_state)"
node="$(node_state)"
log "$TPU_NAME: ${node:-no TPU VM}${queued:+ (queued resource: $queued)}"
if [[ $node == READY ]]; then
  tpu_ssh "$WORKERS" "$(worker_command status)"
fi
