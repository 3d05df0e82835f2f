#!/usr/bin/env bash
# Deletes the TPU VM or slice; with QUEUED=1 its queued resource, and the node with it (--force).
#
#   TPU_NAME=jbert ZONE=us-central2-b tpu/delete.sh   # FORCE=1: at once, without looking for a run to stop
#
# A run still going is first stopped as tpu/stop.sh stops it (SIGTERM: the step finishes, a checkpoint is saved,
# run.py exits), so deleting a slice loses no training. A slice that is not READY (preempted, still queued) has
# nothing to stop. The workdir in the bucket is not touched: the same tpu/train.sh command resumes on a new slice.
source "$(dirname "$0")/common.sh"
if [[ "${DRY_RUN:-0}" != 0 ]]; then
  state=READY
elif [[ "${FORCE:-0}" != 0 ]]; then
  state=""  # not looked at
else
  state="$(slice_state)"
fi
if [[ "$state" == NOT_FOUND ]]; then
  echo "tpu/delete.sh: there is no $([[ "${QUEUED:-0}" == 0 ]] && echo "TPU VM" || echo "queued resource")" \
       "$TPU_NAME in $ZONE; nothing to delete."
  exit 0
fi
if [[ "${FORCE:-0}" == 0 && ( "$state" == READY || "$state" == ACTIVE ) ]]; then
  if ! on_all_workers "$(stop_command TERM)"; then
    echo "tpu/delete.sh: could not reach every host of $TPU_NAME to stop its run (ssh failed; see above), so" \
         "nothing was deleted; FORCE=1 tpu/delete.sh deletes it anyway (training since the last checkpoint is" \
         "lost)." >&2
    exit 1
  fi
fi
if [[ "${QUEUED:-0}" == 0 ]]; then
  tpus tpu-vm delete "$TPU_NAME" --zone="$ZONE" "${PROJECT_FLAG[@]}" --quiet
else
  tpus queued-resources delete "$TPU_NAME" --zone="$ZONE" "${PROJECT_FLAG[@]}" --force --quiet
fi
report "deleted $TPU_NAME${state:+ (it was $state)}; the workdir in the bucket keeps every checkpoint."
