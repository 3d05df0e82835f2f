"""bench/cpu_threads.py on a tiny model: both thread configurations measured in processes of their own, and one
XLA:CPU thread (jbert.serve's compute workers) gives the default pool's embeddings bit for bit."""
import json
import pathlib
import subprocess
import sys

from inference.tiny_models import random_torch_model, write_vocab

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_one_thread_embeds_bit_for_bit_what_the_default_pool_does(tmp_path):
  random_torch_model("BertModel", seed=3).save_pretrained(tmp_path / "model")
  write_vocab(tmp_path / "model")
  result = subprocess.run([sys.executable, "bench/cpu_threads.py", f"--model={tmp_path / 'model'}", "--inputs=6",
                           "--tokens=40", "--rounds=1", "--repeats=1"], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  points = json.loads(result.stdout.strip().splitlines()[-1])["points"]
  assert [p["config"] for p in points] == ["default pool", "one thread"]
  for p in points:
    assert p["bitwise_equal"] and p["cpu_ms_per_input"] > 0 and p["wall_ms_per_input"] > 0
