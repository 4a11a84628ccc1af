#!/usr/bin/env bash
# Follows the newest job's log on one worker (tail -F); Ctrl-C stops following, not the job. Settings: launch/env.sh.
#   launch/logs.sh          # worker LOG_WORKER (0: process 0 prints the progress lines)
#   launch/logs.sh 3        # worker 3
set -euo pipefail
# shellcheck source=env.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

tpu_ssh "${1:-$LOG_WORKER}" "$(worker_command logs)"
