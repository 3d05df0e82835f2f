# Sourced by the tpu/*.sh scripts: checks the variables that name the TPU and wraps `gcloud ... tpu-vm`.
set -euo pipefail

: "${TPU_NAME:?set TPU_NAME, the name of the TPU VM or slice (e.g. TPU_NAME=jbert-v4-32)}"
: "${ZONE:?set ZONE, the zone the TPU lives in (e.g. ZONE=us-central2-b)}"
PROJECT_FLAG=()
if [[ -n "${PROJECT:-}" ]]; then PROJECT_FLAG=(--project="$PROJECT"); fi
# Where jbert lives on every host, and its virtualenv.
REMOTE_DIR="${REMOTE_DIR:-jbert}"
REMOTE_VENV="${REMOTE_VENV:-jbert-venv}"

# Runs a shell command on every host of the slice at once (a pod slice needs all hosts to start JAX).
on_all_workers() {
  gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" "${PROJECT_FLAG[@]}" --worker=all --command="$1"
}

# What tpu/train.sh leaves on each host: run.py's output (appended, one header line per start) and its pid.
LOG_FILE="${LOG_FILE:-~/jbert_train.log}"
PID_FILE="${PID_FILE:-~/jbert_train.pid}"

# Runs a shell command on one host (WORKER, default 0).
on_worker() {
  gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" "${PROJECT_FLAG[@]}" --worker="${WORKER:-0}" \
    --command="$1"
}
