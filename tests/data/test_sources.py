"""Document sources: BERT-format files, plain text, TFDS (mocked), and every kind of bad input."""
import pickle

import pytest
import tensorflow_datasets as tfds

from jbert.data import sources


def write(path, data: bytes | str):
  path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
  return path


def test_bert_format_documents_and_separators(tmp_path):
  write(tmp_path / "a.txt", "\n\n  \nFirst doc line one.\nLine two.\n\n\n \t\nSecond doc.\n\n")
  write(tmp_path / "b.txt", "\ufeffThird doc.\r\nSecond line.\r\n\r\nFourth.")
  src = sources.BertFormatFiles(str(tmp_path / "*.txt"))
  assert len(src) == 4
  assert [src[i] for i in range(4)] == [["First doc line one.", "Line two."], ["Second doc."],
                                        ["Third doc.", "Second line."], ["Fourth."]]
  assert not src.stats


def test_comma_separated_globs_keep_order(tmp_path):
  write(tmp_path / "x.txt", "x1\n\nx2\n")
  write(tmp_path / "y.txt", "y1\n")
  src = sources.BertFormatFiles(f"{tmp_path}/y.txt, {tmp_path}/x.txt")
  assert [src[i] for i in range(len(src))] == [["y1"], ["x1"], ["x2"]]


def test_source_survives_pickling_for_grain_workers(tmp_path):
  write(tmp_path / "a.txt", "one.\ntwo.\n\nthree.\n")
  src = pickle.loads(pickle.dumps(sources.BertFormatFiles(str(tmp_path / "a.txt"))))
  assert src[1] == ["three."]


def test_empty_glob_names_the_glob(tmp_path):
  with pytest.raises(FileNotFoundError, match=r"no file matches the glob '.*nothing\*\.txt'"):
    sources.BertFormatFiles(str(tmp_path / "nothing*.txt"))
  with pytest.raises(ValueError, match="files is empty"):
    sources.BertFormatFiles("")


def test_blank_files_are_an_error(tmp_path):
  write(tmp_path / "blank.txt", "\n  \n\t\n")
  with pytest.raises(ValueError, match="hold no text"):
    sources.BertFormatFiles(str(tmp_path / "blank.txt"))


def test_invalid_utf8_is_replaced_and_counted(tmp_path):
  write(tmp_path / "bad.txt", b"caf\xe9 ok\nfine \xff\xfe end\n")
  src = sources.BertFormatFiles(str(tmp_path / "bad.txt"))
  assert src[0] == ["caf\ufffd ok", "fine \ufffd\ufffd end"]
  assert src.stats["replaced_chars"] == 3


def test_long_lines_are_cut_and_counted(tmp_path):
  write(tmp_path / "long.txt", "x" * 100 + "\nshort\n" + "y" * 51 + "\n")
  src = sources.BertFormatFiles(str(tmp_path / "long.txt"), max_line_chars=50)
  assert src[0] == ["x" * 50, "short", "y" * 50]
  assert src.stats["truncated_lines"] == 2


def test_split_sentences_by_paragraph():
  text = "Mr. Smith went to Washington. He arrived at 5 p.m. on Monday!\n\nIs it new? Yes."
  assert sources.split_sentences(text, "en") == [
      "Mr. Smith went to Washington.", "He arrived at 5 p.m. on Monday!", "Is it new?", "Yes."]


def test_text_files_join_wrapped_lines_then_split(tmp_path):
  write(tmp_path / "book.txt",
        "The cat sat on\nthe mat. It was\nhappy.\n\nA new story begins here. The end.\n")
  src = sources.TextFiles(str(tmp_path / "book.txt"))
  assert len(src) == 2
  assert src[0] == ["The cat sat on the mat.", "It was happy."]
  assert src[1] == ["A new story begins here.", "The end."]


def _fake_source(documents):
  def as_data_source(self, split, **kwargs):
    del self, kwargs
    as_data_source.splits.append(split)
    return documents
  as_data_source.splits = []
  return as_data_source


def test_tfds_documents_decode_bytes_and_split():
  fake = _fake_source([{"text": "One here. Two here.\nThree!", "title": "a"},
                       {"text": b"Bad \xff byte. Fine.", "title": "b"}])
  with tfds.testing.mock_data(as_data_source_fn=fake):
    src = sources.TfdsDocuments("wikipedia/20230601.en", split="train[:10%]")
  assert fake.splits == ["train[:10%]"]
  assert len(src) == 2
  assert src[0] == ["One here.", "Two here.", "Three!"]
  assert src[1] == ["Bad \ufffd byte.", "Fine."]
  assert src.stats["replaced_chars"] == 1


def test_tfds_missing_text_key_lists_features():
  with tfds.testing.mock_data(as_data_source_fn=_fake_source([{"body": "x", "title": "t"}])):
    src = sources.TfdsDocuments("wikipedia/20230601.en", split="train", text_key="text")
  with pytest.raises(KeyError, match=r"no feature 'text'.*\['body', 'title'\]"):
    src[0]


def test_tfds_random_mock_has_documents():
  with tfds.testing.mock_data(num_examples=5, policy=tfds.testing.MockPolicy.USE_CODE):
    src = sources.TfdsDocuments("wikipedia/20230601.en", split="train")
  assert len(src) == 5
  assert all(isinstance(s, str) and s for i in range(5) for s in src[i])


def test_tfds_unknown_name_is_explained():
  with pytest.raises(ValueError, match=r"no dataset named 'no_such_corpus_xyz' \(tfds_name\)"):
    sources.TfdsDocuments("no_such_corpus_xyz", split="train")


@pytest.mark.parametrize("data, bad, shown", [
    (b"\0" * 100 + b"\n\n" + b"\0" * 50, 150, 150),  # NUL-only: binary, not "too little text"
    (bytes(range(0xa0, 0x100)) * 4, 384, 384),  # high Latin-1 bytes throughout: mostly U+FFFD
    (b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0\x02\0>\0\x01\0\0\0", 20, 24),  # an ELF header
])
def test_a_file_that_is_mostly_not_utf8_text_is_refused_by_name(tmp_path, data, bad, shown):
  path = write(tmp_path / "corpus.txt", data)
  with pytest.raises(ValueError) as error:
    sources.TextFiles(str(path))
  assert str(error.value) == (f"{path} is not UTF-8 text: {bad} of the first {shown} characters are NUL, control "
                              "characters or bytes that are not UTF-8 (a binary file, or text in another encoding); "
                              "convert it to UTF-8 (e.g. `iconv -f latin1 -t utf-8`) or leave it out of the data "
                              "files.")


def test_text_files_from_a_bucket_or_compressed_read_as_the_plain_file(tmp_path):
  import gzip  # pylint: disable=import-outside-toplevel
  import fsspec  # pylint: disable=import-outside-toplevel
  import zstandard  # pylint: disable=import-outside-toplevel
  text = "The cat sat on\nthe mat. It was\nhappy.\n\n\n  \nA new story begins here. The end.\n\nLast.\n".encode()
  write(tmp_path / "book.txt", text)
  write(tmp_path / "book.txt.gz", gzip.compress(text))
  write(tmp_path / "book.txt.zst", zstandard.ZstdCompressor().compress(text))
  memory = fsspec.filesystem("memory")
  memory.pipe("/bucket/book.txt", text)
  try:
    plain = sources.TextFiles(str(tmp_path / "book.txt"))
    expected = [plain[i] for i in range(len(plain))]
    assert len(expected) == 3
    for path in ("book.txt.gz", "book.txt.zst", "memory://bucket/*.txt"):
      src = sources.TextFiles(path if "://" in path else str(tmp_path / path))
      assert [src[i] for i in range(len(src))] == expected, path
    src = pickle.loads(pickle.dumps(sources.BertFormatFiles(str(tmp_path / "book.txt.gz"))))  # grain workers
    assert src[1] == ["A new story begins here. The end."]
  finally:
    memory.rm("/bucket", recursive=True)
