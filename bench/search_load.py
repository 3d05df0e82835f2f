r"""What the checks of a saved index cost when a query loads it: `Index.load` (index.json and its checksum, the
layout of index.faiss against it, faiss' read with a CRC-32 of the bytes, every line of docs.jsonl and its CRC-32)
against the reads alone (`faiss.read_index` and one `json.loads` per docs.jsonl line, what loading did before the
checks), best of `--repeats`, on random unit vectors.

  python bench/search_load.py [--documents=100000 --dim=384 --index_type=flat --repeats=5]

The last line is one JSON object.
"""
from __future__ import annotations

import json
import os
import pathlib
import sys
import tempfile

from absl import app
from absl import flags
import numpy as np

# `python bench/search_load.py` from a checkout, without installing jbert.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import timing  # noqa: E402  (bench/)
from jbert.search import Index, IndexSettings  # noqa: E402

_DOCUMENTS = flags.DEFINE_integer("documents", 100_000, "Documents in the index.")
_DIM = flags.DEFINE_integer("dim", 384, "Embedding dimension.")
_INDEX_TYPE = flags.DEFINE_enum("index_type", "flat", ["flat", "ivf", "hnsw"], "The faiss index.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Loads timed; the best is reported.")


def main(argv):
  del argv
  import faiss  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  x = rng.standard_normal((_DOCUMENTS.value, _DIM.value)).astype(np.float32)
  x /= np.linalg.norm(x, axis=1, keepdims=True)
  n = len(x)
  settings = IndexSettings(_INDEX_TYPE.value, hnsw_m=16, ef_construction=40)
  index = Index.build(x, [f"doc{i}" for i in range(n)], [f"the text of document number {i}" for i in range(n)],
                      settings)
  with tempfile.TemporaryDirectory() as root:
    folder = os.path.join(root, "index")
    index.save(folder)

    def reads_alone():
      faiss.read_index(os.path.join(folder, "index.faiss"))
      with open(os.path.join(folder, "docs.jsonl"), encoding="utf-8") as f:
        [json.loads(line) for line in f]  # pylint: disable=expression-not-assigned

    result = {"documents": n, "dim": _DIM.value, "index_type": _INDEX_TYPE.value,
              "index_faiss_mib": round(os.path.getsize(os.path.join(folder, "index.faiss")) / 2 ** 20, 1),
              "load_checked_s": round(timing.best_seconds(lambda: Index.load(folder), _REPEATS.value), 3),
              "reads_alone_s": round(timing.best_seconds(reads_alone, _REPEATS.value), 3)}
  result["checks_s"] = round(result["load_checked_s"] - result["reads_alone_s"], 3)
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
