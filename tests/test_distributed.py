"""jbert.distributed: when jax.distributed is initialised, and with what (the real 2-process run is in
test_multiprocess.py)."""
import importlib.util
import json
import os

import jax
import pytest

from jbert import distributed


@pytest.fixture
def calls(monkeypatch):
  recorded = []
  monkeypatch.setattr(jax.distributed, "initialize", lambda **kwargs: recorded.append(kwargs))
  monkeypatch.setattr(jax.config, "update", lambda *args: recorded.append(args))
  return recorded


def _pretend(monkeypatch, *, libtpu, devices=(), hostnames=None):
  real_find_spec, real_exists = importlib.util.find_spec, os.path.exists
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: object() if name == "libtpu" and libtpu else
                      (None if name == "libtpu" else real_find_spec(name, *a)))
  monkeypatch.setattr(os.path, "exists", lambda p: p in devices or (not p.startswith("/dev/") and real_exists(p)))
  if hostnames is None:
    monkeypatch.delenv("TPU_WORKER_HOSTNAMES", raising=False)
  else:
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", hostnames)


def test_single_cpu_process_does_nothing(monkeypatch, calls):
  _pretend(monkeypatch, libtpu=False)
  assert distributed.initialize() is False and distributed.initialize(num_processes=1) is False
  assert calls == []


def test_named_processes_use_gloo_and_the_given_coordinator(monkeypatch, calls):
  _pretend(monkeypatch, libtpu=False)
  assert distributed.initialize("127.0.0.1:1234", 2, 1) is True
  assert calls == [("jax_cpu_collectives_implementation", "gloo"),
                   {"coordinator_address": "127.0.0.1:1234", "num_processes": 2, "process_id": 1}]


@pytest.mark.parametrize("devices,hostnames", [(("/dev/accel0",), None), (("/dev/vfio/0",), None),
                                               ((), "t1k-w-0,t1k-w-1")])
def test_tpu_vm_discovers_its_cluster(monkeypatch, calls, devices, hostnames):
  _pretend(monkeypatch, libtpu=True, devices=devices, hostnames=hostnames)
  assert distributed.on_cloud_tpu_vm() is True
  assert distributed.initialize() is True
  assert calls == [{}]  # No arguments: the metadata server / GKE environment names the cluster.


def test_cpu_host_with_libtpu_for_aot_is_not_a_tpu_vm(monkeypatch, calls):
  _pretend(monkeypatch, libtpu=True)
  assert distributed.on_cloud_tpu_vm() is False and distributed.initialize() is False and calls == []


@pytest.mark.parametrize("kwargs,message", [
    ({"num_processes": 2, "process_id": 0}, r"needs --coordinator_address=HOST:PORT and --process_id=0..1"),
    ({"coordinator_address": "h:1", "num_processes": 2, "process_id": 2}, r"process_id=2 must be in \[0, 2\)"),
])
def test_incomplete_flags_are_refused(calls, kwargs, message):
  with pytest.raises(ValueError, match=message):
    distributed.initialize(**kwargs)
  assert calls == []


def _argv_recorder(tmp_path):
  script = tmp_path / "record.py"
  script.write_text("import json, os, sys\n"
                    "i = sys.argv[-1].split('=')[1]\n"
                    "open(os.path.join(os.path.dirname(__file__), f'argv_{i}.json'), 'w').write(\n"
                    "    json.dumps([sys.argv[1:], os.environ['XLA_FLAGS']]))\n")
  return script


def test_launcher_passes_the_script_its_flags_and_each_process_its_place(tmp_path, monkeypatch):
  script = _argv_recorder(tmp_path)
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=5 --xla_cpu_use_onednn=false")
  assert distributed.main(["--num_processes=2", "--devices_per_process=3", "--", str(script), "--extra=1"]) == 0
  for i in range(2):
    argv, xla_flags = json.loads((tmp_path / f"argv_{i}.json").read_text())
    assert argv[0] == "--extra=1" and argv[1].startswith("--coordinator_address=127.0.0.1:")
    assert argv[2:] == ["--num_processes=2", f"--process_id={i}"]
    # Its own device count replaces the caller's; the caller's other XLA flags are kept.
    assert xla_flags == "--xla_cpu_use_onednn=false --xla_force_host_platform_device_count=3"
  # Without `--`, the first word that is not a launcher flag starts the command, flags after it included.
  assert distributed.main(["--num_processes=1", str(script), "--num_processes=7"]) == 0
  argv, _ = json.loads((tmp_path / "argv_0.json").read_text())
  assert argv[0] == "--num_processes=7" and argv[-2:] == ["--num_processes=1", "--process_id=0"]


@pytest.mark.parametrize("argv, message", [
    (["--num_processes=two", "--", "run.py"], "flag --num_processes=two: invalid literal for int()"),
    (["--num_processes=2"], "give the script to run after --"),
    (["--devices=4", "--", "run.py"], "Unknown command line flag 'devices'"),
])
def test_launcher_usage_errors(argv, message, capsys):
  assert distributed.main(argv) == 2
  err = capsys.readouterr().err
  assert err.startswith(f"python -m jbert.distributed: {message}") and "usage: python -m jbert.distributed" in err


SLURM = {"SLURM_JOB_ID": "4242", "SLURM_STEP_NODELIST": "gpu[007-008]", "SLURM_NTASKS": "16", "SLURM_PROCID": "11",
         "SLURM_LOCALID": "3"}
OPENMPI = {"OMPI_MCA_orte_hnp_uri": "1531576320.0;tcp://10.96.0.1:34911", "OMPI_COMM_WORLD_SIZE": "8",
           "OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_LOCAL_RANK": "5"}


def _cluster_env(monkeypatch, variables):
  for name in [v for vs, _ in distributed.CLUSTER_MANAGERS.values() for v in vs] + ["OMPI_COMM_WORLD_LOCAL_RANK"]:
    monkeypatch.delenv(name, raising=False)
  for name, value in variables.items():
    monkeypatch.setenv(name, value)


@pytest.mark.parametrize("variables,manager", [(SLURM, "slurm"), (OPENMPI, "openmpi"),
                                               ({**SLURM, "SLURM_NTASKS": "1"}, None),
                                               ({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, None)])
def test_gpu_cluster_managers_leave_discovery_to_jax(monkeypatch, calls, variables, manager):
  """srun / mpirun with several tasks: jax.distributed.initialize() without arguments; one task, or a lone
  Kubernetes pod (not an Indexed Job), is a single process."""
  _pretend(monkeypatch, libtpu=False)
  _cluster_env(monkeypatch, variables)
  assert distributed.cluster_manager() == manager
  assert distributed.initialize() is (manager is not None)
  assert calls == ([{}] if manager else [])


def test_jax_finds_the_slurm_job_and_gives_each_process_its_gpu(monkeypatch):
  """What jax.distributed.initialize() reads from the same fake srun task: the coordinator on the job's first
  node, 16 processes, this one's index, and the device of its local rank (one process per GPU)."""
  from jax._src import clusters  # pylint: disable=import-outside-toplevel
  _cluster_env(monkeypatch, SLURM)
  address, count, index, local_devices = clusters.ClusterEnv.auto_detect_unset_distributed_params(
      None, None, None, None, None, None)
  assert (address, count, index, local_devices) == (f"gpu007:{4242 % 4096 + 61440}", 16, 11, [3])


def test_explicit_flags_win_over_the_cluster_manager(monkeypatch, calls):
  _pretend(monkeypatch, libtpu=False)
  _cluster_env(monkeypatch, SLURM)
  assert distributed.initialize("10.0.0.2:1234", 2, 0) is True
  assert calls[-1] == {"coordinator_address": "10.0.0.2:1234", "num_processes": 2, "process_id": 0}


def test_kubernetes_indexed_job_needs_the_kubernetes_client(monkeypatch, calls):
  _pretend(monkeypatch, libtpu=False)  # find_spec("kubernetes") is the real one: not installed here
  _cluster_env(monkeypatch, {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "JOB_COMPLETION_INDEX": "2"})
  assert distributed.cluster_manager() == "kubernetes"
  with pytest.raises(ValueError, match=r"Kubernetes Indexed Job.*pip install 'jax\[k8s\]'"):
    distributed.initialize()
  assert calls == []
