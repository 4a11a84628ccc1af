#!/usr/bin/env bash
# Deletes the slice TPU_NAME, and its queued resource if it has one (with --force, which deletes its TPU VMs too).
# Billing of the slice stops; the workdir on GCS stays. Stop the job first (launch/stop.sh) so that it saves a
# checkpoint. Settings: launch/env.sh.
#   launch/delete.sh
set -euo pipefail
# shellcheck source=env.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

if [[ -n "$(queued_state)" ]]; then
  log "deleting queued resource $TPU_NAME and its TPU VMs"
  gcloud compute tpus queued-resources delete "$TPU_NAME" "${TPU_FLAGS[@]}" --force --quiet
elif [[ -n "$(node_state)" ]]; then
  log "deleting TPU VM $TPU_NAME"
  gcloud compute tpus tpu-vm delete "$TPU_NAME" "${TPU_FLAGS[@]}" --quiet
else
  log "no TPU VM or queued resource named $TPU_NAME in zone $ZONE"
fi
