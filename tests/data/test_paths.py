"""Data files by path or URL: globs over memory:// (the stand-in for gs://), decompression by suffix, a suffix
that lies named in one line, and writes that never leave a half-written file under its final name."""
import gzip
import os
import socket

import fsspec
import pytest
import zstandard

from jbert.data import paths


@pytest.fixture
def bucket():
  fs = fsspec.filesystem("memory")
  fs.pipe("/bucket/corpus/b.txt", b"second")
  fs.pipe("/bucket/corpus/a.txt", b"first")
  fs.pipe("/bucket/corpus/sub/c.txt", b"third")
  yield "memory://bucket/corpus"
  fs.rm("/bucket", recursive=True)


def test_remote_globs_sort_within_each_glob_and_keep_the_glob_order(bucket):
  files = paths.expand_globs(f"{bucket}/sub/*.txt, {bucket}/*.txt", "--input")
  assert files == ["memory:///bucket/corpus/sub/c.txt", "memory:///bucket/corpus/a.txt",
                   "memory:///bucket/corpus/b.txt"]
  assert [paths.read_bytes(f) for f in files] == [b"third", b"first", b"second"]
  assert paths.size(files[1]) == 5 and paths.read_range(files[2], 1, 4) == b"eco"
  with pytest.raises(FileNotFoundError, match=r"--input: no file matches the glob 'memory://bucket/corpus/\*.gz'"):
    paths.expand_globs(f"{bucket}/*.gz", "--input")


def test_compressed_files_read_as_their_suffix_says(tmp_path):
  text = "line one\n\nline two\n".encode() * 100
  (tmp_path / "a.txt.gz").write_bytes(gzip.compress(text))
  (tmp_path / "a.txt.zst").write_bytes(zstandard.ZstdCompressor().compress(text))
  assert paths.read_bytes(str(tmp_path / "a.txt.gz")) == text
  assert paths.read_bytes(str(tmp_path / "a.txt.zst")) == text
  assert paths.without_compression("x/a.jsonl.zst") == "x/a.jsonl" and paths.compression("a.TXT") is None


@pytest.mark.parametrize("name, data, message", [
    ("a.jsonl.gz", b'{"text": "x"}\n',
     r"a.jsonl.gz is named .gz but is not compressed \(it starts with b'\{\"text\":'\); rename it"),
    ("a.txt.zst", gzip.compress(b"x", mtime=0), r"a.txt.zst is named .zst but is gzip-compressed"),
    ("a.jsonl", gzip.compress(b"x", mtime=0),
     r"a.jsonl is gzip-compressed but its name does not say so; rename it to .*a.jsonl.gz"),
], ids=["gz-but-plain", "zst-but-gzip", "gzip-unnamed"])  # fixed names: both xdist workers must collect the same ids
def test_a_suffix_that_contradicts_the_bytes_is_one_line_naming_the_file(tmp_path, name, data, message):
  (tmp_path / name).write_bytes(data)
  with pytest.raises(ValueError, match=message):
    paths.read_bytes(str(tmp_path / name))


def test_a_protocol_without_its_package_names_the_package(monkeypatch):
  def missing(url):
    raise ImportError("Install gcsfs to access Google Storage")
  monkeypatch.setattr(fsspec.core, "url_to_fs", missing)
  with pytest.raises(ValueError, match=r"^gs://b/x.txt: reading gs:// paths needs gcsfs; install it "
                                       r"\(`pip install gcsfs`\).$"):
    paths.read_bytes("gs://b/x.txt")


def test_writes_appear_whole_and_dead_writers_temporaries_are_removed(tmp_path, bucket):
  paths.write_atomic(str(tmp_path / "f.json"), b"{}")
  paths.write_atomic(f"{bucket}/f.json", b"[]")
  assert (tmp_path / "f.json").read_bytes() == b"{}" and paths.read_bytes(f"{bucket}/f.json") == b"[]"
  tmp = paths.temporary(str(tmp_path / "shard"))
  assert os.path.dirname(tmp) == str(tmp_path) and os.path.basename(tmp).startswith(".shard.")
  open(tmp, "wb").close()
  paths.commit(tmp, str(tmp_path / "shard"))
  assert sorted(os.listdir(tmp_path)) == ["f.json", "shard"]
  host = socket.gethostname()
  dead = 2 ** 22 + 12345  # above Linux's pid_max default: no such process
  for name in (f".s1.{host}.{dead}.tmp", f".s2.{host}.{os.getpid()}.tmp", f".s3.otherhost.{dead}.tmp"):
    (tmp_path / name).write_bytes(b"partial")
  assert paths.remove_stale(str(tmp_path)) == [f".s1.{host}.{dead}.tmp"]
  assert sorted(os.listdir(tmp_path)) == [f".s2.{host}.{os.getpid()}.tmp", f".s3.otherhost.{dead}.tmp", "f.json",
                                          "shard"]
