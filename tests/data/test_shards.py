"""The shard files of a prepared corpus against what prepare recorded: CRC32C of known bytes, one listing of sizes
(and a bucket's own checksums), and what each kind of damage is called."""
import fsspec
import google_crc32c

from jbert.data import shards


def test_crc32c_of_known_bytes(tmp_path):
  (tmp_path / "check").write_bytes(b"123456789")  # the CRC-32C check value (RFC 3720)
  assert shards.crc32c(str(tmp_path / "check")) == "e3069283"
  (tmp_path / "big").write_bytes(b"123456789" * 2_000_000)  # several reads of _CHUNK
  assert shards.crc32c(str(tmp_path / "big")) == f"{google_crc32c.value(b'123456789' * 2_000_000):08x}"


def test_problems_name_each_damaged_shard(tmp_path):
  good, short, other = (tmp_path / n for n in ("a", "b", "c"))
  good.write_bytes(b"123456789")
  short.write_bytes(b"1234")
  other.write_bytes(b"987654321")
  records = [{"name": n, "bytes": 9, "crc32c": "e3069283"} for n in ("a", "b", "c", "d")]
  assert shards.listing(str(tmp_path)) == {"a": (9, None), "b": (4, None), "c": (9, None)}
  assert shards.problems(str(tmp_path), records, read=False) == [  # sizes alone: the same size passes
      "b holds 4 bytes, not the 9 prepare wrote", "d is missing"]
  assert shards.problems(str(tmp_path), records, read=True) == [
      "b holds 4 bytes, not the 9 prepare wrote",
      f"c has CRC32C {shards.crc32c(str(other))}, not the e3069283 of the shard prepare wrote", "d is missing"]


def test_a_listed_checksum_is_compared_without_a_read(monkeypatch):
  """A bucket lists each object's CRC32C (base64, big-endian): compared at open, nothing read."""
  memory = fsspec.filesystem("memory")
  memory.pipe("/shards/a", b"123456789")
  real_ls = type(memory).ls
  monkeypatch.setattr(type(memory), "ls", lambda self, path, detail=True, **kw: [
      {**e, "crc32c": "4waSgw==" if e["name"].endswith("/a") else "AAAAAA=="} for e in real_ls(self, path, detail)])
  memory.pipe("/shards/b", b"123456789")
  try:
    monkeypatch.setattr(shards, "crc32c", lambda path: 1 / 0)  # no read
    records = [{"name": n, "bytes": 9, "crc32c": "e3069283"} for n in ("a", "b")]
    assert shards.problems("memory://shards", records, read=True) == [
        "b has CRC32C 00000000, not the e3069283 of the shard prepare wrote"]
  finally:
    memory.rm("/shards", recursive=True)
