#!/usr/bin/env bash
# Copies this checkout to every host of the TPU and installs jbert[tpu] in a virtualenv there.
#
#   TPU_NAME=jbert ZONE=us-central2-b tpu/setup.sh
#
# The committed tree is what is copied (git HEAD, or REVISION=<commit>): uncommitted changes and untracked files
# (a config edited here) are not, and setup.sh names them before it copies. jax needs Python >= 3.11 and the TPU
# images ship 3.10: each host takes PYTHON if set, else the first of python3.12 and python3.11 it has, else
# installs python3.11 with apt, from the deadsnakes PPA when the image's own archive lacks it; a host that still
# has none says so and setup.sh fails. jbert's install brings gcsfs and google-cloud-storage, so gs:// paths work
# without TensorFlow. With WORKDIR=gs://BUCKET/PATH set, every host also writes and deletes a probe object
# there: a VM whose service account cannot write the bucket is found now, not at the first checkpoint.
source "$(dirname "$0")/common.sh"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
REVISION="${REVISION:-HEAD}"
if ! COMMIT="$(git -C "$ROOT" rev-parse --short "$REVISION^{commit}" 2>/dev/null)"; then
  echo "tpu/setup.sh: REVISION=$REVISION is not a commit of the checkout in $ROOT." >&2
  exit 2
fi
CHANGED="$(git -C "$ROOT" status --porcelain --untracked-files=all | cut -c4-)"
if [[ -n "$CHANGED" && "$REVISION" == HEAD ]]; then
  count="$(grep -c . <<< "$CHANGED")"
  names="$(head -n 5 <<< "$CHANGED" | paste -sd, - | sed 's/,/, /g')"
  if (( count > 5 )); then names+=", ..."; fi
  echo "tpu/setup.sh: the checkout has $count uncommitted change(s), which the hosts will not get (only commit" \
       "$COMMIT is copied): $names; commit them first if a run needs them." >&2
fi
ARCHIVE="$(mktemp -d)/jbert.tar.gz"
trap 'rm -rf "$(dirname "$ARCHIVE")"' EXIT
git -C "$ROOT" archive --format=tar.gz -o "$ARCHIVE" "$COMMIT"
to_all_workers "$ARCHIVE"
want="${PYTHON:-}"
on_all_workers "set -e
  PY=
  for c in ${want:-python3.12 python3.11}; do
    if command -v \$c >/dev/null && \$c -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then PY=\$c; break; fi
  done
  if [ -z \"\$PY\" ]; then
    PY=${want:-python3.11}
    sudo apt-get update -qq || true
    if ! sudo apt-get install -y -qq \$PY \$PY-venv; then
      echo \"\$(hostname): apt has no \$PY; adding the deadsnakes PPA\"
      sudo apt-get install -y -qq software-properties-common && sudo add-apt-repository -y ppa:deadsnakes/ppa &&
        sudo apt-get update -qq && sudo apt-get install -y -qq \$PY \$PY-venv || true
    fi
    if ! command -v \$PY >/dev/null; then
      echo \"tpu/setup.sh: \$(hostname) has no Python >= 3.11 and apt could not install \$PY; install one there\" \
           \"and set PYTHON=its name (jax needs >= 3.11).\" >&2
      exit 4
    fi
  fi
  rm -rf ~/$REMOTE_DIR && mkdir -p ~/$REMOTE_DIR && tar xzf ~/jbert.tar.gz -C ~/$REMOTE_DIR
  if [ ! -x ~/$REMOTE_VENV/bin/python ]; then
    rm -rf ~/$REMOTE_VENV
    \$PY -m venv ~/$REMOTE_VENV ||
      { rm -rf ~/$REMOTE_VENV; sudo apt-get install -y -qq \$PY-venv; \$PY -m venv ~/$REMOTE_VENV; }
  fi
  . ~/$REMOTE_VENV/bin/activate && pip install -q -U pip && pip install -q -e ~/$REMOTE_DIR'[tpu]'
  python -c 'import jax; print(\"host\", jax.process_index(), \"sees\", jax.local_device_count(), jax.devices()[0].device_kind)'
  if [ -n \"${WORKDIR:-}\" ]; then
    python -c 'import socket, sys; from etils import epath; p = epath.Path(sys.argv[1]) / (\".setup_probe_\" + socket.gethostname()); p.write_text(\"ok\"); p.unlink(); print(\"writes\", sys.argv[1])' \"${WORKDIR:-}\" 2> ~/jbert_probe.err || {
      echo \"tpu/setup.sh: \$(hostname) cannot write ${WORKDIR:-} (\$(grep . ~/jbert_probe.err | tail -n 1));\" \
           \"let the TPU VM's service account write the bucket: BUCKET=gs://... tpu/bucket.sh\" >&2
      exit 5
    }
  fi"
report "installed commit $COMMIT on every host of $TPU_NAME; next: tpu/train.sh"
