"""bench/data_pipeline.py end to end on a small generated text: every figure is there and the scratch is gone."""
import json
import pathlib
import subprocess
import sys

from bench_inputs import vocab_and_corpus

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_bench_measures_both_routes_and_cleans_up(tmp_path):
  vocab, corpus = vocab_and_corpus(tmp_path, repeats=40)
  scratch = tmp_path / "scratch"
  result = subprocess.run(
      [sys.executable, "bench/data_pipeline.py", f"--text={corpus}", f"--vocab={vocab}", "--sequences=200",
       "--prepare_mb=0.2", "--first_batch_mb=0.2,1", "--raw_first_batch_mb=0.2", f"--workdir={scratch}"],
      cwd=REPO, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads(result.stdout.strip().splitlines()[-1])
  assert sorted(report) == sorted([
      "raw_seq_per_sec_per_core_128", "raw_seq_per_sec_per_core_512", "raw_first_batch_seconds_0.2mb",
      "prepare_mb_per_sec_per_core", "prepared_seq_per_sec_per_core_128", "prepared_seq_per_sec_per_core_512",
      "first_batch_seconds_0.2mb", "first_batch_seconds_1mb"])
  assert all(0 < value < 1e6 for value in report.values()), report
  assert "prepared, max_seq_length=128:" in result.stdout and "1 MB prepared corpus" in result.stdout
  assert not scratch.exists()
