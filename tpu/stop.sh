#!/usr/bin/env bash
# Stops the run tpu/train.sh started: SIGTERM to run.py on every host, which finishes its step, saves a
# checkpoint and exits (as on a preemption); rerunning the same tpu/train.sh command resumes it. The hosts keep a
# mark of the stop, so a tpu/run.sh loop following the run ends instead of restarting it.
#
#   TPU_NAME=jbert ZONE=us-central2-b tpu/stop.sh        # KILL=1 ends it at once instead (kill -9, no save)
source "$(dirname "$0")/common.sh"
SIGNAL=TERM
if [[ "${KILL:-0}" != 0 ]]; then SIGNAL=KILL; fi
on_all_workers "$(stop_command "$SIGNAL")"
