"""bench/electra_vs_mlm.py without training: the equal-FLOPs step budget and the commands it runs."""
import pytest

import script_module

bench = script_module.load("bench/electra_vs_mlm.py")


def test_electra_gets_the_steps_of_the_mlm_flops_and_both_commands_read_the_same_corpus():
  budget = bench.equal_flops_steps(600, 4000, 32, 64)
  mlm, electra = budget["mlm_step_flops"], budget["electra_step_flops"]
  assert mlm < electra < 2 * mlm  # the generator is a quarter as wide; the discriminator's head is one dense
  assert budget["electra_steps"] == round(600 * mlm / electra)
  assert budget["electra_steps"] * electra == pytest.approx(600 * mlm, rel=1e-2)
  bench.flags.FLAGS(["bench"])  # defaults
  commands = [bench.pretrain_command(kind, "/c", "/w", 10, 3) for kind in ("mlm", "electra")]
  for command in commands:
    assert {"--config.data.prepared=/c", "--config.total_steps=10", "--config.seed=3", "--config.batch_size=32",
            "--config.data.max_seq_length=64"} <= set(command)
  assert commands[0][2].endswith("configs/tiny.py")
  assert {"--config.data.nsp=False", "--config.data.short_seq_prob=0.0"} <= set(commands[0])
  assert commands[1][2].endswith("configs/electra.py:tiny")


def test_order_rows_swap_one_adjacent_pair_in_every_other_row():
  words = [f"w{i}" for i in range(500)]
  rows = bench.order_rows(words, 200, 0, 28)
  assert [r["label"] for r in rows[:4]] == ["pos", "neg", "pos", "neg"]
  for row in rows:
    span = row["sentence"].split()
    numbers = [int(w[1:]) for w in span]
    assert 4 <= len(span) <= 28
    if row["label"] == "pos":  # a span of the text as it stands
      assert numbers == list(range(numbers[0], numbers[0] + len(span)))
    else:  # the same span with exactly one adjacent pair exchanged
      ordered = sorted(numbers)
      assert ordered == list(range(ordered[0], ordered[0] + len(span)))
      moved = [i for i, (a, b) in enumerate(zip(numbers, ordered)) if a != b]
      assert len(moved) == 2 and moved[1] == moved[0] + 1
