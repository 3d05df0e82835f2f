"""jbert.untrusted: a model folder's small files are regular files read up to their size; anything else is named."""
import os
import signal

import pytest

from jbert import untrusted
from jbert.errors import UserError


@pytest.fixture
def alarm():
  """Fails a test that blocks (a FIFO opened for reading waits for a writer) instead of hanging the suite."""

  def expire(signum, frame):
    raise TimeoutError("blocked reading a FIFO")

  previous = signal.signal(signal.SIGALRM, expire)
  signal.alarm(20)
  yield
  signal.alarm(0)
  signal.signal(signal.SIGALRM, previous)


def test_a_regular_file_reads_whole(tmp_path):
  path = tmp_path / "config.json"
  path.write_bytes(b'\xef\xbb\xbf{"hidden_size": 32}')
  assert untrusted.read_json(path) == {"hidden_size": 32}  # a byte-order mark is dropped
  assert untrusted.read_bytes(path) == path.read_bytes()
  link = tmp_path / "link.json"
  link.symlink_to(path)  # a link to a regular file is fine (the Hugging Face cache is made of them)
  assert untrusted.read_json(link) == {"hidden_size": 32} and untrusted.check_regular(link) == 22


def test_devices_fifos_and_folders_are_refused_by_name(tmp_path, alarm):
  zero = tmp_path / "vocab.txt"
  zero.symlink_to("/dev/zero")
  fifo = tmp_path / "tokenizer.json"
  os.mkfifo(fifo)
  (tmp_path / "config.json").mkdir()
  fix = "not a regular file; a model folder's files must be plain files: replace it with the real file."
  for path, kind in ((zero, "a character device (a link to /dev/zero)"), (fifo, "a FIFO (named pipe)"),
                     (tmp_path / "config.json", "a directory")):
    for read in (untrusted.read_bytes, untrusted.read_text, untrusted.read_json, untrusted.check_regular):
      with pytest.raises(UserError) as error:
        read(path)
      assert str(error.value) == f"{path} is {kind}, {fix}"


def test_size_bounds_the_read(tmp_path):
  path = tmp_path / "tokenizer_config.json"
  path.write_bytes(b"{}" + b" " * 98)
  assert untrusted.read_json(path, limit=100) == {}
  with pytest.raises(UserError, match=rf"^{path} is 100 bytes, more than the 99 any such file of a model folder "
                     "holds; the file is not what its name says, or is damaged: replace it.$"):
    untrusted.read_json(path, limit=99)
  (tmp_path / "bad.json").write_bytes(b'{"a": "\xff"}')
  with pytest.raises(UserError, match=r"bad.json is not UTF-8 text \(invalid start byte at byte 7\)"):
    untrusted.read_json(tmp_path / "bad.json")
  (tmp_path / "cut.json").write_text('{"a": ')
  with pytest.raises(UserError, match=r"cut.json is not valid JSON \(Expecting value at line 1 column 7\): the file "
                     "is truncated or corrupt"):
    untrusted.read_json(tmp_path / "cut.json")
