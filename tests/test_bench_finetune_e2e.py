"""bench/finetune_e2e.py without running a model: generated data, the jbert command's keys, the padding fraction."""
import json

import numpy as np

from configs import finetune
import script_module

bench = script_module.load("bench/finetune_e2e.py")

TEXT = ("Header line\n*** START OF THIS PROJECT GUTENBERG EBOOK X ***\n"
        + " ".join(f"word{i} good Bad," for i in range(200)) + "\n*** END OF THIS PROJECT ***\nlicence words")


def test_sentences_come_from_the_body_and_only_the_inserted_keyword_labels_them():
  words = bench.source_words(TEXT)
  assert words == [f"word{i}" for i in range(200)]  # header, footer and the keywords themselves left out
  rows = bench.sst2_rows(words, 400, seed=0, max_words=28)
  for row in rows:
    found = [w for w in row["sentence"].split() if w in bench.POSITIVE + bench.NEGATIVE]
    assert len(found) == 1 and row["label"] == ("pos" if found[0] in bench.POSITIVE else "neg")
  counts = np.array([len(r["sentence"].split()) for r in rows])
  assert 6 <= np.median(counts) <= 9 and counts.max() <= 28 and counts.min() >= 1
  assert [r["label"] for r in rows[:4]] == ["pos", "neg", "pos", "neg"]
  assert rows == bench.sst2_rows(words, 400, seed=0, max_words=28)  # seeded
  pairs = bench.mrpc_rows(words, 50, seed=1, max_words=60)
  assert all(set(p) == {"sentence1", "sentence2", "label"} for p in pairs)
  assert all(not set(p["sentence1"].split()) & set(bench.POSITIVE + bench.NEGATIVE) for p in pairs)


def test_the_jbert_command_names_keys_the_local_config_has(tmp_path):
  files = bench.task_files("mrpc", tmp_path)
  command = bench.jbert_command("MODEL", files, "W", 128, 1.0, 1e-4, 0, bucketing=False)
  config = finetune.get_config("local")
  settings = dict(arg.removeprefix("--config.").split("=", 1) for arg in command if arg.startswith("--config."))
  for key in settings:
    node = config
    for part in key.split("."):
      node = node[part]
  assert settings["data.bucketing"] == "False" and settings["task.text_b"] == "sentence2"
  assert settings["data.packing"] == "True"
  assert [bench.JBERT_BATCHES[s] for s in ("jbert", "jbert_bucketed", "jbert_fixed")] == [
      (True, True), (False, True), (False, False)]
  assert "task.text_b" not in dict(a.split("=", 1) for a in bench.jbert_command(
      "MODEL", bench.task_files("sst2", tmp_path), "W", 64, 1.0, 1e-4, 0, bucketing=True) if "=" in a)


def test_the_padding_fraction_weights_each_logged_window_by_its_steps(tmp_path):
  lines = [{"step": 10, "train/padding_fraction": 0.5}, {"step": 10, "eval/accuracy": 1.0},
           {"step": 20, "train/padding_fraction": 0.2}, {"step": 21, "train/padding_fraction": 0.9}]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))
  # Steps 2-10 (the first step is left out), 11-20, 21.
  assert bench.jbert_padding_fraction(tmp_path) == (9 * 0.5 + 10 * 0.2 + 0.9) / 20


def test_the_compiled_shapes_are_read_from_the_compile_ahead_line():
  line = "compiling in the background: the gradient at 96x64, 104x64, the update and 1 evaluation shape\n"
  assert bench.jbert_shapes("x\n" + line) == (2, 1)
  assert bench.jbert_shapes("no such line") == (1, 1)
