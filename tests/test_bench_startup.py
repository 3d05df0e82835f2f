"""bench/startup.py's embed part end to end on a tiny model: the second call into the same cache traces nothing
(its programs load as stored programs) and writes no cache file, each call's phases add up to its time, and the
JSON is whole. (The resume part runs run.py three times: timed in docs/performance.md, not here.)"""
import json
import pathlib
import subprocess
import sys

from bench_inputs import vocab_and_corpus

REPO = pathlib.Path(__file__).resolve().parents[1]
PHASES = ["start", "imports", "model", "tokenize", "programs", "trace", "run", "other", "exit"]


def test_embed_pairs_report_phases_and_a_second_call_that_traces_nothing(tmp_path):
  vocab, corpus = vocab_and_corpus(tmp_path, repeats=30)
  result = subprocess.run(
      [sys.executable, "bench/startup.py", f"--text={corpus}", f"--vocab={vocab}", "--texts=30", "--layers=1",
       "--hidden=32", "--heads=2", "--parts=embed"], cwd=REPO, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads(result.stdout.strip().splitlines()[-1])
  assert report["texts"] == 30 and report["model"] == "1x32" and "resume_speedup" not in report
  assert report["embed_no_cache_new_entries"] == 0
  # One shape (30 equal lines fill one packed batch): JAX's entry and jbert's stored program, each with its record.
  assert report["embed_first_traced"] == 1 and report["embed_first_new_entries"] == 4
  assert report["embed_second_traced"] == 0 and report["embed_second_stored"] == 1
  assert report["embed_second_new_entries"] == 0
  for name in ("no_cache", "first", "second"):
    phases = report[f"embed_{name}_phases"]
    assert sorted(phases) == sorted(PHASES) and all(v >= 0 for v in phases.values()), phases
    assert abs(sum(phases.values()) - report[f"embed_{name}_s"]) < 0.05  # the phases are the whole call
  assert report["embed_second_phases"]["trace"] == 0
  assert report["embed_ratios"] == [report["embed_second_s"] / report["embed_first_s"]] == [report["embed_ratio"]]
