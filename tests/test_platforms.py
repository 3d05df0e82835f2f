"""jbert.runtime.platforms: libtpu without TPU chips leaves JAX on the platforms the machine has."""
import subprocess
import sys

from jbert.runtime import platforms


def _pci(tmp_path, devices):
  for i, (vendor, device) in enumerate(devices):
    folder = tmp_path / f"0000:00:0{i}.0"
    folder.mkdir()
    (folder / "vendor").write_text(vendor + "\n")
    (folder / "device").write_text(device + "\n")
  return str(tmp_path)


def test_tpu_chips_are_counted_by_google_s_vendor_and_a_tpu_device_id(tmp_path):
  sysfs = _pci(tmp_path, [("0x1ae0", "0x0063"), ("0x1ae0", "0x0063"), ("0x1ae0", "0x1234"), ("0x10de", "0x0063")])
  assert platforms.tpu_chips(sysfs) == 2
  assert platforms.tpu_chips(str(tmp_path / "missing")) == 0


def test_libtpu_without_chips_starts_only_what_the_machine_has(tmp_path, monkeypatch):
  monkeypatch.setattr(platforms, "_installed", lambda module: module == "libtpu")
  no_tpu = _pci(tmp_path, [("0x10de", "0x2330")])
  environ = {}
  assert platforms.skip_absent_tpu(environ, sysfs=no_tpu) == "cpu" and environ == {"JAX_PLATFORMS": "cpu"}
  monkeypatch.setattr(platforms, "_installed", lambda module: module in ("libtpu", "jax_plugins.xla_cuda13"))
  environ = {}
  assert platforms.skip_absent_tpu(environ, sysfs=no_tpu) == "cuda,cpu"


def test_a_tpu_host_a_user_s_choice_or_no_libtpu_change_nothing(tmp_path, monkeypatch):
  monkeypatch.setattr(platforms, "_installed", lambda module: module == "libtpu")
  tpu_host = _pci(tmp_path, [("0x1ae0", "0x005e")])
  for environ, sysfs in (({}, tpu_host), ({"JAX_PLATFORMS": ""}, str(tmp_path / "none"))):
    before = dict(environ)
    assert platforms.skip_absent_tpu(environ, sysfs=sysfs) is None and environ == before
  monkeypatch.setattr(platforms, "_installed", lambda module: False)
  assert platforms.skip_absent_tpu({}, sysfs=str(tmp_path / "none")) is None


def test_importing_jbert_on_this_machine_keeps_libtpu_unloaded_and_topologies_compilable():
  """This machine has no TPU chip; when libtpu is installed (the test extra's jax[tpu]), JAX starts the CPU alone
  and says nothing, and a TPU topology still compiles ahead of time."""
  probe = ("import os; os.environ.pop('JAX_PLATFORMS', None); import jbert, jax; "
           "print(os.environ.get('JAX_PLATFORMS'), jax.default_backend()); "
           "from jax.experimental import topologies; "
           "print(topologies.get_topology_desc(platform='tpu', topology_name='v5e:2x2').devices[0].device_kind)")
  env = {k: v for k, v in __import__("os").environ.items() if k != "JAX_PLATFORMS"}
  result = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr
  assert result.stdout.splitlines() == ["cpu cpu", "TPU v5 lite"]
