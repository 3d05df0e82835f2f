# Sourced by the tpu/*.sh scripts: checks the variables that name the TPU and wraps `gcloud ... tpu-vm`.
set -euo pipefail

: "${TPU_NAME:?set TPU_NAME, the name of the TPU VM or slice (e.g. TPU_NAME=jbert-v4-32)}"
: "${ZONE:?set ZONE, the zone the TPU lives in (e.g. ZONE=us-central2-b)}"
PROJECT_FLAG=()
if [[ -n "${PROJECT:-}" ]]; then PROJECT_FLAG=(--project="$PROJECT"); fi
# gcloud's flags for every ssh and scp to the hosts, e.g. SSH_FLAGS=--internal-ip (from a VM in the same VPC) or
# SSH_FLAGS=--tunnel-through-iap (no external IP; needs a gcloud whose tpu-vm ssh has it, else GCLOUD_TRACK=alpha).
read -r -a SSH_FLAG_ARGS <<< "${SSH_FLAGS:-}"
# GCLOUD_TRACK=alpha or beta runs `gcloud alpha compute tpus ...` (flags GA gcloud lacks, such as --best-effort).
GCLOUD_TRACK_ARGS=()
if [[ -n "${GCLOUD_TRACK:-}" ]]; then GCLOUD_TRACK_ARGS=("$GCLOUD_TRACK"); fi
# Where jbert lives on every host, and its virtualenv.
REMOTE_DIR="${REMOTE_DIR:-jbert}"
REMOTE_VENV="${REMOTE_VENV:-jbert-venv}"
# What tpu/train.sh leaves on each host: run.py's output (appended, one header line per start), its pid, its exit
# status once it has ended, and the mark tpu/stop.sh leaves (a stop asked for, not a preemption).
LOG_FILE="${LOG_FILE:-~/jbert_train.log}"
PID_FILE="${PID_FILE:-~/jbert_train.pid}"
EXIT_FILE="${EXIT_FILE:-~/jbert_train.exit}"
STOP_FILE="${STOP_FILE:-~/jbert_train.stop_requested}"

# gcloud compute tpus ARGS... (GCLOUD_TRACK's).
tpus() {
  run_gcloud "${GCLOUD_TRACK_ARGS[@]}" compute tpus "$@"
}

# gcloud ARGS..., or with DRY_RUN=1 the command printed (a remote --command as a block after it).
run_gcloud() {
  local args=(gcloud "$@")
  if [[ "${DRY_RUN:-0}" == 0 ]]; then
    "${args[@]}"
    return
  fi
  local line="" remote="" a
  for a in "${args[@]}"; do
    if [[ "$a" == --command=* ]]; then remote="${a#--command=}"; line+="--command=\"\$REMOTE\" "
    else line+="$(printf '%q' "$a") "; fi
  done
  echo "DRY_RUN: ${line% }"
  if [[ -n "$remote" ]]; then echo "REMOTE:"; printf '%s\n' "$remote" | sed 's/^/    /'; fi
}

# What a script says it did; a dry run did none of it.
report() {
  if [[ "${DRY_RUN:-0}" == 0 ]]; then echo "$*"; else echo "DRY_RUN: nothing done; done, it would say: $*"; fi
}

# A remote command that does not parse is refused here, before it reaches every host of a slice.
check_remote() {
  if ! bash -n <<< "$1" 2>/dev/null; then
    echo "$(basename "$0"): the remote command does not parse (a bug of tpu/$(basename "$0")):" >&2
    bash -n <<< "$1" >&2 || true
    exit 70
  fi
}

# Runs a shell command on every host of the slice at once (a pod slice needs all hosts to start JAX).
on_all_workers() {
  check_remote "$1"
  tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" "${PROJECT_FLAG[@]}" "${SSH_FLAG_ARGS[@]}" --worker=all --command="$1"
}

# Runs a shell command on one host (WORKER, default 0).
on_worker() {
  check_remote "$1"
  tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" "${PROJECT_FLAG[@]}" "${SSH_FLAG_ARGS[@]}" --worker="${WORKER:-0}" \
    --command="$1"
}

# Copies local files to the home directory of every host.
to_all_workers() {
  tpus tpu-vm scp "$@" "$TPU_NAME": --zone="$ZONE" "${PROJECT_FLAG[@]}" "${SSH_FLAG_ARGS[@]}" --worker=all
}

# The remote command that ends run.py on a host: SIG$1 (TERM: the step finishes and a checkpoint is saved), then
# waits for it to exit. Leaves the mark that tells tpu/run.sh a stop was asked for.
stop_command() {
  echo "if [ -f $PID_FILE ] && kill -0 \$(cat $PID_FILE) 2>/dev/null; then
    touch $STOP_FILE
    kill -$1 \$(cat $PID_FILE) && echo \"\$(hostname): sent SIG$1 to run.py (pid \$(cat $PID_FILE))\"
    while kill -0 \$(cat $PID_FILE) 2>/dev/null; do sleep 1; done
    echo \"\$(hostname): stopped; the end of $LOG_FILE:\"; tail -n 3 $LOG_FILE
  else
    echo \"\$(hostname): no run going on\"
  fi"
}

# The slice's state, one word: with QUEUED=1 its queued resource's (ACTIVE, WAITING_FOR_RESOURCES, PROVISIONING,
# SUSPENDED, FAILED, ...), else the TPU VM's (READY, CREATING, PREEMPTED, TERMINATED, ...); NOT_FOUND when there
# is none. Another gcloud error (credentials, network) is one line on stderr and status 1.
slice_state() {
  local args err out
  if [[ "${QUEUED:-0}" == 0 ]]; then args=(tpu-vm describe "$TPU_NAME" --format='value(state)')
  else args=(queued-resources describe "$TPU_NAME" --format='value(state.state)'); fi
  err="$(mktemp)"
  if out="$(tpus "${args[@]}" --zone="$ZONE" "${PROJECT_FLAG[@]}" 2>"$err")"; then
    rm -f "$err"
    echo "${out:-UNKNOWN}"
    return 0
  fi
  if grep -q NOT_FOUND "$err"; then rm -f "$err"; echo NOT_FOUND; return 0; fi
  echo "$(basename "$0"): gcloud could not describe $TPU_NAME: $(grep . "$err" | tail -n 1)" >&2
  rm -f "$err"
  return 1
}
