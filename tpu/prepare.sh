#!/usr/bin/env bash
# Prepares a training corpus once with every host of the TPU: `python -m jbert.data prepare` on each, every host
# writing its own share of the shards (--num_hosts/--host_index from the TPU VM's metadata), host 0 then writing
# the manifest once every host's shards are done.
#
#   TPU_NAME=jbert ZONE=us-central2-b tpu/prepare.sh \
#       --input='gs://BUCKET/wikipedia/20231101.en/*.parquet' --output=gs://BUCKET/wiki --train_vocab=30522
#
# --output must be a gs:// path: every host writes there, and training reads it. Rerun the same command after an
# interruption (a dropped ssh, a preempted VM): the shards already written are kept. Each host logs to
# ~/jbert_prepare.log.
source "$(dirname "$0")/common.sh"
OUTPUT=""
for arg in "$@"; do
  case "$arg" in --output=*) OUTPUT="${arg#--output=}" ;; esac
done
if [[ "$OUTPUT" != gs://* ]]; then
  echo "tpu/prepare.sh: pass --output=gs://BUCKET/PATH (got '${OUTPUT}'): every host writes its shards there and" \
       "training reads them; hosts of a slice do not share a local disk." >&2
  exit 2
fi

ARGS="$(printf '%q ' "$@")"
META="http://metadata.google.internal/computeMetadata/v1/instance/attributes"
# agent-worker-number is this host's index; worker-network-endpoints lists every host of the slice.
on_all_workers "set -o pipefail; cd ~/$REMOTE_DIR && . ~/$REMOTE_VENV/bin/activate && \
  HOST=\$(curl -sf -H Metadata-Flavor:Google $META/agent-worker-number) && \
  HOSTS=\$(curl -sf -H Metadata-Flavor:Google $META/worker-network-endpoints | tr ',' '\n' | grep -c .) && \
  python -m jbert.data prepare $ARGS--num_hosts=\$HOSTS --host_index=\$HOST 2>&1 | tee ~/jbert_prepare.log"
