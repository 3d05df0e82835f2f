"""bench/modernbert.py at toy sizes: the model folders both systems load, one long-context measurement per system
in this process, the jbert steps/s read off metrics.jsonl."""
import json

import jbert
import script_module

bench = script_module.load("bench/modernbert.py")


def test_the_model_folder_is_a_modernbert_both_systems_read_with_its_layer_kinds(tmp_path):
  folder = bench.make_model(tmp_path / "m", 3, None, 0, layer_types=bench.VARIANTS["local"])
  config = jbert.describe(str(folder)).config
  assert (config.model_type, config.num_hidden_layers, config.hidden_size, config.local_attention) == (
      "modernbert", 3, 384, 128)
  assert config.layer_types == ("sliding_attention",) * 3
  mixed = jbert.describe(str(bench.make_model(tmp_path / "x", 6, None, 0))).config
  assert mixed.layer_types == ("full_attention", "sliding_attention", "sliding_attention") * 2


def test_one_forward_backward_per_system_is_timed_and_sized(tmp_path):
  folder = bench.make_model(tmp_path / "m", 3, None, 0, layer_types=bench.VARIANTS["modernbert"])
  for system in bench.SYSTEMS:
    result = bench.long_child(dict(kind="long", system=system, model=str(folder), length=64, timed=1, threads=1))
    assert result["median_s"] > 0 and result["first_s"] > 0 and result["peak_rss_growth_mib"] >= 0
    assert ("xla_temp_mib" in result) == (system == "jbert")


def test_jbert_steps_per_second_is_the_median_of_the_logged_windows(tmp_path):
  rows = [{"step": 10, "train/steps_per_sec": 2.0}, {"step": 10, "eval/accuracy": 0.5},
          {"step": 20, "train/steps_per_sec": 4.0}, {"step": 30, "train/steps_per_sec": 3.0}]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  assert bench.jbert_steps_per_s(tmp_path) == 3.0
