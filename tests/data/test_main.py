"""`python -m jbert.data`: decoded examples with visible masks, and the statistics line."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
  root = tmp_path_factory.mktemp("cli")
  path = root / "small.py"
  path.write_text(f'''
import ml_collections
from jbert.data import config as data_config

def get_config():
  config = ml_collections.ConfigDict()
  config.seed = 0
  config.batch_size = 32
  config.data = data_config.default_pretrain_config()
  config.data.synthetic_dir = {str(root / "synthetic")!r}
  config.data.max_seq_length = 64
  config.data.max_predictions_per_seq = 10
  return config
''')
  return path


def run(*args) -> str:
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  result = subprocess.run([sys.executable, "-m", "jbert.data", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout


def test_show_and_stats(config_file):
  out = run(f"--config={config_file}", "--show=3", "--stats", "--batches=60")
  examples = [line for line in out.splitlines() if line.startswith(("IsNext: ", "NotNext: "))]
  assert len(examples) == 3
  for example in examples:
    tokens = example.split(": ", 1)[1].split(" ")
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and tokens.count("[SEP]") == 2
  assert any("[MASK→" in e for e in examples)
  stats = json.loads(out.strip().splitlines()[-1])
  assert stats["sequences"] == 61 * 32
  assert stats["masked_fraction"] == pytest.approx(0.15, abs=0.01)
  assert stats["mask_token_fraction"] == pytest.approx(0.8, abs=0.03)
  assert stats["random_token_fraction"] == pytest.approx(0.1, abs=0.03)
  assert stats["kept_fraction"] == pytest.approx(0.1, abs=0.03)
  shares = stats["mask_token_fraction"] + stats["random_token_fraction"] + stats["kept_fraction"]
  assert shares == pytest.approx(1)
  # Short generated stories end in one-sentence chunks, whose B is always random (as in BERT): below 1/2.
  assert 0.3 < stats["nsp_positive_fraction"] < 0.55
  # What one process makes per second from the text: thousands, not the millions that timing slices of batches
  # already made ahead reported.
  assert 100 < stats["sequences_per_sec"] < 100_000
  assert 0 < stats["first_batch_seconds"] < 60


def test_usage_errors(config_file):
  result = subprocess.run([sys.executable, "-m", "jbert.data", f"--config={config_file}"], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == ["jbert.data: Nothing to do: pass --show=N and/or --stats."]
