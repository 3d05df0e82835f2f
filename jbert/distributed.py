"""Multi-process start-up: `jax.distributed` initialisation and a launcher for N local processes.

On TPU VMs, and on GPU clusters whose manager started one process per GPU (SLURM's `srun`, Open MPI's `mpirun`,
a Kubernetes Indexed Job), `jax.distributed.initialize()` finds the coordinator, process count and index by
itself. On CPU (and in tests) the contract's flags name them: `--coordinator_address=HOST:PORT --num_processes=N
--process_id=I`.

    python -m jbert.distributed --num_processes=2 --devices_per_process=4 -- \
        run.py --config=configs/tiny.py --workdir=/tmp/jbert_mp
"""
from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
from typing import Sequence

from absl import flags
import jax


def on_cloud_tpu_vm() -> bool:
  """True on a Cloud TPU VM (libtpu installed and a TPU device node present), where the cluster is discovered.

  GCE TPU VMs advertise their workers through the metadata server, GKE through TPU_WORKER_HOSTNAMES; in both
  cases `jax.distributed.initialize()` without arguments finds the coordinator, process count and index. A CPU
  host that merely has libtpu installed (for AOT compilation) has no device node and is not a TPU VM.
  """
  has_libtpu = importlib.util.find_spec("libtpu") is not None
  has_device = any(os.path.exists(p) for p in ("/dev/accel0", "/dev/vfio/0", "/dev/vfio/vfio"))
  return has_libtpu and (has_device or "TPU_WORKER_HOSTNAMES" in os.environ)


# The variables by which `jax.distributed.initialize()` recognises each cluster manager (jax._src.clusters), all
# of which must be set, and the one holding the process count. A Kubernetes pod counts as one of several
# processes only in an Indexed Job (JOB_COMPLETION_INDEX), the kind of job jax's discovery reads.
CLUSTER_MANAGERS = {
    "slurm": (("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID"),
              "SLURM_NTASKS"),
    "openmpi": (("OMPI_MCA_orte_hnp_uri", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"), "OMPI_COMM_WORLD_SIZE"),
    "kubernetes": (("KUBERNETES_SERVICE_HOST", "JOB_COMPLETION_INDEX"), None),
}


def cluster_manager() -> str | None:
  """The manager (slurm | openmpi | kubernetes) that started this process as one of several, or None.

  jax then discovers the coordinator, the process count and this process's index, and gives each process the
  GPU of its local rank (SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK): start one process per GPU. A SLURM or MPI
  job of a single task needs no cluster.
  """
  for name, (variables, count) in CLUSTER_MANAGERS.items():
    if all(v in os.environ for v in variables) and (count is None or int(os.environ[count]) > 1):
      return name
  return None


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> bool:
  """Initialises `jax.distributed` on a TPU VM, under a cluster manager (`cluster_manager`) or when several
  processes are named; else a no-op.

  Returns whether it initialised. On a single-host TPU VM this is a one-process cluster, which is harmless and
  lets Orbax use the same multi-host code paths everywhere.
  """
  explicit = num_processes is not None and num_processes > 1
  if explicit and (coordinator_address is None or process_id is None):
    raise ValueError(
        f"num_processes={num_processes} needs --coordinator_address=HOST:PORT and --process_id=0..{num_processes - 1}.")
  if explicit and not 0 <= process_id < num_processes:
    raise ValueError(f"process_id={process_id} must be in [0, {num_processes}).")
  if explicit:
    # CPU collectives across processes need an explicit implementation; the flag touches nothing else, and
    # asking for the backend here would initialise it too early for `jax.distributed`.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                               process_id=process_id)
    return True
  if on_cloud_tpu_vm():
    jax.distributed.initialize()
    return True
  manager = cluster_manager()
  if manager == "kubernetes" and importlib.util.find_spec("kubernetes") is None:
    raise ValueError("this pod is one of a Kubernetes Indexed Job, whose processes jax finds through the "
                     "Kubernetes API: pip install 'jax[k8s]' in the image (or pass --coordinator_address, "
                     "--num_processes and --process_id).")
  if manager is not None:
    jax.distributed.initialize()
    return True
  return False


def free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def launch_local(argv: Sequence[str], *, num_processes: int, devices_per_process: int = 1,
                 env: dict[str, str] | None = None, log_dir: str | None = None) -> list[subprocess.Popen]:
  """Starts `python ARGV... --coordinator_address=... --num_processes=N --process_id=I` N times.

  Each process sees `devices_per_process` simulated CPU devices. Returns the processes; the caller waits.
  Output of process I goes to `log_dir/process_I.log` when given, else is inherited.
  """
  port = free_port()
  procs = []
  for i in range(num_processes):
    proc_env = dict(os.environ if env is None else env)
    # The device count replaces any in XLA_FLAGS; the caller's other XLA flags are kept.
    kept = [f for f in proc_env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_")]
    proc_env["XLA_FLAGS"] = " ".join([*kept, f"--xla_force_host_platform_device_count={devices_per_process}"])
    proc_env.setdefault("JAX_PLATFORMS", "cpu")
    cmd = [sys.executable, *argv, f"--coordinator_address=127.0.0.1:{port}",
           f"--num_processes={num_processes}", f"--process_id={i}"]
    # The file stays open for the child's lifetime; the OS closes it when the process ends.
    out = open(os.path.join(log_dir, f"process_{i}.log"), "w") if log_dir else None  # pylint: disable=R1732
    procs.append(subprocess.Popen(cmd, env=proc_env, stdout=out, stderr=subprocess.STDOUT if out else None))
  return procs


PROG = "python -m jbert.distributed"
USAGE = f"usage: {PROG} [--num_processes=N] [--devices_per_process=D] [--log_dir=DIR] -- SCRIPT [FLAGS...]"
# Flags of their own (not absl's global FLAGS): the launched script's flags, after `--` or after the script's
# name, are passed on untouched, and `main(argv)` parses afresh on every call.
_FLAGS = flags.FlagValues()
_FLAGS.set_gnu_getopt(False)  # the first word that is not a flag starts the command
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", 2, "Processes to start.", lower_bound=1, flag_values=_FLAGS)
_DEVICES = flags.DEFINE_integer("devices_per_process", 4, "Simulated CPU devices of each process.", lower_bound=1,
                                flag_values=_FLAGS)
_LOG_DIR = flags.DEFINE_string("log_dir", None, "Write process_I.log files here instead of the console.",
                               flag_values=_FLAGS)


def main(argv: Sequence[str] | None = None) -> int:
  """Starts the command in `argv` (default: sys.argv[1:]) in N local processes; returns the worst exit code."""
  argv = sys.argv[1:] if argv is None else list(argv)
  if argv[:1] in (["-h"], ["--help"], ["--helpfull"]):
    own = ("num_processes", "devices_per_process", "log_dir")
    print("\n".join([__doc__.split("\n")[0], USAGE, *(f"  --{n}: {_FLAGS[n].help}" for n in own)]))
    return 0
  _FLAGS.unparse_flags()
  try:
    command = _FLAGS([PROG, *argv])[1:]
  except flags.Error as e:
    print(f"{PROG}: {e}\n{USAGE}", file=sys.stderr)
    return 2
  command = command[1:] if command[:1] == ["--"] else command
  if not command:
    print(f"{PROG}: give the script to run after --, e.g. -- run.py --config=configs/tiny.py --workdir=/tmp/w\n"
          f"{USAGE}", file=sys.stderr)
    return 2
  procs = launch_local(command, num_processes=_NUM_PROCESSES.value, devices_per_process=_DEVICES.value,
                       log_dir=_LOG_DIR.value)
  # Ctrl-C in the terminal reaches the children too (one process group): they finish the step, save and exit
  # (a second one aborts them), and the launcher waits for them instead of dying first with a traceback.
  previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
  try:
    codes = [p.wait() for p in procs]
  finally:
    signal.signal(signal.SIGINT, previous)
  return max(codes, key=abs)


if __name__ == "__main__":
  sys.exit(main())
