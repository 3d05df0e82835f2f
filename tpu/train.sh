#!/usr/bin/env bash
# Starts `python run.py` on every host of the TPU at once, detached: the same command pretrains on one host or a
# pod slice, and goes on when the ssh connection (or this laptop) goes away.
#
#   TPU_NAME=jbert ZONE=us-central2-b WORKDIR=gs://BUCKET/bert_base tpu/train.sh --config=configs/base.py \
#       [--config.KEY=VALUE ...]
#
# WORKDIR must be a gs:// path (every host writes its checkpoint shards there, and it outlives the VM).
# Each host runs run.py in its own session (setsid + nohup: no SIGHUP when ssh drops), appends its output to
# ~/jbert_train.log, keeps the process id in ~/jbert_train.pid and, once run.py has ended, its exit status in
# ~/jbert_train.exit. The script then follows worker 0's log; Ctrl-C there stops the following, not the run
# (FOLLOW=0: return at once). Later: tpu/logs.sh follows it again, tpu/stop.sh stops the run (SIGTERM: the step
# finishes, a checkpoint is saved, run.py exits). Rerun the same command after a preemption or a stop: training
# resumes from the latest complete checkpoint (tpu/run.sh does that by itself). Process 0 also writes
# WORKDIR/metrics.jsonl and TensorBoard events.
#
# The XLA compile cache is shared by every host and every slice in the bucket: COMPILE_CACHE (default
# gs://BUCKET/jbert_compile_cache, BUCKET the workdir's) goes to run.py as --compile_cache, unless the flags pass
# their own; a resume on a new slice then loads the programs instead of compiling them. COMPILE_CACHE=off: none.
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
RUN_ARGS=("--workdir=$WORKDIR")
if [[ " $* " != *" --compile_cache="* ]]; then
  BUCKET="${WORKDIR#gs://}"
  RUN_ARGS+=("--compile_cache=${COMPILE_CACHE:-gs://${BUCKET%%/*}/jbert_compile_cache}")
fi
ARGS="$(printf '%q ' "${RUN_ARGS[@]}" "$@")"
# A run still going on a host keeps the TPU; a second one would fail on it and bury the first one's log.
# run.py runs under a small bash (its session's leader) that writes run.py's pid, waits for it and writes its
# exit status: the flags reach that bash as its arguments ("$@"), so no quoting of theirs is nested in another.
on_all_workers "set -e
  if [ -f $PID_FILE ] && kill -0 \$(cat $PID_FILE) 2>/dev/null; then
    echo \"tpu/train.sh: a run is still going on \$(hostname) (pid \$(cat $PID_FILE)); tpu/stop.sh stops it.\" >&2
    exit 3
  fi
  cd ~/$REMOTE_DIR && . ~/$REMOTE_VENV/bin/activate
  rm -f $PID_FILE $EXIT_FILE $STOP_FILE
  echo \"=== \$(date -u +%FT%TZ) python run.py $ARGS\" >> $LOG_FILE
  setsid nohup bash -c 'python run.py \"\$@\" & echo \$! > $PID_FILE; wait \$!; echo \$? > $EXIT_FILE' run.py \\
    $ARGS>> $LOG_FILE 2>&1 < /dev/null &
  for i in \$(seq 100); do [ -s $PID_FILE ] && break; sleep 0.1; done
  echo \"started on \$(hostname): pid \$(cat $PID_FILE), log $LOG_FILE\""
report "run.py runs detached on every host of $TPU_NAME; tpu/logs.sh follows worker 0's log, tpu/stop.sh stops it."
if [[ "${FOLLOW:-1}" != 0 && "${DRY_RUN:-0}" == 0 ]]; then
  exec "$(dirname "$0")/logs.sh"
fi
