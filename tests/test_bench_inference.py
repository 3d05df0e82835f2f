"""bench/inference.py end to end on a tiny model and corpus: both frameworks ran, agree, and the JSON is whole."""
import json
import pathlib
import subprocess
import sys

from bench_inputs import vocab_and_corpus

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_bench_runs_and_reports_per_model(tmp_path):
  vocab, corpus = vocab_and_corpus(tmp_path, repeats=3)
  result = subprocess.run(
      [sys.executable, "bench/inference.py", f"--text={corpus}", f"--vocab={vocab}", "--models=tiny_2x64",
       "--sentences=48", "--blocks=2", "--rounds=2", "--batch_size=8", "--max_length=32"],
      cwd=REPO, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr
  report = json.loads(result.stdout.strip().splitlines()[-1])
  tiny = report["tiny_2x64"]
  assert tiny["jbert_sent_s"] > 0 and tiny["torch_sent_s"] > 0
  assert abs(tiny["speedup_vs_torch"] - tiny["jbert_sent_s"] / tiny["torch_sent_s"]) < 1e-9
  assert tiny["max_abs_diff"] <= 1e-5  # The same weights and settings give the same embeddings.
  assert tiny["sentences"] == 96  # 2 timed rounds over the 48 sentences.
  assert tiny["jbert_first_pass_s"] > 0 and tiny["torch_first_pass_s"] > 0
  assert abs(tiny["first_pass_speedup_vs_torch"] - tiny["torch_first_pass_s"] / tiny["jbert_first_pass_s"]) < 1e-9
  lo, hi = tiny["jbert_block_range_sent_s"]
  assert lo <= tiny["jbert_block_median_sent_s"] <= hi
  # One model: the all-models summary is that model's numbers.
  assert abs(report["speedup_vs_torch"] - tiny["speedup_vs_torch"]) < 1e-9
