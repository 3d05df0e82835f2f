"""The one file reader (jbert.data.files): formats, encodings, quoting, errors, and that the trainer, `embed` and
`predict` read the same rows of the same file."""
import csv
import io as stdio
import json
import re

import pytest

from jbert.data import files
from jbert.data import local
from jbert.tasks.classification import sources
from jbert.tasks.multiple_choice import features as multiple_choice
from jbert.tasks.question_answering import features as squad
from jbert.tasks.token_classification import features as ner
from jbert.tasks import SequenceClassification

# The texts of every nasty file: one opens with a double quote (the TSV that once gave `embed` 1 row for 4), one
# holds a tab and a comma, one is empty, one is not ASCII.
TEXTS = ['"Quoted" opening, then more', "tab\there, and a comma", "", "naïve café ✓"]
LABELS = ["yes", "no", "no", "yes"]


def _predict_inputs(path, **flags):
  """What `jbert.predict` reads from `path` for a sequence classifier (its task's reader)."""
  task = SequenceClassification(sources.local_dataset("predict", {}, {"text_a": "text_a"}, ("no", "yes")),
                                max_seq_length=16)
  return task.read_inputs(path, **flags)
BOM = b"\xef\xbb\xbf"


def _nasty(tmp_path, suffix):
  """A file with a BOM, CRLF line ends and the rows of TEXTS (column `sentence`, then `label`)."""
  if suffix == ".jsonl":
    body = "".join(json.dumps({"sentence": t, "label": l}, ensure_ascii=False) + "\r\n" for t, l in zip(TEXTS, LABELS))
  elif suffix == ".csv":
    out = stdio.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")  # Standard quoting: `"` doubled, fields with `,` quoted.
    writer.writerows([("sentence", "label"), *zip(TEXTS, LABELS)])
    body = out.getvalue()
  else:  # GLUE's TSV: no quoting at all, so a text may hold `"` but no tab.
    body = "".join(f"{t.replace(chr(9), ' ')}\t{l}\r\n" for t, l in zip(["sentence", *TEXTS], ["label", *LABELS]))
  path = tmp_path / f"nasty{suffix}"
  path.write_bytes(BOM + body.encode("utf-8"))
  return path


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl"])
def test_trainer_embed_and_predict_read_the_same_rows(tmp_path, suffix):
  path = _nasty(tmp_path, suffix)
  expected = [t.replace("\t", " ") for t in TEXTS] if suffix == ".tsv" else TEXTS
  trainer = local.read_examples(path, {"text_a": "sentence", "label": "label"}, ["no", "yes"])
  embed = list(files.iter_records(str(path), column="sentence"))
  predict = _predict_inputs(str(path), column="sentence")
  assert [e["text_a"] for e in trainer] == expected
  assert [e["label"] for e in trainer] == [1, 0, 0, 1]
  assert embed == expected
  assert [e["text_a"] for e in predict] == expected
  assert files.scan(str(path), column="sentence") == 4
  if suffix != ".jsonl":
    assert files.columns(path) == ["sentence", "label"]  # Not '\ufeffsentence'.


def test_text_files_read_alike_by_embed_and_predict(tmp_path):
  path = tmp_path / "in.txt"
  path.write_bytes(BOM + '"Quoted" opening\r\ntab\tinside\r\n\r\nlast'.encode("utf-8"))
  expected = ['"Quoted" opening', "tab\tinside", "", "last"]
  assert list(files.iter_records(str(path))) == expected
  assert [e["text_a"] for e in _predict_inputs(str(path))] == expected
  assert files.scan(str(path)) == 4
  pairs = tmp_path / "pairs.txt"
  pairs.write_text("a b\tc d\nx\t\n", encoding="utf-8")
  assert list(files.iter_records(str(pairs), pairs=True)) == [("a b", "c d"), ("x", "")]
  pairs.write_text("a\tb\nno tab here\n", encoding="utf-8")
  with pytest.raises(ValueError, match=r"pairs.txt, line 2: --pairs needs"):
    files.scan(str(pairs), pairs=True)


def test_tsv_is_unquoted_and_csv_quoted(tmp_path):
  tsv = tmp_path / "in.tsv"
  tsv.write_text('id\tsentence\n1\t"opens a quote\n2\tsecond\n3\tthird "quoted"\n', encoding="utf-8")
  assert list(files.iter_records(str(tsv), column="sentence")) == ['"opens a quote', "second", 'third "quoted"']
  csv_path = tmp_path / "in.csv"
  csv_path.write_text('id,sentence,other\n1,"quoted, with sep\nand newline",x\n2,,y\n', encoding="utf-8")
  assert list(files.iter_records(str(csv_path), column="sentence")) == ["quoted, with sep\nand newline", ""]
  assert list(files.iter_records(str(csv_path), column="sentence", pair_column="other")) == [
      ("quoted, with sep\nand newline", "x"), ("", "y")]
  assert [line for line, _ in files.rows(csv_path)] == [2, 4]  # The line a record starts on.
  single = tmp_path / "single.tsv"
  single.write_text("review\ngood\nbad\n", encoding="utf-8")
  assert list(files.iter_records(str(single))) == ["good", "bad"]  # The only column needs no name.
  extra = tmp_path / "extra.tsv"
  extra.write_text("a\tb\n1\t2\n1\t2\t3\n", encoding="utf-8")
  with pytest.raises(ValueError, match=r"extra.tsv, line 3: 3 fields under a header of 2"):
    files.scan(str(extra), column="a")


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl"])
def test_a_missing_column_names_the_file_row_line_and_columns(tmp_path, suffix):
  path = _nasty(tmp_path, suffix)
  message = (r"column\(s\) \['text'\] not in row 0 of .*nasty\%s \(line %d\); available columns: "
             r"\['sentence', 'label'\]" % (suffix, 1 if suffix == ".jsonl" else 2))
  with pytest.raises(files.MissingColumnError, match=message + r"\. Pass --column"):
    files.scan(str(path))
  with pytest.raises(KeyError, match=message + r"\. Set --config.task.text_a to a column of the file\.$"):
    local.read_examples(path, {"text_a": "text"})
  with pytest.raises(KeyError, match=message.replace(r"\['text'\]", r"\['text', 'gold'\]") + r"\. Set "
                     r"--config.task.text_a and --config.task.label to columns of the file\.$"):
    local.read_examples(path, {"text_a": "text", "text_b": "sentence", "label": "gold"})
  with pytest.raises(ValueError, match=message):  # Also a ValueError, for callers that catch those.
    list(files.iter_records(str(path)))


def test_jsonl_values_and_errors(tmp_path):
  path = tmp_path / "in.jsonl"
  path.write_text('{"text": "one", "b": "x"}\n\n{"text": "two", "b": null}\n', encoding="utf-8")
  assert list(files.iter_records(str(path))) == ["one", "two"]
  assert list(files.iter_records(str(path), pair_column="b")) == [("one", "x"), ("two", "")]
  path.write_text('{"text": "one"}\n{"text": 3}\n', encoding="utf-8")
  with pytest.raises(ValueError, match=r"in.jsonl, line 2: field 'text' is a int, not text"):
    files.scan(str(path))
  path.write_text('{"text": "one"}\n{"text": \n', encoding="utf-8")
  with pytest.raises(ValueError, match=r"in.jsonl, line 2: not valid JSON \(.*\); each line must be one JSON object"):
    files.scan(str(path))
  path.write_text('[1]\n', encoding="utf-8")
  with pytest.raises(ValueError, match=r"in.jsonl, line 1: a JSON list, not an object; each line must be an object "
                     "with tokens and tags"):
    ner.read_ner_file(path)


def test_bad_inputs_name_file_and_line(tmp_path):
  path = tmp_path / "latin1.txt"
  path.write_bytes("fine\nstill fine\ncaf\xe9\n".encode("latin-1"))
  with pytest.raises(ValueError, match=r"latin1.txt, line 3: byte 4 \(b'\\xe9'\) is not UTF-8"):
    files.scan(str(path))
  for suffix in (".csv", ".tsv"):
    bad = tmp_path / f"latin1{suffix}"
    bad.write_bytes("text\nok\ncaf\xe9\n".encode("latin-1"))
    with pytest.raises(ValueError, match=rf"latin1\{suffix}, line 3: byte 4"):
      files.scan(str(bad))
    with pytest.raises(ValueError, match=rf"latin1\{suffix}, line 3: byte 4"):
      local.read_examples(bad, {"text_a": "text"})
  empty = tmp_path / "empty.txt"
  empty.write_bytes(b"")
  assert files.scan(str(empty)) == 0
  with pytest.raises(ValueError, match=r"Cannot tell the format of .*\.parquet"):
    files.scan(str(tmp_path / "x.parquet"))
  with pytest.raises(FileNotFoundError, match="does not exist"):
    files.scan(str(tmp_path / "missing.txt"))
  csv_path = tmp_path / "embed.csv"
  csv_path.write_text("text\na\n", encoding="utf-8")
  with pytest.raises(ValueError, match=r"--pairs reads `A<TAB>B` lines of a .txt file"):
    files.scan(str(csv_path), pairs=True)


def test_task_readers_accept_bom_and_crlf(tmp_path):
  conll = tmp_path / "t.txt"
  conll.write_bytes(BOM + b"EU B-ORG\r\nrejects O\r\n\r\nPeter B-PER\r\n")
  assert [(s["tokens"], s["tags"]) for s in ner.read_ner_file(conll)] == [
      (["EU", "rejects"], ["B-ORG", "O"]), (["Peter"], ["B-PER"])]
  swag = tmp_path / "swag.csv"
  swag.write_bytes(BOM + b'sent1,sent2,ending0,ending1,label\r\n"A ""man""",He,runs.,sits.,1\r\n')
  assert multiple_choice.read_multiple_choice_file(swag) == [
      {"context": 'A "man"', "endings": ["He runs.", "He sits."], "label": 1, "where": f"line 2 of {swag}"}]
  squad_file = tmp_path / "dev.json"
  squad_file.write_bytes(BOM + json.dumps({"data": [{"title": "t", "paragraphs": [{"context": "c", "qas": [
      {"id": "q", "question": "why?", "answers": []}]}]}]}).encode("utf-8"))
  assert [ex["question"] for ex in squad.read_squad_json(squad_file)] == ["why?"]


def test_long_csv_and_tsv_fields_read_and_a_field_too_long_says_its_size(tmp_path, monkeypatch):
  """A well-formed file with a 200,000-character field was refused ("field larger than field limit; fix the
  quoting": Python's csv default is 131,072); past jbert's own limit the message gives the field's real size,
  and says when an unclosed quote is what made it so long."""
  long_text = 'a "quoted", b\n' * 15_000  # 210,000 characters, with quotes, separators and newlines inside
  csv_path = tmp_path / "long.csv"
  with open(csv_path, "w", encoding="utf-8", newline="") as f:
    csv.writer(f).writerows([("id", "text"), ("1", "short"), ("2", long_text), ("3", "end")])
  tsv_path = tmp_path / "long.tsv"
  tsv_path.write_text(f"id\ttext\n1\tshort\n2\t{'w' * 200_000}\n3\tend\n", encoding="utf-8")
  assert list(files.iter_records(str(csv_path))) == ["short", long_text, "end"]
  assert list(files.iter_records(str(tsv_path))) == ["short", "w" * 200_000, "end"]
  assert local.read_examples(csv_path, {"text_a": "text"})[1]["text_a"] == long_text
  monkeypatch.setattr(files, "MAX_FIELD_CHARS", 1000)
  with pytest.raises(ValueError, match=r"^\S*long.csv, line 3: field 2 holds 210,000 characters, more than the 1,000 "
                     r"a field may hold; split that text into shorter ones\.$"):
    files.scan(str(csv_path))
  with pytest.raises(ValueError, match=r"^\S*long.tsv, line 3: field 2 holds 200,000 characters, more than the 1,000"):
    files.scan(str(tsv_path))
  unclosed = tmp_path / "unclosed.csv"
  unclosed.write_text('id,text\n1,ok\n2,"opens here\n' + "x" * 3000 + "\n3,end\n", encoding="utf-8")
  with pytest.raises(ValueError, match=r"^\S*unclosed.csv, line 3: field 2 opens a quote that is never closed, so "
                     r"it runs to the end of the file \(3,018 characters, more than the 1,000 a field may hold\); "
                     r'close the quote on that line \(a `"` inside a quoted field is written `""`\)\.$'):
    files.scan(str(unclosed))
  header = tmp_path / "header.csv"
  header.write_text("y" * 1500 + ",b\n1,2\n", encoding="utf-8")
  with pytest.raises(ValueError, match=r"^\S*header.csv, line 1: field 1 holds 1,500 characters"):
    files.columns(header)


def test_a_lone_surrogate_escape_is_named_by_file_and_line(tmp_path):
  """`"\\ud800"` is valid JSON but no text: it reached the tokenizer (a TypeError without file or line, after the
  model loaded); a full pair is one character and reads."""
  path = tmp_path / "in.jsonl"
  path.write_text('{"text": "pair \\ud83d\\ude00"}\n{"id": 2, "text": "half \\ud800 alone"}\n', encoding="utf-8")
  message = (r"^\S*in.jsonl, line 2: field 'text' holds the escape \\ud800, half of a UTF-16 surrogate pair without "
             r"its other half, which is no character; write the character itself, or both halves of its pair "
             r"\(e.g. \\ud83d\\ude00\)\.$")
  with pytest.raises(ValueError, match=message):
    files.scan(str(path))
  with pytest.raises(ValueError, match=message):
    _predict_inputs(str(path))
  path.write_text('{"text": "pair \\ud83d\\ude00"}\n', encoding="utf-8")
  assert list(files.iter_records(str(path))) == ["pair \U0001F600"]
  nested = tmp_path / "dev.json"
  nested.write_text('{"data": [{"title": "t",\n "paragraphs": [{"context": "c \\udfff", "qas": []}]}]}',
                    encoding="utf-8")
  with pytest.raises(ValueError, match=r"^\S*dev.json, line 2: field 'context' holds the escape \\udfff"):
    squad.read_squad_json(nested)


@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
def test_a_header_that_looks_like_data_is_said_to_be_one(tmp_path, suffix):
  """A file without a header row gave its first data row as "the available columns" and no more; the message
  says that line is read as the header and looks like data."""
  sep = "," if suffix == ".csv" else "\t"
  path = tmp_path / f"no_header{suffix}"
  path.write_text(f"a fine movie to watch{sep}1\nnot good at all{sep}0\n", encoding="utf-8")
  note = (f"The first line of {path} is read as its header (the column names) and looks like data: if the file has "
          "no header row, add one naming the columns.")
  with pytest.raises(files.MissingColumnError) as error:
    files.scan(str(path))
  assert str(error.value) == (f"column(s) ['text'] not in row 0 of {path} (line 2); available columns: "
                              f"['a fine movie to watch', '1']. {note} Pass --column (and --pair_column) naming the "
                              "text.")
  with pytest.raises(KeyError, match=re.escape(note + " Set --config.task.text_a to a column of the file.")):
    local.read_examples(path, {"text_a": "sentence"})
  with pytest.raises(ValueError, match=re.escape(note)):
    _predict_inputs(str(path))
  assert files.looks_like_data(["sentence", "label"]) is False
  assert files.looks_like_data(["id", "sentence 1", "sentence 2", "score"]) is False
  assert all(files.looks_like_data(h) for h in (["x", "3.5"], ["", "b"], ["a", "a"], ["the cat sat on", "y"]))
