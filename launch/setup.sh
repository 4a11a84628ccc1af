#!/usr/bin/env bash
# Puts the code on every worker and builds the same virtualenv there: Python 3.11+, `pip install -e .` and JAX's TPU
# build (JAX_PIP_SPEC). Idempotent: a second run refreshes the code and skips pip unless pyproject.toml, setup.cfg or
# JAX_PIP_SPEC changed (REINSTALL=1 forces it). Refuses while a job runs. Settings: launch/env.sh.
#   launch/setup.sh                                    # copies this checkout (tracked + untracked, not ignored, files)
#   REPO_URL=https://github.com/OWNER/bert_jax.git BRANCH=main launch/setup.sh   # each worker clones / fetches instead
# Run it again after changing the code, before launch/run.sh.
set -euo pipefail
# shellcheck source=env.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

q() { printf '%q' "$1"; }
dir="$(q "$REMOTE_DIR")"
# The code is replaced under a job only if it is not running (worker.sh is not there yet on a fresh worker).
guard="if [ -f $(q "$REMOTE_LOGS/job.pid") ] && kill -0 \"\$(cat $(q "$REMOTE_LOGS/job.pid"))\" 2>/dev/null; then
  echo \"\$(hostname): a job is running; stop it first (launch/stop.sh)\" >&2; exit 1; fi"

if [[ -z $REPO_URL ]]; then
  archive="$(mktemp "${TMPDIR:-/tmp}/bert_jax_src.XXXXXX")"
  trap 'rm -f "$archive"' EXIT
  # Tracked and untracked files that git does not ignore, as they are on disk now (deleted ones left out).
  git -C "$REPO_ROOT" ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' file; do
      if [[ -e $REPO_ROOT/$file ]]; then
        printf '%s\0' "$file"
      fi
    done |
    COPYFILE_DISABLE=1 tar -czf "$archive" -C "$REPO_ROOT" --null -T -
  log "copying $REPO_ROOT ($(du -k "$archive" | cut -f1) KiB packed) to $TPU_NAME workers $WORKERS"
  gcloud compute tpus tpu-vm scp "$archive" "$TPU_NAME:bert_jax_src.tar.gz" "${TPU_FLAGS[@]}" --worker="$WORKERS" \
    ${SSH_FLAG_LIST[@]+"${SSH_FLAG_LIST[@]}"}
  fetch="rm -rf $dir.new && mkdir -p $dir.new && tar -xzf bert_jax_src.tar.gz -C $dir.new &&
    rm -f bert_jax_src.tar.gz && rm -rf $dir && mv $dir.new $dir"
else
  log "workers $WORKERS of $TPU_NAME fetch $REPO_URL $BRANCH"
  url="$(q "$REPO_URL")"
  branch="$(q "$BRANCH")"
  fetch="if [ -d $dir/.git ]; then git -C $dir remote set-url origin $url &&
    git -C $dir fetch -q --depth=1 origin $branch && git -C $dir checkout -q --force FETCH_HEAD;
    else rm -rf $dir && git clone -q --depth=1 --branch $branch $url $dir; fi"
fi

tpu_ssh "$WORKERS" "set -e; cd; $guard
$fetch
$(worker_command setup)"
log "workers ready. Next: WORKDIR=gs://BUCKET/RUN launch/run.sh [--config.key=value ...]"
