"""bench/device_check.py: the dry run goes through every part on CPU with a tiny model and reports real numbers;
its helpers (packing, batch sizes, the carried wheels) on their own."""
import json
import os
import pathlib
import subprocess
import sys
import zipfile

import numpy as np

import script_module

REPO = pathlib.Path(__file__).resolve().parents[1]
check = script_module.load("bench/device_check.py")


def test_dry_run_reports_every_part(tmp_path):
  env_out = tmp_path / "out"
  env_out.mkdir()
  proc = subprocess.run([sys.executable, "bench/device_check.py", "--dry_run", "--budget_s=400"], cwd=REPO,
                        capture_output=True, text=True, timeout=600, env={**os.environ, "OUT": str(env_out)},
                        check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  parts = result["parts"]
  assert not [name for name, part in parts.items() if "error" in part or "skipped" in part], parts
  assert result["device"] == "cpu" and result["dry_run"] is True
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
  rows = check.pack([100, 60, 30, 70, 20, 128], 128)
  assert rows == [[0, 4], [1, 2], [3], [5]]
  assert all(sum([100, 60, 30, 70, 20, 128][i] for i in row) <= 128 for row in rows)


def test_batch_for_memory_is_a_power_of_two_within_70_percent():
  gib = 2**30
  assert check.batch_for_memory(128, 80 * gib) == 256  # 0.7 * 80 / 0.11 = 509 rows
  assert check.batch_for_memory(512, 80 * gib) == 64
  assert check.batch_for_memory(512, 141 * gib) == 128
  lengths = check.row_lengths(128, 1000)
  assert lengths.min() >= 16 and lengths.max() <= 128 and abs(lengths.mean() / 128 - 0.56) < 0.03
  np.testing.assert_array_equal(lengths, check.row_lengths(128, 1000))  # both frameworks get the same


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
