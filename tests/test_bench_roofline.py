"""bench/roofline.py end to end on the tiny preset: the bounds follow from the measured peak and FLOPs."""
import json
import pathlib
import subprocess
import sys

from jbert.runtime import flops
from jbert.model import BertConfig

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_roofline_bounds_follow_from_peak_and_flops():
  result = subprocess.run([sys.executable, "bench/roofline.py", "--preset=tiny", "--batch=4", "--seq=16",
                           "--repeats=1"], cwd=REPO, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr
  r = json.loads(result.stdout.strip().splitlines()[-1])
  config = BertConfig.from_preset("tiny")
  forward = flops.forward_flops(config, batch_size=4, seq_len=16, num_masked=0, nsp=False)
  assert abs(r["forward_gflop"] - forward / 1e9) < 1e-12
  peak = max(r["jax_matmul_gflop_s"], r["torch_matmul_gflop_s"]) * 1e9
  assert abs(r["forward_bound_s"] - forward / peak) <= 1e-9 * r["forward_bound_s"]
  assert abs(r["train_step_bound_s"] - 3 * r["forward_bound_s"]) <= 1e-9 * r["train_step_bound_s"]
  assert abs(r["max_speedup_vs_torch_forward"] * r["torch_fraction_of_bound"] - 1) < 1e-9
  assert abs(r["torch_fraction_of_bound"] - r["forward_bound_s"] / r["torch_forward_s"]) < 1e-9


def test_embedding_bounds_on_sentences_of_one_length(tmp_path):
  from inference.tiny_models import write_vocab  # pylint: disable=g-import-not-at-top
  from tokenizers import BertWordPieceTokenizer  # pylint: disable=g-import-not-at-top
  vocab = write_vocab(tmp_path)
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("The cat sat on the mat. " * 12, encoding="utf-8")
  result = subprocess.run([sys.executable, "bench/roofline.py", "--preset=tiny", "--batch=4", "--seq=16",
                           "--repeats=1", "--embeddings", f"--text={corpus}", f"--vocab={vocab}", "--sentences=10",
                           "--batch_size=4"], cwd=REPO, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr
  r = json.loads(result.stdout.strip().splitlines()[-1])
  length = len(BertWordPieceTokenizer(str(vocab), lowercase=True).encode("The cat sat on the mat.").ids)
  assert r["tokens"] == r["padded_tokens"] == 10 * length  # One length: nothing to pad.
  peak = max(r["jax_matmul_gflop_s"], r["torch_matmul_gflop_s"]) * 1e9
  for name, (layers, hidden) in {"minilm_6x384": (6, 384), "bert_base": (12, 768)}.items():
    config = BertConfig(num_hidden_layers=layers, hidden_size=hidden, intermediate_size=4 * hidden)
    per_sentence = flops.forward_flops(config, batch_size=1, seq_len=length, num_masked=0, nsp=False)
    assert abs(r[f"{name}_bound_sent_s"] - peak / per_sentence) <= 1e-9 * r[f"{name}_bound_sent_s"]
