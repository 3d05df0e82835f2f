"""Which JAX platforms a process starts: libtpu installed on a machine without TPU chips is left out.

`pip install 'jbert[tpu]'` on a workstation is how a user compiles ahead of time for a TPU topology
(`tpu/aot_compile.py`), but JAX then initialises the TPU backend in every process on that machine: libtpu prints
its start-up failure ("could not determine TPU accelerator type", "Failed to find host bounds") on stderr before
the command has said anything, and holds /tmp/libtpu_lockfile, so two jbert commands on one workstation step on
each other. JAX already skips its CUDA backend when no NVIDIA device is visible; `skip_absent_tpu` does the same
for TPU, with JAX's own test (Google's PCI vendor id with a TPU device id), before JAX starts a backend. Compiling
for a TPU topology does not need the backend (`jax.experimental.topologies` loads libtpu itself), so it keeps
working. A user's own `JAX_PLATFORMS` (or `jax_platforms`) is never changed.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import sys
from typing import MutableMapping

_GOOGLE_PCI_VENDOR = "0x1ae0"
_TPU_PCI_DEVICES = ("0x0027", "0x0056", "0x005e", "0x0062", "0x0063", "0x006f", "0x0076")  # v2 ... tpu7x
_CUDA_PLUGINS = ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12")


def tpu_chips(sysfs: str = "/sys/bus/pci/devices") -> int:
  """TPU chips attached through PCI (jax._src.hardware_utils' test, without importing JAX)."""
  count = 0
  for vendor in glob.glob(os.path.join(sysfs, "*", "vendor")):
    try:
      with open(vendor, encoding="ascii") as f:
        if f.read().strip() != _GOOGLE_PCI_VENDOR:
          continue
      with open(os.path.join(os.path.dirname(vendor), "device"), encoding="ascii") as f:
        count += f.read().strip() in _TPU_PCI_DEVICES
    except (OSError, UnicodeDecodeError):
      continue
  return count


def _installed(module: str) -> bool:
  try:
    return importlib.util.find_spec(module) is not None
  except (ImportError, ValueError):
    return False


def skip_absent_tpu(environ: MutableMapping[str, str] = os.environ, sysfs: str = "/sys/bus/pci/devices") -> str | None:
  """Sets the platforms to those this machine can start (a CUDA plugin's, if one is installed, then the CPU) when
  libtpu is installed, no TPU chip is attached and nobody chose the platforms; returns what it set, else None."""
  if "JAX_PLATFORMS" in environ or not _installed("libtpu") or tpu_chips(sysfs):
    return None
  jax = sys.modules.get("jax") if environ is os.environ else None
  if jax is not None and jax.config.jax_platforms:  # chosen in code before jbert was imported
    return None
  # JAX skips a listed CUDA backend by itself when no NVIDIA device is visible.
  platforms = ",".join([*(["cuda"] if any(_installed(p) for p in _CUDA_PLUGINS) else []), "cpu"])
  environ["JAX_PLATFORMS"] = platforms
  if jax is not None:  # JAX read the variable at import: tell its config too
    jax.config.update("jax_platforms", platforms)
  return platforms
