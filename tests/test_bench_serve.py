"""bench/serve.py end to end on a tiny model and corpus, short points: jbert.serve and sentence-transformers behind
the same app both served, agreed with jbert.embed, and each point's JSON is whole (infinity needs its own venv and
is skipped here; the numbers themselves are the README's)."""
import json
import pathlib
import subprocess
import sys

from bench_inputs import vocab_and_corpus

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_bench_loads_both_servers_and_reports_each_point(tmp_path):
  vocab, corpus = vocab_and_corpus(tmp_path, repeats=20)
  result = subprocess.run(
      [sys.executable, "bench/serve.py", "--models=tiny_2x64", "--lengths=short,long", "--concurrency=1,4",
       "--seconds=1", "--systems=jbert,st,infinity", "--max_batch_tokens=512", f"--text={corpus}",
       f"--vocab={vocab}", "--port=18900"],
      cwd=REPO, capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "infinity skipped: no --infinity_python" in result.stderr
  report = json.loads(result.stdout.strip().splitlines()[-1])
  points = report["points"]
  assert report["seconds_per_point"] == 1.0 and report["cpu"]
  assert [(p["system"], p["inputs"], p["concurrency"]) for p in points] == [
      (s, k, c) for s in ("jbert", "st") for k in ("short", "long") for c in (1, 4)]
  for p in points:
    assert p["requests"] > 0 and p["errors"] == 0, p
    assert p["inputs_s"] > 0 and p["tokens_s"] >= p["inputs_s"] and p["p50_ms"] <= p["p99_ms"]
    assert p["max_abs_diff"] <= 1e-5  # every system's embeddings are jbert.embed's
    assert p["load_before"] >= 0 and p["ready_s"] > 0
  assert points[0]["max_abs_diff"] == 0.0  # jbert.serve computes what jbert.embed computes, bit for bit
