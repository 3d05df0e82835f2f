"""bench/crf.py at a small shape: the three forward forms agree, every variant is timed and the JSON line is whole (the
numbers themselves are docs/performance.md's)."""
import json

import script_module

bench = script_module.load("bench/crf.py")


def test_the_bench_times_every_variant(capsys):
  own = bench._BATCH._flagvalues  # pylint: disable=protected-access
  own["batch"].value, own["length"].value, own["tags"].value = 3, 7, 4
  own["timed"].value, own["rounds"].value = 1, 1
  bench.main([])
  result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert (result["batch"], result["length"], result["tags"]) == (3, 7, 4)
  assert result["forward_max_abs_difference"] < 1e-5
  assert set(result["ms"]) == {"forward scan", "forward tree", "forward associative_scan", "train scan", "train tree",
                               "viterbi", "torch train", "torch viterbi"}
  assert all(ms > 0 for ms in result["ms"].values())
