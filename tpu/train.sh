#!/usr/bin/env bash
# Starts `python run.py` on every host of the TPU at once, detached: the same command pretrains on one host or a
# pod slice, and goes on when the ssh connection (or this laptop) goes away.
#
#   TPU_NAME=jbert ZONE=us-central2-b WORKDIR=gs://BUCKET/bert_base tpu/train.sh --config=configs/base.py \
#       [--config.KEY=VALUE ...]
#
# WORKDIR must be a gs:// path (every host writes its checkpoint shards there, and it outlives the VM).
# Each host runs run.py in its own session (setsid + nohup: no SIGHUP when ssh drops), appends its output to
# ~/jbert_train.log and keeps the process id in ~/jbert_train.pid. The script then follows worker 0's log;
# Ctrl-C there stops the following, not the run (FOLLOW=0: return at once). Later: tpu/logs.sh follows it again,
# tpu/stop.sh stops the run (SIGTERM: the step finishes, a checkpoint is saved, run.py exits).
# Rerun the same command after a preemption or a stop: training resumes from the latest complete checkpoint.
# Process 0 also writes WORKDIR/metrics.jsonl and TensorBoard events.
source "$(dirname "$0")/common.sh"
: "${WORKDIR:?set WORKDIR=gs://BUCKET/PATH: checkpoints and metrics must outlive the TPU VM}"
if [[ "$WORKDIR" != gs://* ]]; then
  echo "tpu/train.sh: WORKDIR=$WORKDIR is not a gs:// path; hosts of a slice do not share a local disk." >&2
  exit 2
fi
if [[ $# -eq 0 ]]; then
  echo "tpu/train.sh: pass run.py's flags, e.g. --config=configs/base.py" >&2
  exit 2
fi

ARGS="$(printf '%q ' "--workdir=$WORKDIR" "$@")"
# A run still going on a host keeps the TPU; a second one would fail on it and bury the first one's log.
on_all_workers "set -e
  if [ -f $PID_FILE ] && kill -0 \$(cat $PID_FILE) 2>/dev/null; then
    echo \"tpu/train.sh: a run is still going on \$(hostname) (pid \$(cat $PID_FILE)); tpu/stop.sh stops it.\" >&2
    exit 3
  fi
  cd ~/$REMOTE_DIR && . ~/$REMOTE_VENV/bin/activate
  echo \"=== \$(date -u +%FT%TZ) python run.py $ARGS\" >> $LOG_FILE
  setsid nohup python run.py $ARGS >> $LOG_FILE 2>&1 < /dev/null &
  echo \$! > $PID_FILE
  echo \"started on \$(hostname): pid \$!, log $LOG_FILE\""
echo "run.py runs detached on every host of $TPU_NAME; tpu/logs.sh follows worker 0's log, tpu/stop.sh stops it."
if [[ "${FOLLOW:-1}" != 0 ]]; then
  exec "$(dirname "$0")/logs.sh"
fi
