"""bench/search_load.py on a small index of each kind: the checked load and the reads alone are timed and the JSON
line is whole (the numbers themselves are docs/performance.md's)."""
import json

import pytest

import script_module

bench = script_module.load("bench/search_load.py")


@pytest.mark.parametrize("index_type", ["flat", "hnsw"])
def test_the_bench_reports_both_loads(index_type, capsys):
  own = bench._DOCUMENTS._flagvalues  # pylint: disable=protected-access
  own["documents"].value, own["dim"].value, own["repeats"].value = 300, 8, 1
  own["index_type"].value = index_type
  bench.main([])
  result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert set(result) == {"documents", "dim", "index_type", "index_faiss_mib", "load_checked_s", "reads_alone_s",
                         "checks_s"}
  assert (result["documents"], result["dim"], result["index_type"]) == (300, 8, index_type)
  assert result["load_checked_s"] > 0 and result["reads_alone_s"] > 0
  assert result["checks_s"] == round(result["load_checked_s"] - result["reads_alone_s"], 3)
