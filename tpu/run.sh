#!/usr/bin/env bash
# Trains to the end through preemptions: makes sure the slice exists (creating it, or deleting and recreating it
# when it was preempted), installs jbert on it, starts run.py on every host (tpu/train.sh) and follows the run;
# a preempted slice or a failed run.py is recovered and the run resumed from its latest checkpoint, at most
# MAX_ATTEMPTS starts of run.py (default 10).
#
#   TPU_NAME=jbert ZONE=us-central2-b ACCELERATOR=v5litepod-16 WORKDIR=gs://BUCKET/bert_base \
#       CREATE_FLAGS=--spot [QUEUED=1] tpu/run.sh --config=configs/base.py [--config.KEY=VALUE ...]
#
# CREATE_FLAGS: tpu/create.sh's arguments (--spot, --valid-until-duration=6h with QUEUED=1, ...). Every slice
# gets the commit checked out when run.sh started (REVISION), whatever is committed later. An existing READY
# slice is set up again unless SETUP=0; a run already going on it is followed, not restarted. Every POLL_S
# seconds (default 60) run.sh asks gcloud for the slice's state and worker 0 whether run.py is still going, and
# how it ended:
#   - finished (exit 0): run.sh exits 0. A stop asked for with tpu/stop.sh: exits 0 too, the run resumable
#     (whatever run.py's status: a stop during its start-up ends it before its handler saves anything).
#   - exit status 2 (run.py refused its flags, config or data: rerunning cannot help): run.sh exits 2.
#   - any other end, a slice PREEMPTED, TERMINATED, SUSPENDED or FAILED: the next attempt (recreated slice).
# Ctrl-C ends run.sh only; the run goes on (tpu/stop.sh stops it). DRY_RUN=1 prints the commands of a first
# attempt on a new slice.
source "$(dirname "$0")/common.sh"
HERE="$(dirname "$0")"
: "${ACCELERATOR:?set ACCELERATOR, the TPU type and size: run.sh recreates the slice after a preemption}"
: "${WORKDIR:?set WORKDIR=gs://BUCKET/PATH: checkpoints and metrics must outlive the TPU VM}"
if [[ "$WORKDIR" != gs://* ]]; then
  echo "tpu/run.sh: WORKDIR=$WORKDIR is not a gs:// path; hosts of a slice do not share a local disk." >&2
  exit 2
fi
if [[ $# -eq 0 ]]; then
  echo "tpu/run.sh: pass run.py's flags, e.g. --config=configs/base.py" >&2
  exit 2
fi
MAX_ATTEMPTS="${MAX_ATTEMPTS:-10}"
POLL_S="${POLL_S:-60}"
if ! [[ "$MAX_ATTEMPTS" =~ ^[1-9][0-9]*$ ]]; then
  echo "tpu/run.sh: MAX_ATTEMPTS=$MAX_ATTEMPTS: pass a whole number of run.py starts, 1 or more." >&2
  exit 2
fi
read -r -a CREATE_ARGS <<< "${CREATE_FLAGS:-}"
export REVISION="${REVISION:-$(git -C "$HERE/.." rev-parse HEAD)}"

say() { echo "$(date -u +%FT%TZ) tpu/run.sh: $*"; }

if [[ "${DRY_RUN:-0}" != 0 ]]; then
  "$HERE/create.sh" "${CREATE_ARGS[@]}"
  "$HERE/setup.sh"
  FOLLOW=0 "$HERE/train.sh" "$@"
  echo "DRY_RUN: then, every ${POLL_S} s: the slice's state (gcloud describe) and worker 0's run (ssh); on a" \
       "preemption or a failed run: FORCE=1 tpu/delete.sh, tpu/create.sh, tpu/setup.sh, tpu/train.sh again" \
       "(at most MAX_ATTEMPTS=$MAX_ATTEMPTS starts)."
  exit 0
fi

# Worker 0's run, one line: `running`, `ending` (run.py has exited, its status not yet written: the file can be
# there and still empty, between the shell's opening it and its writing the number), `none` (no run
# started on this slice), or `exited STATUS STOPPED ASKED`: STOPPED 1 when the log since the last start says
# "stopped at step" (a SIGTERM: the run is resumable, not finished), ASKED 1 when tpu/stop.sh asked for it. The
# end of the log follows, for the messages.
STATUS_COMMAND="if [ -f $PID_FILE ] && kill -0 \$(cat $PID_FILE) 2>/dev/null; then echo 'jbert-status running'
  elif [ -s $EXIT_FILE ]; then
    echo \"jbert-status exited \$(cat $EXIT_FILE)\" \
         \"\$(awk '/^=== /{s=0} /stopped at step/{s=1} END{print s+0}' $LOG_FILE)\" \
         \"\$([ -f $STOP_FILE ] && echo 1 || echo 0)\"
    tail -n 5 $LOG_FILE | sed 's/^/jbert-log /'
  elif [ -f $PID_FILE ]; then echo 'jbert-status ending'
  else echo 'jbert-status none'; fi"

# Creates the slice (deleting what is left of it first with $1=1); a failure (no capacity in the zone, most
# often) is retried after POLL_S, at most MAX_ATTEMPTS times in a row.
create_failures=0
make_slice() {
  if [[ "$1" == 1 ]]; then
    FORCE=1 "$HERE/delete.sh" || say "deleting $TPU_NAME failed (see above); creating it anyway."
  fi
  if "$HERE/create.sh" "${CREATE_ARGS[@]}"; then
    FRESH=1
    create_failures=0
    return 0
  fi
  create_failures=$((create_failures + 1))
  if (( create_failures >= MAX_ATTEMPTS )); then
    say "tpu/create.sh failed $create_failures times in a row (see above); giving up. The workdir keeps every" \
        "checkpoint: rerun tpu/run.sh to go on." >&2
    exit 1
  fi
  say "tpu/create.sh failed ($create_failures of $MAX_ATTEMPTS); trying again in $POLL_S s."
  sleep "$POLL_S"
}

# Waits until the slice is READY (ACTIVE for a queued resource), creating or recreating it as needed. Sets FRESH=1
# when it made a new one.
ensure_slice() {
  local state failures=0
  while true; do
    if ! state="$(slice_state)"; then
      failures=$((failures + 1))
      if (( failures >= 5 )); then
        say "gcloud failed to describe $TPU_NAME $failures times in a row (see above); giving up." >&2
        exit 1
      fi
      sleep "$POLL_S"
      continue
    fi
    failures=0
    case "$state" in
      READY|ACTIVE) return 0 ;;
      NOT_FOUND) say "no slice $TPU_NAME in $ZONE: creating it."; make_slice 0 ;;
      PREEMPTED|TERMINATED|SUSPENDED|FAILED)
        say "$TPU_NAME is $state: deleting it and creating it again."
        make_slice 1 ;;
      STOPPED)
        say "$TPU_NAME is STOPPED (gcloud compute tpus tpu-vm stop): start it again ('gcloud compute tpus tpu-vm" \
            "start $TPU_NAME --zone=$ZONE') or delete it (tpu/delete.sh), then rerun tpu/run.sh." >&2
        exit 1 ;;
      *) say "$TPU_NAME is $state: waiting."; sleep "$POLL_S" ;;
    esac
  done
}

# Worker 0's status line and the log lines after it (empty when ssh failed).
run_status() {
  WORKER=0 on_worker "$STATUS_COMMAND" 2>/dev/null | grep '^jbert-' || true
}

attempt=0
FRESH=0
setup_needed=$([[ "${SETUP:-1}" == 0 ]] && echo 0 || echo 1)
last_end="none yet"
while true; do
  ensure_slice
  if (( FRESH )); then setup_needed=1; FRESH=0; fi
  status="$(run_status | head -n 1)"
  if [[ "$status" == "jbert-status running" ]]; then
    if (( attempt == 0 )); then attempt=1; fi
    say "a run is already going on $TPU_NAME: following it (attempt $attempt of $MAX_ATTEMPTS)."
  else
    if (( attempt >= MAX_ATTEMPTS )); then
      say "gave up after $attempt starts of run.py (MAX_ATTEMPTS=$MAX_ATTEMPTS); the last ended: $last_end." \
          "The workdir keeps every checkpoint: rerun tpu/run.sh to go on." >&2
      exit 1
    fi
    attempt=$((attempt + 1))
    if [[ "$status" == "jbert-status exited"* ]]; then
      # What a failed run left: a process on another host still holds its TPU, and the start would be refused.
      on_all_workers "$(stop_command KILL)" >/dev/null 2>&1 || true
    fi
    if (( setup_needed )); then
      say "installing commit ${REVISION:0:12} on $TPU_NAME."
      if ! "$HERE/setup.sh"; then
        last_end="tpu/setup.sh failed"
        say "tpu/setup.sh failed (attempt $attempt of $MAX_ATTEMPTS)." >&2
        sleep "$POLL_S"
        continue
      fi
      setup_needed=0
    fi
    say "starting run.py on every host of $TPU_NAME (attempt $attempt of $MAX_ATTEMPTS)."
    if ! FOLLOW=0 "$HERE/train.sh" "$@"; then
      last_end="tpu/train.sh could not start it"
      say "tpu/train.sh could not start run.py (attempt $attempt of $MAX_ATTEMPTS)." >&2
      sleep "$POLL_S"
      continue
    fi
  fi
  unreachable=0
  ending=0
  while true; do
    sleep "$POLL_S"
    state="$(slice_state)" || continue
    if [[ "$state" != READY && "$state" != ACTIVE ]]; then
      last_end="the slice became $state"
      say "$TPU_NAME is $state during the run."
      break
    fi
    answer="$(run_status)"
    read -r _ what code stopped asked <<< "$(head -n 1 <<< "$answer")" || true
    case "${what:-}" in
      running) unreachable=0; ending=0; continue ;;
      "")
        unreachable=$((unreachable + 1))
        if (( unreachable >= 10 )); then
          say "worker 0 of $TPU_NAME did not answer ssh $unreachable times in a row while READY; check the" \
              "network route (SSH_FLAGS=--internal-ip or --tunnel-through-iap). The run may still be going." >&2
          exit 1
        fi
        continue ;;
      ending)
        ending=$((ending + 1))
        if (( ending < 3 )); then continue; fi
        last_end="run.py ended without an exit status"
        say "$last_end." ;;
      none) last_end="no run on the slice"; say "$last_end." ;;
      exited)
        sed -n 's/^jbert-log /    /p' <<< "$answer"
        if [[ "$code" == 0 && "$stopped" == 0 ]]; then
          say "run.py finished on $TPU_NAME after $attempt start(s); the results are in $WORKDIR."
          exit 0
        elif [[ "$asked" == 1 ]]; then  # whatever the status: a SIGTERM before run.py's handler is 143
          say "run.py stopped as tpu/stop.sh asked (exit status $code); rerun tpu/run.sh (the same command) to" \
              "resume."
          exit 0
        elif [[ "$code" == 2 ]]; then
          say "run.py refused its flags, config or data (exit status 2, the log's end above); a restart would" \
              "fail the same way: fix the command and rerun tpu/run.sh." >&2
          exit 2
        fi
        if [[ "$code" == 0 ]]; then
          last_end="run.py stopped (SIGTERM) with no stop asked for"
          say "$last_end."
          sleep "$POLL_S"  # a preemption's SIGTERM comes before the slice's state says PREEMPTED
        else
          last_end="run.py failed with exit status $code"
          say "$last_end."
        fi ;;
    esac
    break
  done
done
