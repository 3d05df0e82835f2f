"""`python -m jbert.convert` of a sentence-transformers folder keeps its pooling, normalisation and maximum length:
the converted folder embeds as the original does, with jbert and with sentence-transformers, without flags."""
import json
import os

import numpy as np
import pytest

import jbert
from jbert import convert

from inference.tiny_models import TEXTS


@pytest.mark.parametrize("folder, modules, dim", [("st_dir", ["1_Pooling", "2_Normalize"], 32),
                                                 ("legacy_st_dir", ["1_Pooling"], 64)])  # legacy: CLS + max
def test_converted_folder_embeds_as_the_original(folder, modules, dim, request, tmp_path, capsys):
  from sentence_transformers import SentenceTransformer
  source = request.getfixturevalue(folder)
  before = {p: (source / p).read_bytes() for p in ("modules.json", "1_Pooling/config.json")}
  dst = tmp_path / "converted"
  assert convert.main([str(source), str(dst)]) == 0
  assert "as hf to" in capsys.readouterr().out  # sentence-transformers reads only a Hugging Face transformer
  assert {p: (source / p).read_bytes() for p in before} == before  # the source is left as it was
  written = json.loads((dst / "modules.json").read_text())
  assert [m["path"] for m in written] == ["", *modules]
  assert all((dst / m).is_dir() for m in modules)
  original = jbert.embed(TEXTS, str(source), batch_size=4)
  converted = jbert.embed(TEXTS, str(dst), batch_size=4)
  assert converted.shape == (len(TEXTS), dim)
  np.testing.assert_allclose(converted, original, atol=1e-6)
  reference = SentenceTransformer(str(dst), device="cpu")
  assert reference.max_seq_length == (24 if folder == "st_dir" else 12)
  np.testing.assert_allclose(reference.encode(TEXTS, batch_size=4, convert_to_numpy=True), converted, atol=1e-5)


def test_a_module_jbert_does_not_run_is_refused_before_writing(st_dir, tmp_path, capsys):
  source = tmp_path / "with_dense"
  source.mkdir()
  for name in os.listdir(st_dir):
    os.symlink(st_dir / name, source / name)
  os.remove(source / "modules.json")
  modules = json.loads((st_dir / "modules.json").read_text())
  modules.append({"idx": 3, "name": "3", "path": "3_LayerNorm", "type": "sentence_transformers.models.LayerNorm"})
  (source / "modules.json").write_text(json.dumps(modules))
  assert convert.main([str(source), str(tmp_path / "dst")]) == 2
  assert capsys.readouterr().err.strip() == (
      f"jbert.convert: {source}/modules.json has a sentence_transformers.models.LayerNorm module ('3_LayerNorm'); "
      "jbert reads Transformer, Pooling, Dense and Normalize modules only.")
  assert not (tmp_path / "dst").exists()
