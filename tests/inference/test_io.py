"""Input readers (txt / JSONL / CSV / TSV, pairs, bad bytes) and the atomic .npy / JSONL writers."""
import json

import numpy as np
import pytest

from jbert.inference import io


def test_text_lines_keep_empty_lines_and_drop_line_ends(tmp_path):
  path = tmp_path / "in.txt"
  path.write_bytes(b"\xef\xbb\xbffirst\r\n\nthird line\n  \nlast")
  assert list(io.iter_records(str(path))) == ["first", "", "third line", "  ", "last"]
  assert io.scan(str(path)) == 5
  pairs = tmp_path / "pairs.txt"
  pairs.write_text("a b\tc d\nx\t\n", encoding="utf-8")
  assert list(io.iter_records(str(pairs), pairs=True)) == [("a b", "c d"), ("x", "")]
  pairs.write_text("a\tb\nno tab here\n", encoding="utf-8")
  with pytest.raises(ValueError, match=r"pairs.txt, line 2: --pairs needs"):
    io.scan(str(pairs), pairs=True)


def test_jsonl_columns_and_errors(tmp_path):
  path = tmp_path / "in.jsonl"
  path.write_text('{"text": "one", "b": "x"}\n\n{"text": "two", "b": null}\n', encoding="utf-8")
  assert list(io.iter_records(str(path))) == ["one", "two"]
  assert list(io.iter_records(str(path), pair_column="b")) == [("one", "x"), ("two", "")]
  with pytest.raises(ValueError, match=r"in.jsonl, line 1: no field 'sentence'"):
    io.scan(str(path), column="sentence")
  path.write_text('{"text": "one"}\n{"text": 3}\n', encoding="utf-8")
  with pytest.raises(ValueError, match=r"line 2: field 'text' is a int, not text"):
    io.scan(str(path))
  path.write_text('{"text": "one"}\n{"text": \n', encoding="utf-8")
  with pytest.raises(ValueError, match=r"line 2: not valid JSON"):
    io.scan(str(path))


@pytest.mark.parametrize("suffix,sep", [(".csv", ","), (".tsv", "\t")])
def test_delimited_files(tmp_path, suffix, sep):
  path = tmp_path / f"in{suffix}"
  path.write_text(sep.join(["id", "sentence", "other"]) + "\n" + sep.join(["1", '"quoted, with sep\nand newline"',
                                                                            "x"]) + "\n" + sep.join(["2", "", "y"])
                  + "\n", encoding="utf-8")
  assert list(io.iter_records(str(path), column="sentence")) == ["quoted, with sep\nand newline", ""]
  assert list(io.iter_records(str(path), column="sentence", pair_column="other")) == [
      ("quoted, with sep\nand newline", "x"), ("", "y")]
  with pytest.raises(ValueError, match=r"has no column 'text'; its columns are \['id', 'sentence', 'other'\]"):
    io.scan(str(path))
  single = tmp_path / f"single{suffix}"
  single.write_text("review\ngood\nbad\n", encoding="utf-8")
  assert list(io.iter_records(str(single))) == ["good", "bad"]  # The only column needs no name.


def test_bad_inputs_name_file_and_line(tmp_path):
  path = tmp_path / "latin1.txt"
  path.write_bytes("fine\nstill fine\ncaf\xe9\n".encode("latin-1"))
  with pytest.raises(ValueError, match=r"latin1.txt, line 3: byte 4 \(b'\\xe9'\) is not UTF-8"):
    io.scan(str(path))
  csv_path = tmp_path / "latin1.csv"
  csv_path.write_bytes("text\nok\ncaf\xe9\n".encode("latin-1"))
  with pytest.raises(ValueError, match=r"latin1.csv, line 3: byte 4"):
    io.scan(str(csv_path))
  empty = tmp_path / "empty.txt"
  empty.write_bytes(b"")
  assert io.scan(str(empty)) == 0
  with pytest.raises(ValueError, match=r"Cannot tell the format of .*\.parquet"):
    io.scan(str(tmp_path / "x.parquet"))
  with pytest.raises(FileNotFoundError, match="does not exist"):
    io.scan(str(tmp_path / "missing.txt"))


def test_npy_writer_streams_blocks(tmp_path):
  path = tmp_path / "out.npy"
  blocks = [np.random.default_rng(i).standard_normal((n, 7)).astype(np.float32) for i, n in enumerate((3, 0, 5))]
  with io.NpyWriter(str(path)) as out:
    for block in blocks:
      out.write(block)
    assert not path.exists()  # Only the temporary file exists until the writer closes.
  loaded = np.load(path)
  assert loaded.dtype == np.float32 and loaded.shape == (8, 7)
  np.testing.assert_array_equal(loaded, np.concatenate(blocks))
  assert list(tmp_path.iterdir()) == [path]


def test_interrupted_writes_leave_no_partial_file(tmp_path):
  path = tmp_path / "out.npy"
  np.save(path, np.ones((2, 2), np.float32))
  with pytest.raises(KeyboardInterrupt):
    with io.NpyWriter(str(path)) as out:
      out.write(np.zeros((4, 2), np.float32))
      raise KeyboardInterrupt
  np.testing.assert_array_equal(np.load(path), np.ones((2, 2)))  # The earlier file is untouched.
  assert [p.name for p in tmp_path.iterdir()] == ["out.npy"]
  jsonl = tmp_path / "out.jsonl"
  with io.JsonlWriter(str(jsonl)) as out:
    out.write({"index": 0, "text": "é"})
  assert [json.loads(line) for line in jsonl.read_text(encoding="utf-8").splitlines()] == [{"index": 0, "text": "é"}]
  with pytest.raises(FileNotFoundError, match="Output folder .* does not exist"):
    io.NpyWriter(str(tmp_path / "no" / "out.npy"))
