"""bench/distill.py without running a model: the SST-2-like rows' labels are the majority of their keywords."""
import numpy as np

import script_module

bench = script_module.load("bench/distill.py")
e2e = script_module.load("bench/finetune_e2e.py")

TEXT = ("Header line\n*** START OF THIS PROJECT GUTENBERG EBOOK X ***\n"
        + " ".join(f"word{i} good Bad," for i in range(200)) + "\n*** END OF THIS PROJECT ***\nlicence words")


def test_labels_are_the_majority_of_one_or_three_keywords_and_noise_flips_its_share():
  words = e2e.source_words(TEXT)
  rows = bench.sentiment_rows(words, 2000, seed=0, max_words=28)
  counts = []
  for row in rows:
    found = [w for w in row["sentence"].split() if w in e2e.POSITIVE + e2e.NEGATIVE]
    positive = sum(w in e2e.POSITIVE for w in found)
    counts.append(len(found))
    assert row["label"] == ("pos" if positive * 2 > len(found) else "neg")
  assert set(counts) == {1, 3} and 0.4 < np.mean(np.array(counts) == 3) < 0.6
  assert rows == bench.sentiment_rows(words, 2000, seed=0, max_words=28)  # seeded
  noisy = bench.sentiment_rows(words, 2000, seed=0, max_words=28, noise=0.1)
  assert [r["sentence"] for r in noisy] == [r["sentence"] for r in rows]
  flipped = np.mean([a["label"] != b["label"] for a, b in zip(rows, noisy)])
  assert 0.08 < flipped < 0.12
