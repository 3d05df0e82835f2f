#!/usr/bin/env bash
# Makes the bucket the runs write to, and lets the TPU VM's service account write it.
#
#   TPU_NAME=jbert ZONE=us-central2-b BUCKET=gs://my-bucket [PROJECT=my-project] tpu/bucket.sh
#
# Creates the bucket when it does not exist, in the zone's region (the hosts read and write it without
# cross-region traffic) with uniform bucket-level access, then grants roles/storage.objectAdmin on it to the
# service account the TPU VM runs as (`tpu-vm describe`'s serviceAccount.email; SERVICE_ACCOUNT=EMAIL names it
# before the VM exists). Checkpoints, metrics, the compile cache and a prepared corpus all go there. Afterwards
# `WORKDIR=gs://BUCKET/run tpu/setup.sh` proves every host can write it. DRY_RUN=1 prints the gcloud commands.
source "$(dirname "$0")/common.sh"
: "${BUCKET:?set BUCKET=gs://NAME, the bucket checkpoints, metrics and the compile cache go to}"
BUCKET="gs://$(sed -E 's#^gs://##; s#/.*##' <<< "$BUCKET")"
REGION="${REGION:-${ZONE%-*}}"

if [[ "${DRY_RUN:-0}" == 0 ]] && gcloud storage buckets describe "$BUCKET" "${PROJECT_FLAG[@]}" \
    --format='value(name)' >/dev/null 2>&1; then
  echo "$BUCKET exists; leaving its location and settings as they are."
else
  run_gcloud storage buckets create "$BUCKET" "${PROJECT_FLAG[@]}" --location="$REGION" --uniform-bucket-level-access
fi
ACCOUNT="${SERVICE_ACCOUNT:-}"
if [[ -z "$ACCOUNT" && "${DRY_RUN:-0}" != 0 ]]; then
  ACCOUNT='$(gcloud compute tpus tpu-vm describe '"$TPU_NAME"' --format=value(serviceAccount.email))'
elif [[ -z "$ACCOUNT" ]]; then
  ACCOUNT="$(tpus tpu-vm describe "$TPU_NAME" --zone="$ZONE" "${PROJECT_FLAG[@]}" \
             --format='value(serviceAccount.email)')" || {
    echo "tpu/bucket.sh: could not read the service account of $TPU_NAME (see above); create the VM first" \
         "(tpu/create.sh) or name its account with SERVICE_ACCOUNT=EMAIL." >&2
    exit 1
  }
  if [[ -z "$ACCOUNT" ]]; then
    echo "tpu/bucket.sh: $TPU_NAME names no service account; set SERVICE_ACCOUNT=EMAIL (the project's default" \
         "compute account is PROJECT_NUMBER-compute@developer.gserviceaccount.com)." >&2
    exit 2
  fi
fi
# gcloud prints the bucket's whole policy after a binding; the line below says what changed.
POLICY_OUT=/dev/null
if [[ "${DRY_RUN:-0}" != 0 ]]; then POLICY_OUT=/dev/stdout; fi
run_gcloud storage buckets add-iam-policy-binding "$BUCKET" "${PROJECT_FLAG[@]}" \
  --member="serviceAccount:$ACCOUNT" --role=roles/storage.objectAdmin > "$POLICY_OUT"
report "$ACCOUNT may write $BUCKET; next: WORKDIR=$BUCKET/RUN tpu/setup.sh checks it from every host."
