#!/usr/bin/env bash
# Stops the run tpu/train.sh started: SIGTERM to run.py on every host, which finishes its step, saves a
# checkpoint and exits (as on a preemption); rerunning the same tpu/train.sh command resumes it.
#
#   TPU_NAME=jbert ZONE=us-central2-b tpu/stop.sh        # KILL=1 ends it at once instead (kill -9, no save)
source "$(dirname "$0")/common.sh"
SIGNAL=TERM
if [[ "${KILL:-0}" != 0 ]]; then SIGNAL=KILL; fi
on_all_workers "if [ -f $PID_FILE ] && kill -0 \$(cat $PID_FILE) 2>/dev/null; then
    kill -$SIGNAL \$(cat $PID_FILE) && echo \"\$(hostname): sent SIG$SIGNAL to run.py (pid \$(cat $PID_FILE))\"
    while kill -0 \$(cat $PID_FILE) 2>/dev/null; do sleep 1; done
    echo \"\$(hostname): stopped; the end of $LOG_FILE:\"; tail -n 3 $LOG_FILE
  else
    echo \"\$(hostname): no run going on\"
  fi"
