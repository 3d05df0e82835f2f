"""jbert.runtime.console: library INFO chatter hidden (warnings kept), Gloo's lines dropped at the file descriptor,
libtpu's environment for compile-only hosts."""
import logging
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from jbert.runtime import console

REPO = pathlib.Path(__file__).resolve().parents[1]
GLOO = b"[Gloo] Rank 1 is connected to 3 peer ranks. Expected number of connected peer ranks is : 3\n"


def test_jax_info_is_hidden_and_its_warnings_kept(monkeypatch):
  monkeypatch.setattr(logging.getLogger("jax"), "level", logging.NOTSET)
  monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
  console.quiet_library_logs()
  backend = logging.getLogger("jax._src.xla_bridge")  # "Unable to initialize backend 'tpu'" is its INFO
  assert not backend.isEnabledFor(logging.INFO) and backend.isEnabledFor(logging.WARNING)
  assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "1"  # TensorFlow's C++ INFO lines; its warnings stay


def _run(code: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, timeout=60)


def test_gloo_lines_written_by_native_code_are_dropped_and_the_rest_kept():
  # os.write goes to file descriptor 1 past sys.stdout, as Gloo's C++ std::cout does.
  result = _run(f"""
      import os, sys
      from jbert.runtime import console
      print("before", flush=True)
      line_filter = console.drop_gloo_lines()
      os.write(1, {GLOO!r})
      print("python line")
      sys.stdout.flush()
      os.write(1, b"native line\\n" + {GLOO!r} + b"[Gloo] something else\\n")
      os.write(1, b"unfinished")
      """)
  assert result.returncode == 0, result.stderr
  assert result.stdout == b"before\npython line\nnative line\n[Gloo] something else\nunfinished"


def test_close_restores_stdout_and_counts_what_was_dropped():
  result = _run(f"""
      import os
      from jbert.runtime import console
      line_filter = console.drop_gloo_lines()
      os.write(1, {GLOO!r} * 3 + b"kept\\n")
      line_filter.close()
      os.write(1, {GLOO!r})
      print(line_filter.dropped)
      """)
  assert result.stdout == b"kept\n" + GLOO + b"3\n"


@pytest.mark.parametrize("generation, chips, expected", [
    ("v4", 4, "v4-8"), ("v5p", 8, "v5p-16"), ("v5e", 4, "v5litepod-4"), ("v5e", 16, "v5litepod-16"),
    ("v6e", 8, "v6e-8"),
])
def test_accelerator_type_names_as_tpu_vms_report_them(generation, chips, expected):
  assert console.accelerator_type(generation, chips) == expected


def test_compile_only_host_is_described_without_overriding_and_only_while_libtpu_loads(monkeypatch):
  monkeypatch.delenv("TPU_ACCELERATOR_TYPE", raising=False)
  monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "t1k-w-0,t1k-w-1")
  with console.compile_only_host("v5e", 4):
    assert os.environ["TPU_ACCELERATOR_TYPE"] == "v5litepod-4"
    assert os.environ["TPU_WORKER_HOSTNAMES"] == "t1k-w-0,t1k-w-1"  # a value already there is the user's
  # Left set, they would make the rest of the process look like a TPU VM (jbert.distributed.on_cloud_tpu_vm).
  assert "TPU_ACCELERATOR_TYPE" not in os.environ and os.environ["TPU_WORKER_HOSTNAMES"] == "t1k-w-0,t1k-w-1"
  monkeypatch.delenv("TPU_WORKER_HOSTNAMES")
  with console.compile_only_host("v4", 4):
    assert os.environ["TPU_WORKER_HOSTNAMES"] == "localhost"
  assert "TPU_WORKER_HOSTNAMES" not in os.environ
  with pytest.raises(ValueError, match="unknown TPU generation 'v3'"):
    console.accelerator_type("v3", 4)
