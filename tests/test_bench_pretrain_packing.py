"""bench/pretrain_packing.py without training: the short documents, the commands' keys, the logged means."""
import json

from configs import tiny
import script_module

bench = script_module.load("bench/pretrain_packing.py")

TEXT = ("Header. Not this.\n*** START OF THIS PROJECT GUTENBERG EBOOK X ***\n"
        + "\n\n".join(f"First of {p}. Second of {p}!\nThird of {p}?" for p in range(30))
        + "\n*** END OF THIS PROJECT ***\nLicence. Not this either.")


def test_documents_are_the_bodys_sentences_in_order_one_to_three_each(tmp_path):
  documents = bench.short_documents(TEXT, seed=0)
  sentences = [s for d in documents for s in d]
  assert sentences == [f"{w} of {p}{end}" for p in range(30) for w, end in (("First", "."), ("Second", "!"),
                                                                               ("Third", "?"))]
  assert {len(d) for d in documents} == {1, 2, 3}
  assert documents == bench.short_documents(TEXT, seed=0)
  bench.write_corpus(documents, tmp_path / "c.txt")
  assert (tmp_path / "c.txt").read_text().split("\n\n")[0] == " ".join(documents[0])


def test_the_commands_name_keys_the_demo_config_has():
  config = tiny.get_config()
  settings = bench.settings("C", "V", 128, 32, 300, True, 0)
  for command in (bench.run_command("W", settings), bench.data_command(settings)):
    for key in (a.removeprefix("--config.").split("=")[0] for a in command if a.startswith("--config.")):
      node = config
      for part in key.split("."):
        node = node[part]
  assert settings["data.max_predictions_per_seq"] == "20" and settings["data.packing"] == "True"


def test_rates_are_weighted_by_the_steps_of_each_window(tmp_path):
  lines = [{"step": 10, "train/tokens_per_sec": 100.0, "train/padding_fraction": 0.5, "train/mfu": 0.1,
            "train/steps_per_sec": 1.0, "train/loss": 7.0},
           {"step": 20, "train/tokens_per_sec": 200.0, "train/padding_fraction": 0.2, "train/mfu": 0.2,
            "train/steps_per_sec": 2.0, "train/loss": 6.0}]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))
  means = bench.logged_means(tmp_path)  # steps 2-10 (the first step is left out), then 11-20
  assert means["tokens_per_sec"] == (9 * 100 + 10 * 200) / 19
  assert means["padding_fraction"] == (9 * 0.5 + 10 * 0.2) / 19 and means["final_loss"] == 6.0
