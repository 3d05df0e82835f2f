"""tpu/pod_scale.py: a slice's row from the compiled step's report (the compile itself is tests/test_tpu_aot.py's)."""
import pytest

import script_module

pod = script_module.load("tpu/pod_scale.py")


def test_row_from_a_compiled_slice(monkeypatch):
  compiled = {}

  def fake_compile(config, topology, log, eval_step, hlo_dir):
    compiled.update(mesh=(config.mesh.data, config.mesh.fsdp), batch=config.batch_size,
                    dropout=config.model.attention_probs_dropout_prob, eval_step=eval_step)
    return {"total_gib": 7.5, "fits": True, "compile_s": 100.0, "attention": {"train": "splash"},
            "model_flops": 256 * 2e12, "collective_bytes_per_device": {"all-reduce": 0.5e9, "all-gather": 0.0}}

  monkeypatch.setattr(pod.aot_compile, "compile_train_step", fake_compile)
  monkeypatch.setattr(pod.aot_compile, "topology_devices", lambda topology: ([None] * 256, 16.0))
  row = pod.slice_row("base", "v5e:16x16", "fsdp", rows_per_chip=32, seq_len=128, global_batch=256)
  assert compiled == {"mesh": (1, -1), "batch": 32 * 256, "dropout": 0.0, "eval_step": False}
  # Per chip: the model's 2e12 FLOPs plus splash's 9 matmuls of 2 T^2 H per layer and row, at v5e's 197 TFLOP/s;
  # 0.5 GB of all-reduce at 200 GB/s of ICI.
  compute = (2e12 + 9 * 2 * 128 ** 2 * 768 * 12 * 32) / 197e12
  assert row["compute_ms"] == pytest.approx(compute * 1e3) and row["ici_ms"] == pytest.approx(2.5)
  assert row["weak"] == pytest.approx(compute / (compute + 2.5e-3))
  assert row["rows_90"] == pytest.approx(9 * 2.5e-3 / (compute / 32))  # 90% where compute = 9 x ICI
  one_row = compute / 32  # the paper's 256 sequences on 256 chips: one each
  assert row["batch_256"] == pytest.approx(one_row / (one_row + 2.5e-3))
  assert row["collectives"] == {"all-reduce": pytest.approx(0.5e9 / 2**30)}
  assert "| base | v5e:16x16 | 256 | fsdp | 7.50 | yes |" in "| " + pod.table([row]).splitlines()[2] + " |"
