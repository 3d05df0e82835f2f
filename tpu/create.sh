#!/usr/bin/env bash
# Creates a Cloud TPU VM or pod slice, directly or through a queued resource (QUEUED=1).
#
#   TPU_NAME=jbert ZONE=us-central2-b ACCELERATOR=v4-32 [PROJECT=my-project] tpu/create.sh [--spot]
#   QUEUED=1 TPU_NAME=jbert ZONE=us-east5-b ACCELERATOR=v5p-16 tpu/create.sh --spot --valid-until-duration=6h
#
# Extra arguments go to `gcloud compute tpus tpu-vm create` (e.g. --spot, --network, --service-account), or with
# QUEUED=1 to `gcloud compute tpus queued-resources create` (--spot, --reserved, --valid-until-duration=6h,
# --best-effort with GCLOUD_TRACK=alpha). A queued resource is what v5e, v5p, v6e and spot capacity usually
# need: the request waits in the zone's queue until the slice can be provisioned. It is named TPU_NAME, like its
# node (the TPU VM the other scripts reach). create.sh then waits, printing each state, until it is ACTIVE (or
# FAILED or SUSPENDED: exit 1); WAIT=0 returns once the request is queued, POLL_S (default 30) spaces the looks.
# RUNTIME defaults to the software image Google recommends for the accelerator's generation.
source "$(dirname "$0")/common.sh"
: "${ACCELERATOR:?set ACCELERATOR, the TPU type and size (e.g. v4-8, v4-32, v5litepod-16, v5p-8, v6e-8)}"

if [[ -z "${RUNTIME:-}" ]]; then
  case "$ACCELERATOR" in
    v2-*|v3-*|v4-*) RUNTIME=tpu-ubuntu2204-base ;;
    v5litepod-*) RUNTIME=v2-alpha-tpuv5-lite ;;
    v5p-*) RUNTIME=v2-alpha-tpuv5 ;;
    v6e-*) RUNTIME=v2-alpha-tpuv6e ;;
    *) echo "tpu/create.sh: no default RUNTIME for ACCELERATOR=$ACCELERATOR; set RUNTIME (see" \
            "'gcloud compute tpus tpu-vm versions list --zone=$ZONE')." >&2; exit 2 ;;
  esac
fi

if [[ "${QUEUED:-0}" == 0 ]]; then
  tpus tpu-vm create "$TPU_NAME" --zone="$ZONE" "${PROJECT_FLAG[@]}" \
    --accelerator-type="$ACCELERATOR" --version="$RUNTIME" "$@"
  report "created $TPU_NAME ($ACCELERATOR, $RUNTIME); next: tpu/setup.sh"
  exit 0
fi

tpus queued-resources create "$TPU_NAME" --node-id="$TPU_NAME" --zone="$ZONE" "${PROJECT_FLAG[@]}" \
  --accelerator-type="$ACCELERATOR" --runtime-version="$RUNTIME" "$@"
if [[ "${WAIT:-1}" == 0 || "${DRY_RUN:-0}" != 0 ]]; then
  report "queued $TPU_NAME ($ACCELERATOR, $RUNTIME); 'gcloud compute tpus queued-resources describe $TPU_NAME" \
       "--zone=$ZONE' shows its state; once ACTIVE: tpu/setup.sh"
  exit 0
fi
last=""
while true; do
  state="$(slice_state)"
  if [[ "$state" != "$last" ]]; then echo "$(date -u +%FT%TZ) queued resource $TPU_NAME: $state"; last="$state"; fi
  case "$state" in
    ACTIVE) echo "created $TPU_NAME ($ACCELERATOR, $RUNTIME); next: tpu/setup.sh"; exit 0 ;;
    FAILED|SUSPENDED|NOT_FOUND)
      echo "tpu/create.sh: the queued resource $TPU_NAME is $state (no capacity within its time limits, or" \
           "preempted); 'gcloud compute tpus queued-resources describe $TPU_NAME --zone=$ZONE' says why;" \
           "tpu/delete.sh removes it before a new request." >&2
      exit 1 ;;
  esac
  sleep "${POLL_S:-30}"
done
