# shellcheck shell=bash disable=SC2034  # Sourced: the variables are used by the scripts that source it.
# Shared settings of the launch/ scripts, sourced by each of them (and by worker.sh on the TPU workers).
# Not run by itself. Every default below is defined here only; override any of them from the environment:
#   TPU_NAME=bert-v5e ACCELERATOR_TYPE=v5litepod-16 ZONE=us-west4-a launch/create.sh
# Scripts are meant for bash 3.2+ (macOS included); the worker side assumes the TPU VM's Ubuntu.

# --- The slice -----------------------------------------------------------------------------------------------------
# Name of the TPU VM slice (and of its queued resource, with QUEUED=1).
: "${TPU_NAME:=bert-jax}"
# Zone of the slice; the GCS bucket should be in the same region.
: "${ZONE:=us-central2-b}"
# Google Cloud project; empty: gcloud's own (`gcloud config set project PROJECT`).
: "${PROJECT:=}"
# TPU generation and size, e.g. v4-32, v5litepod-16, v5p-32, v6e-16.
: "${ACCELERATOR_TYPE:=v4-32}"
# TPU software version; empty: the one Cloud TPU's docs name for JAX on ACCELERATOR_TYPE (below).
: "${RUNTIME_VERSION:=}"
# 1: Spot VMs (cheaper; preemptible at any time, and a preempted slice must be deleted and created again).
: "${SPOT:=0}"
# 1: ask through a queued resource (waits in Cloud TPU's queue for capacity) instead of `tpu-vm create`.
: "${QUEUED:=0}"
# More flags for `tpu-vm create` / `queued-resources create`, split on spaces, e.g. "--reserved".
: "${CREATE_FLAGS:=}"
# Seconds between state checks while create.sh waits for a queued resource.
: "${POLL_SECONDS:=30}"

# --- The code and the Python environment on the workers ------------------------------------------------------------
# Empty: setup.sh copies this checkout (tracked and untracked, not ignored, files). Otherwise each worker clones or
# fetches BRANCH of this git URL (it must be readable from the workers).
: "${REPO_URL:=}"
: "${BRANCH:=main}"
# Paths on the workers, relative to the home directory: the code, the virtualenv, the job logs.
: "${REMOTE_DIR:=bert_jax}"
: "${REMOTE_VENV:=bert_jax_venv}"
: "${REMOTE_LOGS:=bert_jax_logs}"
# Python that builds the virtualenv (a command name). Empty: python3 if it is 3.11+ (the project's numpy needs 3.11),
# else python3.11, installed with apt if missing.
: "${PYTHON:=}"
# Installed beside `pip install -e .`: JAX's TPU build (JAX's install guide: pip install -U "jax[tpu]").
: "${JAX_PIP_SPEC:=jax[tpu]}"
# 1: reinstall the virtualenv's packages even if pyproject.toml, setup.cfg and JAX_PIP_SPEC did not change.
: "${REINSTALL:=0}"

# --- The job -------------------------------------------------------------------------------------------------------
# Config file, relative to the repository root.
: "${CONFIG:=configs/large.py}"
# Checkpoints and TensorBoard logs: a gs:// path that every worker can read and write. Required by run.sh.
: "${WORKDIR:=}"
# More flags for bert_jax.main, split on spaces (run.sh's own arguments are added after them).
: "${EXTRA_FLAGS:=}"
# Environment of the job, split on spaces, e.g. "JAX_PLATFORMS=cpu".
: "${JOB_ENV:=}"
# Workers that setup/run/stop/status/ssh address: all, one index (0), a list (0,2) or a range (1-3).
: "${WORKERS:=all}"
# The worker whose log logs.sh follows (process 0 prints the progress lines), and how many old lines it shows first.
: "${LOG_WORKER:=0}"
: "${LOG_LINES:=100}"
# stop.sh: the signal (TERM: checkpoint at the current step, then exit) and how many seconds to wait for the exit.
: "${STOP_SIGNAL:=TERM}"
: "${STOP_WAIT:=600}"
# More flags for every `gcloud compute tpus tpu-vm ssh/scp`, split on spaces, e.g. "--internal-ip".
: "${SSH_FLAGS:=}"

if [[ -z $RUNTIME_VERSION ]]; then
  case $ACCELERATOR_TYPE in
    v6e-*) RUNTIME_VERSION=v2-alpha-tpuv6e ;;
    v5p-*) RUNTIME_VERSION=v2-alpha-tpuv5 ;;
    v5litepod-*) RUNTIME_VERSION=v2-alpha-tpuv5-lite ;;
    *) RUNTIME_VERSION=tpu-ubuntu2204-base ;;
  esac
fi

# The variables worker.sh reads; passed explicitly on every remote call, so local overrides reach the workers.
WORKER_VARS=(REMOTE_DIR REMOTE_VENV REMOTE_LOGS PYTHON JAX_PIP_SPEC REINSTALL LOG_LINES STOP_SIGNAL STOP_WAIT)

# This repository's root (the directory above launch/).
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# --zone and --project for every gcloud call.
TPU_FLAGS=(--zone="$ZONE")
if [[ -n $PROJECT ]]; then
  TPU_FLAGS+=(--project="$PROJECT")
fi
SSH_FLAG_LIST=()
if [[ -n $SSH_FLAGS ]]; then
  read -r -a SSH_FLAG_LIST <<<"$SSH_FLAGS"
fi

log() { echo "[launch] $*" >&2; }
die() {
  echo "[launch] error: $*" >&2
  exit 1
}

# Runs one shell command line on the given workers: tpu_ssh WORKERS COMMAND.
tpu_ssh() {
  gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${TPU_FLAGS[@]}" --worker="$1" --command="$2" \
    ${SSH_FLAG_LIST[@]+"${SSH_FLAG_LIST[@]}"}
}

# The command line that runs `launch/worker.sh ARGS...` on a worker, every argument quoted for the remote bash.
worker_command() {
  local line="cd &&" name arg
  for name in "${WORKER_VARS[@]}"; do
    line+=" $name=$(printf '%q' "${!name}")"
  done
  line+=" bash $(printf '%q' "$REMOTE_DIR/launch/worker.sh")"
  for arg in "$@"; do
    line+=" $(printf '%q' "$arg")"
  done
  echo "$line"
}

# State of the slice (READY, PREEMPTED, ...) and of its queued resource (ACTIVE, WAITING_FOR_RESOURCES, ...);
# empty when there is none (or gcloud cannot tell: its own error then shows on the next call).
node_state() {
  gcloud compute tpus tpu-vm describe "$TPU_NAME" "${TPU_FLAGS[@]}" --format='value(state)' 2>/dev/null || true
}
queued_state() {
  gcloud compute tpus queued-resources describe "$TPU_NAME" "${TPU_FLAGS[@]}" --format='value(state.state)' \
    2>/dev/null || true
}
