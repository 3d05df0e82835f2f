#!/usr/bin/env bash
# Copies this checkout to every host of the TPU and installs jbert[tpu] in a virtualenv there.
#
#   TPU_NAME=jbert ZONE=us-central2-b tpu/setup.sh
#
# The committed tree (git HEAD) is what is copied: commit first. PYTHON (default python3.11) is installed with
# apt when the image lacks it, since jax needs Python >= 3.11 and the TPU images ship 3.10. jbert's install
# brings gcsfs and google-cloud-storage, so gs:// paths work without TensorFlow. With WORKDIR=gs://BUCKET/PATH set,
# every host also writes and deletes a probe object there: a VM whose service account cannot write the bucket
# is found now, not at the first checkpoint.
source "$(dirname "$0")/common.sh"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3.11}"
ARCHIVE="$(mktemp -d)/jbert.tar.gz"

git -C "$ROOT" archive --format=tar.gz -o "$ARCHIVE" HEAD
gcloud compute tpus tpu-vm scp "$ARCHIVE" "$TPU_NAME": --zone="$ZONE" "${PROJECT_FLAG[@]}" --worker=all
on_all_workers "set -e
  command -v $PYTHON >/dev/null || (sudo apt-get update -qq && sudo apt-get install -y -qq $PYTHON ${PYTHON}-venv)
  rm -rf ~/$REMOTE_DIR && mkdir -p ~/$REMOTE_DIR && tar xzf ~/jbert.tar.gz -C ~/$REMOTE_DIR
  [ -d ~/$REMOTE_VENV ] || $PYTHON -m venv ~/$REMOTE_VENV
  . ~/$REMOTE_VENV/bin/activate && pip install -q -U pip && pip install -q -e ~/$REMOTE_DIR'[tpu]'
  python -c 'import jax; print(\"host\", jax.process_index(), \"sees\", jax.local_device_count(), jax.devices()[0].device_kind)'
  if [ -n \"${WORKDIR:-}\" ]; then
    python -c 'import socket, sys; from etils import epath; p = epath.Path(sys.argv[1]) / (\".setup_probe_\" + socket.gethostname()); p.write_text(\"ok\"); p.unlink(); print(\"writes\", sys.argv[1])' \"${WORKDIR:-}\"
  fi"
echo "installed on every host of $TPU_NAME; next: tpu/train.sh"
