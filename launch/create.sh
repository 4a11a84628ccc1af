#!/usr/bin/env bash
# Creates the TPU VM slice TPU_NAME (ACCELERATOR_TYPE in ZONE) and waits until it is ready. Settings: launch/env.sh.
#   launch/create.sh                                   # on-demand v4-32 in us-central2-b (the defaults)
#   SPOT=1 launch/create.sh                            # Spot VMs: cheaper, preemptible at any time
#   QUEUED=1 SPOT=1 launch/create.sh                   # through a queued resource: waits for capacity (recommended)
#   ACCELERATOR_TYPE=v5litepod-16 ZONE=us-west4-a launch/create.sh
# Running it again is safe: an existing slice is reported (a queued one waited for), not created twice.
set -euo pipefail
# shellcheck source=env.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

create_flags=(--accelerator-type="$ACCELERATOR_TYPE")
if [[ $SPOT == 1 ]]; then
  create_flags+=(--spot)
fi
if [[ -n $CREATE_FLAGS ]]; then
  read -r -a extra <<<"$CREATE_FLAGS"
  create_flags+=(${extra[@]+"${extra[@]}"})
fi

if [[ $QUEUED == 1 ]]; then
  state="$(queued_state)"
  if [[ -z $state ]]; then
    log "requesting queued resource $TPU_NAME: $ACCELERATOR_TYPE, $RUNTIME_VERSION, zone $ZONE, spot=$SPOT"
    gcloud compute tpus queued-resources create "$TPU_NAME" --node-id="$TPU_NAME" "${TPU_FLAGS[@]}" \
      --runtime-version="$RUNTIME_VERSION" "${create_flags[@]}"
  fi
  # Waiting can take long; Ctrl-C and run this script again later to go on waiting.
  while true; do
    state="$(queued_state)"
    case $state in
      ACTIVE) break ;;
      FAILED | SUSPENDING | SUSPENDED)
        die "queued resource $TPU_NAME is $state (see: gcloud compute tpus queued-resources describe $TPU_NAME" \
          "--zone=$ZONE); delete it (launch/delete.sh) and create it again"
        ;;
      *) log "queued resource $TPU_NAME: ${state:-not visible yet}; checking again in ${POLL_SECONDS}s" ;;
    esac
    sleep "$POLL_SECONDS"
  done
else
  state="$(node_state)"
  if [[ -z $state ]]; then
    log "creating TPU VM $TPU_NAME: $ACCELERATOR_TYPE, $RUNTIME_VERSION, zone $ZONE, spot=$SPOT"
    gcloud compute tpus tpu-vm create "$TPU_NAME" "${TPU_FLAGS[@]}" --version="$RUNTIME_VERSION" "${create_flags[@]}"
  fi
fi

state="$(node_state)"
case $state in
  READY) log "$TPU_NAME is READY. Next: launch/setup.sh" ;;
  PREEMPTED | TERMINATED) die "$TPU_NAME is $state: delete it (launch/delete.sh) and create it again" ;;
  *) log "$TPU_NAME is ${state:-not visible yet}; check again with launch/status.sh" ;;
esac
