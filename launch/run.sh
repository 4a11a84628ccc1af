#!/usr/bin/env bash
# Starts `python -m bert_jax.main --config=$CONFIG --workdir=$WORKDIR $EXTRA_FLAGS [ARGS...]` on every worker, from
# the repository root there, detached (an ssh disconnect does not stop it), output to ~/bert_jax_logs/run-TIME.log on
# each worker. JAX finds the other workers of the slice by itself. Settings: launch/env.sh.
#   WORKDIR=gs://BUCKET/bert-large launch/run.sh \
#     --config.tokenizer.path=gs://BUCKET/vocab/uncased_vocab.txt --config.data.prepared_dir=gs://BUCKET/wiki_uncased
# The same command again resumes from the newest checkpoint in WORKDIR (after launch/stop.sh, or a preemption).
# Refuses to start where a job is still running. Prepare the corpus before, once, elsewhere (launch/README.md).
set -euo pipefail
# shellcheck source=env.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

[[ $WORKDIR == gs://* ]] || die "WORKDIR must be a gs:// path, which every worker reads and writes (got '$WORKDIR')"
job=(env)
if [[ -n $JOB_ENV ]]; then
  read -r -a job_env <<<"$JOB_ENV"
  job+=(${job_env[@]+"${job_env[@]}"})
fi
job+=(python -m bert_jax.main --config="$CONFIG" --workdir="$WORKDIR")
if [[ -n $EXTRA_FLAGS ]]; then
  read -r -a extra <<<"$EXTRA_FLAGS"
  job+=(${extra[@]+"${extra[@]}"})
fi
job+=("$@")

# One name on every worker, so that their logs match.
name="run-$(date -u +%Y%m%d-%H%M%S)"
log "starting on $TPU_NAME workers $WORKERS:$(printf ' %q' "${job[@]:1}")"
tpu_ssh "$WORKERS" "$(worker_command start "$name" "${job[@]}")"
log "started. Follow: launch/logs.sh; state: launch/status.sh; stop with a checkpoint: launch/stop.sh"
