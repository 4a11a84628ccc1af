#!/usr/bin/env bash
# Stops the job on every worker with SIGTERM, as a preemption does: each process finishes its step, the job writes a
# checkpoint at that step and exits; waits up to STOP_WAIT seconds. launch/run.sh with the same arguments resumes
# from that checkpoint. Settings: launch/env.sh.
#   launch/stop.sh
#   STOP_SIGNAL=KILL launch/stop.sh      # a job that does not exit (no checkpoint is written)
set -euo pipefail
# shellcheck source=env.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

tpu_ssh "$WORKERS" "$(worker_command stop)"
