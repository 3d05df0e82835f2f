"""bench/packed_inference.py end to end on a tiny model and corpus: both commands ran in both modes, from empty
compile caches, and agreed; the JSON is whole."""
import json
import pathlib
import subprocess
import sys

from bench_inputs import vocab_and_corpus

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_bench_times_both_commands_packed_and_bucketed(tmp_path):
  vocab, corpus = vocab_and_corpus(tmp_path, repeats=3)
  result = subprocess.run(
      [sys.executable, "bench/packed_inference.py", f"--text={corpus}", f"--vocab={vocab}", "--embed_sentences=40",
       "--predict_sentences=12", "--layers=1", "--hidden=64", "--repeats=1"],
      cwd=REPO, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr
  report = json.loads(result.stdout.strip().splitlines()[-1])
  assert set(report) == {"embed", "predict"}
  for name, count in (("embed", 40), ("predict", 12)):
    r = report[name]
    assert r["inputs"] == count and r["packed_s"] > 0 and r["bucketed_s"] > 0
    assert abs(r["speedup"] - r["bucketed_s"] / r["packed_s"]) < 1e-9
    assert r["max_abs_diff"] <= 1e-5  # packed and bucketed give the same outputs
    assert [len(r["runs"][m]) for m in ("packed", "bucketed")] == [1, 1]
