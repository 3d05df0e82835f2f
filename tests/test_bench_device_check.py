"""bench/device_check.py: the dry run goes through every part on CPU with a tiny model and reports real numbers
for every figure; an empty figure fails the check; its helpers (packing, batch sizes in bench/device_shapes.py,
the carried wheels) on their own."""
import json
import os
import pathlib
import subprocess
import sys
import types
import zipfile

import numpy as np
import pytest

import script_module

REPO = pathlib.Path(__file__).resolve().parents[1]
check = script_module.load("bench/device_check.py")
shapes = script_module.load("bench/device_shapes.py")


def test_dry_run_reports_every_part(tmp_path):
  env_out = tmp_path / "out"
  env_out.mkdir()
  proc = subprocess.run([sys.executable, "bench/device_check.py", "--dry_run"], cwd=REPO,
                        capture_output=True, text=True, timeout=600, env={**os.environ, "OUT": str(env_out)},
                        check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  parts = result["parts"]
  assert not [name for name, part in parts.items() if "error" in part or "skipped" in part], parts
  assert result["device"] == "cpu" and result["dry_run"] is True
  # Every headline figure, both lengths, both frameworks: the dry run has no time budget to cut a part with.
  assert result["missing"] == {}
  assert all(v > 0 for k in ("128", "512") for v in (*result["jbert_seq_per_s"][k].values(),
                                                      *result["mfu"][k].values(), result["torch_seq_per_s"][k],
                                                      result["compile_s"][k]))
  assert parts["pretrain"]["512_padded"]["batch"] == parts["torch"]["pretrain_512"]["batch"] == 4
  # fp32 parity with transformers, padded rows and packed ones, on the same random weights.
  assert result["parity_max_abs_diff"] <= 1e-5 and result["parity_packed_max_abs_diff"] <= 1e-5
  padded, packed = parts["pretrain"]["128_padded"], parts["pretrain"]["128_packed"]
  assert padded["sequences"] == padded["batch"] == 8 and packed["batch"] == 8
  assert packed["sequences"] > padded["sequences"]  # the same rows hold more sequences packed
  assert packed["padding_fraction"] < padded["padding_fraction"]
  assert result["jbert_seq_per_s"]["128"]["padded"] > 0 and result["torch_seq_per_s"]["128"] > 0
  assert 0 < result["mfu"]["128"]["padded"] < 1 and result["compile_s"]["128"] > 0
  assert all(v > 0 for v in result["finetune_steps_per_s"].values())
  # The kernels each step ran: no attention dropout takes the platform's fused one (XLA's on CPU; cuDNN on GPU);
  # the fine-tuning recipe's attention dropout takes einsum.
  assert padded["attention"] == packed["attention"] == parts["finetune"]["fast"]["attention"] == "xla"
  assert parts["finetune"]["recipe"]["attention"] == "einsum"
  # bf16 embeddings of both libraries from the same folder agree to bf16's precision.
  assert parts["embed"]["min_cosine"] > 0.999 and all(v > 0 for v in result["embed_sentences_per_s"].values())
  # Each part's JSON also went to $OUT as it ended: a check cut short keeps what it measured.
  logged = [json.loads(line) for line in (env_out / "device_check.jsonl").read_text().splitlines()]
  assert [next(iter(entry)) for entry in logged] == ["torch", "parity", "pretrain", "finetune", "embed"]


def test_first_fit_packing():
  rows = shapes.pack([100, 60, 30, 70, 20, 128], 128)
  assert rows == [[0, 4], [1, 2], [3], [5]]
  assert all(sum([100, 60, 30, 70, 20, 128][i] for i in row) <= 128 for row in rows)


def test_batch_for_memory_is_a_power_of_two_within_70_percent():
  gib = 2**30
  assert shapes.batch_for_memory(128, 80 * gib) == 256  # 0.7 * 80 / 0.11 = 509 rows
  assert shapes.batch_for_memory(512, 80 * gib) == 64
  assert shapes.batch_for_memory(512, 141 * gib) == 128
  lengths = shapes.row_lengths(128, 1000)
  assert lengths.min() >= 16 and lengths.max() <= 128 and abs(lengths.mean() / 128 - 0.56) < 0.03
  np.testing.assert_array_equal(lengths, shapes.row_lengths(128, 1000))  # both frameworks get the same


def test_carried_wheels_are_unpacked_and_importable(tmp_path, monkeypatch):
  wheels = tmp_path / ".whl"
  wheels.mkdir()
  with zipfile.ZipFile(wheels / "carried_pkg-1.0-py3-none-any.whl", "w") as z:
    z.writestr("carried_pkg/__init__.py", "VALUE = 42\n")
  monkeypatch.setattr(check, "CARRIED", ("carried_pkg",))
  monkeypatch.setattr(sys, "path", list(sys.path))
  assert check.bootstrap(wheels) == []
  import carried_pkg  # pylint: disable=import-outside-toplevel,import-error
  assert carried_pkg.VALUE == 42 and (wheels / "site" / "carried_pkg").is_dir()
  monkeypatch.setattr(check, "CARRIED", ("carried_pkg", "not_carried_anywhere"))
  assert check.bootstrap(wheels) == ["not_carried_anywhere"]


class _Clock:
  """device_check's time.perf_counter, advanced by the fake parts: a part's cost without sleeping."""

  def __init__(self):
    self.now = 1000.0

  def perf_counter(self):
    return self.now


def _fake_parts(clock, pretrain_s=0.0, broken=()):
  """A device_parts module whose Work returns every figure at once, takes `pretrain_s` on the clock for pretrain,
  and raises in the parts named in `broken`: main's handling of the result, without JAX or PyTorch."""

  class Work:
    def __init__(self, tmp, sizes, dry_run):
      self.lengths = sizes["lengths"]

    def _part(self, name, value):
      if name in broken:
        raise RuntimeError(f"{name} broke: CUDNN_STATUS_EXECUTION_FAILED")
      return value

    def run_torch(self, seconds):
      return self._part("torch", {**{f"pretrain_{k}": {"seq_per_s": 10.0} for k in self.lengths},
                                  "finetune": {"steps_per_s": 2.0}, "embed": {"sentences_per_s": 100.0}})

    def parity(self, deadline):
      return self._part("parity", {"device": "fake", "parity_max_abs_diff": 1e-6, "parity_packed_max_abs_diff": 2e-6})

    def pretrain(self, deadline):
      clock.now += pretrain_s
      return self._part("pretrain", {f"{k}_{r}": {"seq_per_s": 5.0, "mfu": 0.3, "compile_s": 1.5}
                                     for k in self.lengths for r in ("padded", "packed")})

    def finetune(self, deadline):
      return self._part("finetune", {"recipe": {"steps_per_s": 3.0}, "fast": {"steps_per_s": 4.0}})

    def embed(self, deadline):
      return self._part("embed", {"sentences_per_s": 50.0})

  return types.SimpleNamespace(Work=Work)


@pytest.fixture
def fake_main(tmp_path, monkeypatch, capsys):
  """main(argv) against fake parts: (exit status, the result's JSON, stderr's last line, the parts' JSONL)."""
  monkeypatch.setattr(sys, "path", list(sys.path))
  monkeypatch.setenv("JAX_PLATFORMS", os.environ.get("JAX_PLATFORMS", "cpu"))
  monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")
  monkeypatch.setenv("OUT", str(tmp_path))
  clock = _Clock()
  monkeypatch.setattr(check, "time", clock)

  def call(argv, **kwargs):
    monkeypatch.setitem(sys.modules, "device_parts", _fake_parts(clock, **kwargs))
    status = check.main(argv)
    out, err = capsys.readouterr()
    logged = [json.loads(line) for line in (tmp_path / "device_check.jsonl").read_text().splitlines()]
    (tmp_path / "device_check.jsonl").unlink()
    return status, json.loads(out.strip().splitlines()[-1]), err.strip().splitlines()[-1], logged

  return call


def test_every_figure_present_exits_0(fake_main):
  status, result, _, logged = fake_main(["--dry_run"])
  assert status == 0 and result["missing"] == {}
  assert result["jbert_seq_per_s"] == {"128": {"padded": 5.0, "packed": 5.0}, "512": {"padded": 5.0, "packed": 5.0}}
  assert result["torch_seq_per_s"] == {"128": 10.0, "512": 10.0} and result["compile_s"] == {"128": 1.5, "512": 1.5}
  assert result["finetune_steps_per_s"] == {"jbert": 3.0, "jbert_fast": 4.0, "torch": 2.0}
  assert result["embed_sentences_per_s"] == {"jbert": 50.0, "sentence_transformers": 100.0}
  assert [next(iter(entry)) for entry in logged] == ["torch", "parity", "pretrain", "finetune", "embed"]


def test_a_failed_part_leaves_its_figures_empty_and_fails_the_check(fake_main):
  status, result, line, logged = fake_main(["--dry_run"], broken=("finetune",))
  assert status == 1
  cause = "finetune: RuntimeError: finetune broke: CUDNN_STATUS_EXECUTION_FAILED"
  assert result["missing"] == {"finetune_steps_per_s.jbert": cause, "finetune_steps_per_s.jbert_fast": cause}
  assert result["finetune_steps_per_s"] == {"jbert": None, "jbert_fast": None, "torch": 2.0}
  assert line == (f"device_check: 2 figures empty: finetune_steps_per_s.jbert, finetune_steps_per_s.jbert_fast "
                  f"({cause}). What was measured is in the JSON above and each part's line.")
  # The other parts ran and were logged as they ended; the one after the failure too.
  assert result["embed_sentences_per_s"]["jbert"] == 50.0
  assert [next(iter(entry)) for entry in logged] == ["torch", "parity", "pretrain", "finetune", "embed"]

  status, result, line, _ = fake_main(["--dry_run"], broken=("torch",))  # PyTorch's figures, and only them
  assert status == 1 and set(result["missing"]) == {"torch_seq_per_s.128", "torch_seq_per_s.512",
                                                    "finetune_steps_per_s.torch",
                                                    "embed_sentences_per_s.sentence_transformers"}
  assert "4 figures empty" in line and "(torch: RuntimeError: torch broke" in line


def test_parts_cut_by_the_device_budget_fail_the_check(fake_main):
  # 20 s: PyTorch and parity run, pretrain takes 12 s of the clock, finetune and embed find under 10 s left.
  status, result, line, logged = fake_main(["--budget_s=20"], pretrain_s=12.0)
  assert status == 1 and result["dry_run"] is False
  assert result["missing"] == {"finetune_steps_per_s.jbert": "finetune: skipped, time budget",
                               "finetune_steps_per_s.jbert_fast": "finetune: skipped, time budget",
                               "embed_sentences_per_s.jbert": "embed: skipped, time budget"}
  assert result["jbert_seq_per_s"]["512"]["packed"] == 5.0
  assert logged[-2:] == [{"finetune": {"skipped": "time budget"}}, {"embed": {"skipped": "time budget"}}]
  assert line.startswith("device_check: 3 figures empty: ") and "(finetune: skipped, time budget)" in line


@pytest.mark.parametrize("argv,message", [
    (["--dry_run", "--budget_s=100"], "--budget_s is for the device run: --dry_run runs every part to the end"),
    (["--budget_s=soon"], "--budget_s=soon: pass a number of seconds above 0"),
    (["--budget_s=0"], "--budget_s=0: pass a number of seconds above 0"),
    (["--dry-run"], "unknown argument '--dry-run': device_check takes --dry_run and --budget_s=SECONDS")])
def test_bad_arguments_are_one_line_and_exit_2(argv, message, capsys):
  assert check.main(argv) == 2
  out, err = capsys.readouterr()
  assert out == "" and err.startswith(f"device_check: {message}") and err.count("\n") == 1
