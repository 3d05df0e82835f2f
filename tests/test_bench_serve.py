"""bench/serve.py end to end on a tiny model and corpus, short points: jbert.serve and sentence-transformers behind
the same app both served, agreed with jbert.embed, and each point's JSON is whole (infinity needs its own venv and
is skipped here; short inputs only: with this tiny vocabulary sentence-transformers 6 fails to batch the long ones,
a ValueError from its tokenizer; the numbers themselves are docs/performance.md's)."""
import json
import pathlib
import subprocess
import sys

from bench_inputs import vocab_and_corpus

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_bench_loads_both_servers_and_reports_each_point(tmp_path):
  vocab, corpus = vocab_and_corpus(tmp_path, repeats=20)
  result = subprocess.run(
      [sys.executable, "bench/serve.py", "--models=tiny_2x64", "--lengths=short", "--concurrency=1,4",
       "--seconds=1", "--systems=jbert,st,infinity", "--max_batch_tokens=512", f"--text={corpus}",
       f"--vocab={vocab}", "--port=18900"],
      cwd=REPO, capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "infinity skipped: no --infinity_python" in result.stderr
  report = json.loads(result.stdout.strip().splitlines()[-1])
  points = report["points"]
  assert report["seconds_per_point"] == 1.0 and report["cpu"]
  assert [(p["system"], p["inputs"], p["concurrency"]) for p in points] == [
      (s, "short", c) for c in (1, 4) for s in ("jbert", "st")]  # interleaved: each point for every system
  for p in points:
    assert p["requests"] > 0 and p["errors"] == 0 and p["first_error"] is None, p
    assert p["inputs_s"] > 0 and p["tokens_s"] >= p["inputs_s"] and p["p50_ms"] <= p["p99_ms"]
    assert p["cpu_ms_per_input"] > 0
    assert p["max_abs_diff"] <= 1e-5  # every system's embeddings are jbert.embed's
    assert p["load_before"] >= 0 and p["ready_s"] > 0
