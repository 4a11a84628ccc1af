#!/usr/bin/env bash
# The worker side of the launch/ scripts: runs ON each TPU VM worker, called over `gcloud compute tpus tpu-vm ssh`
# from the repository copy there (paths from launch/env.sh, relative to the home directory):
#   bash bert_jax/launch/worker.sh setup              # the virtualenv: -e this checkout + JAX for TPU (idempotent)
#   bash bert_jax/launch/worker.sh start NAME CMD...  # CMD detached in the checkout; output to ~/bert_jax_logs/NAME.log
#   bash bert_jax/launch/worker.sh stop               # STOP_SIGNAL to the job, then wait up to STOP_WAIT seconds
#   bash bert_jax/launch/worker.sh status             # running or not, and the log's last lines
#   bash bert_jax/launch/worker.sh logs               # follow the newest job's log (tail -F)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=env.sh source-path=SCRIPTDIR
source "$here/env.sh"
cd "$HOME"

repo="$(dirname "$here")"
in_home() { if [[ $1 == /* ]]; then echo "$1"; else echo "$HOME/$1"; fi; }
venv="$(in_home "$REMOTE_VENV")"
log_dir="$(in_home "$REMOTE_LOGS")"
pid_file="$log_dir/job.pid"
host="$(hostname)"

# The job's pid if it is running. It was started as a session leader, which tells it from a reused pid.
job_pid() {
  local pid
  [[ -f $pid_file ]] || return 1
  pid="$(<"$pid_file")"
  [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
  [[ "$(ps -o sid= -p "$pid" | tr -d ' ')" == "$pid" ]] || return 1
  echo "$pid"
}

# The interpreter for the virtualenv: PYTHON, else python3 if it is 3.11+, else python3.11.
pick_python() {
  if [[ -n $PYTHON ]]; then
    echo "$PYTHON"
  elif python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo python3
  else
    echo python3.11
  fi
}

setup() {
  if pid="$(job_pid)"; then
    die "$host: a job is running (pid $pid); stop it first (launch/stop.sh)"
  fi
  local pid python version stamp
  python="$(pick_python)"
  if ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
    log "$host: installing $python and $python-venv with apt"
    sudo DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -q
    sudo DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q "$python" "$python-venv"
  fi
  version="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  if [[ "$("$venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" != "$version" ]]; then
    log "$host: creating the virtualenv $venv with $python ($version)"
    rm -rf "$venv"
    "$python" -m venv "$venv"
  fi
  # Reinstall only when what pip would resolve can change: the package metadata, the JAX spec, the Python version.
  stamp="$({ cat "$repo/pyproject.toml" "$repo/setup.cfg"; echo "$JAX_PIP_SPEC $version"; } | sha256sum | cut -d' ' -f1)"
  if [[ $REINSTALL != 1 && -f $venv/.bert_jax_stamp && "$(<"$venv/.bert_jax_stamp")" == "$stamp" ]]; then
    log "$host: virtualenv up to date"
  else
    log "$host: pip install -e $repo $JAX_PIP_SPEC"
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    "$venv/bin/python" -m pip install --quiet -e "$repo" "$JAX_PIP_SPEC"
    echo "$stamp" >"$venv/.bert_jax_stamp"
  fi
  # Importing jax does not open the TPU, so this is safe while nothing else runs.
  "$venv/bin/python" -c "import bert_jax, jax; print('$host: ready, Python $version, jax', jax.__version__)"
}

start() {
  (($# >= 2)) || die "usage: worker.sh start NAME CMD [ARG...]"
  local name="$1" pid
  shift
  if pid="$(job_pid)"; then
    die "$host: a job is already running (pid $pid, log $(readlink "$log_dir/latest.log")); stop it first (launch/stop.sh)"
  fi
  [[ -x $venv/bin/python ]] || die "$host: no virtualenv at $venv; run launch/setup.sh first"
  mkdir -p "$log_dir"
  local log_file="$log_dir/$name.log"
  {
    echo "# $(date -u '+%F %T UTC') on $host, in $repo:"
    printf '#'
    printf ' %q' "$@"
    echo
  } >"$log_file"
  ln -sfn "$name.log" "$log_dir/latest.log"
  rm -f "$pid_file"
  cd "$repo"
  # setsid: a session of its own, so neither an ssh disconnect (SIGHUP) nor Ctrl-C here reaches the job. The inner
  # bash writes its pid (which exec hands to the job) before becoming the job.
  # shellcheck disable=SC2016  # $$ and $@ belong to the inner bash.
  PATH="$venv/bin:$PATH" VIRTUAL_ENV="$venv" setsid bash -c 'echo $$ >"$0"; exec "$@"' "$pid_file" "$@" \
    >>"$log_file" 2>&1 </dev/null &
  sleep 3
  if pid="$(job_pid)"; then
    echo "$host: started pid $pid, log $log_file"
  else
    echo "$host: the job exited at once; the end of $log_file:" >&2
    tail -n 20 "$log_file" >&2
    exit 1
  fi
}

stop() {
  local pid waited=0
  if ! pid="$(job_pid)"; then
    echo "$host: no job running"
    return 0
  fi
  # The whole process group: the job and any worker processes it started (corpus preparation uses several).
  kill -s "$STOP_SIGNAL" -- "-$pid"
  echo "$host: sent SIG$STOP_SIGNAL to pid $pid; waiting up to ${STOP_WAIT}s for it to exit"
  while kill -0 "$pid" 2>/dev/null; do
    if ((waited >= STOP_WAIT)); then
      echo "$host: still running after ${STOP_WAIT}s (to kill it: STOP_SIGNAL=KILL launch/stop.sh)" >&2
      exit 1
    fi
    sleep 5
    waited=$((waited + 5))
  done
  echo "$host: stopped; the end of its log:"
  tail -n 5 "$log_dir/latest.log"
}

status() {
  local pid
  if pid="$(job_pid)"; then
    echo "$host: running, pid $pid, log $(readlink "$log_dir/latest.log")"
  else
    echo "$host: no job running"
  fi
  if [[ -e $log_dir/latest.log ]]; then
    tail -n 3 "$log_dir/latest.log"
  fi
}

logs() {
  [[ -e $log_dir/latest.log ]] || die "$host: no job has been started here (no $log_dir/latest.log)"
  echo "$host: $(readlink "$log_dir/latest.log") (Ctrl-C stops following; the job goes on)"
  exec tail -n "$LOG_LINES" -F "$log_dir/latest.log"
}

case "${1:-}" in
  setup | stop | status | logs) "$1" ;;
  start)
    shift
    start "$@"
    ;;
  *) die "usage: worker.sh setup|start NAME CMD...|stop|status|logs" ;;
esac
