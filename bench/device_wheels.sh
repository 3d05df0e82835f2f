#!/usr/bin/env bash
# Downloads, here (where pip reaches PyPI), the wheels of what jbert imports that a bare GPU image lacks, into
# .whl/ (git-ignored) beside the checkout, to carry to the machine that runs bench/device_check.py.
#
#   bench/device_wheels.sh                       # cp312 manylinux x86_64 wheels (the device image's python3.12)
#   PYTHON_VERSION=3.11 WHEEL_DIR=/tmp/w bench/device_wheels.sh   # another interpreter, another folder
#
# The image brings jax (+ CUDA plugin), flax, optax, orbax, torch, transformers, sentence-transformers and their
# dependencies; jbert's paths in device_check also import ml_collections, grain (with array_record, portpicker,
# cloudpickle, psutil), sentencepiece and sentencex, and the trainer tensorboardX. Only binary wheels, no
# dependencies resolved (the list is the whole set), versions as tested here. Prints the total, which must stay
# under the 64 MiB that travels with a working tree.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON_VERSION:-3.12}"
DEST="${WHEEL_DIR:-.whl}"
PACKAGES=(
  ml-collections==1.1.0 grain==0.2.18 array-record==0.8.6 portpicker==1.6.0 cloudpickle==3.1.3 psutil==7.2.2
  sentencepiece==0.2.3 sentencex==1.0.32 tensorboardX==2.6.5
)
rm -rf "$DEST"
mkdir -p "$DEST"
python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$DEST" \
  --python-version "$PY" --implementation cp --abi "cp${PY/./}" --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any "${PACKAGES[@]}" 2> >(grep -v "is ignored: it is neither" >&2)
bytes=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
ls -1 "$DEST"
echo "$(ls "$DEST"/*.whl | wc -l) wheels, $((bytes / 1024)) KiB in $DEST (limit 64 MiB)"
if (( bytes > 64 * 1024 * 1024 )); then
  echo "device_wheels.sh: the wheels exceed 64 MiB; drop what the image already has" >&2
  exit 1
fi
