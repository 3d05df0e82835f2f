"""`python -m jbert.data prepare`: every format gives the documents of the same text in a plain file; the output is
the same bytes for any worker or host count and after a kill -9 and rerun; bad records are counted, never fatal;
a file that is not what its name says is one line naming it."""
import gzip
import hashlib
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from array_record.python import array_record_module

import storage_faults
from jbert import errors
from jbert.data import formats
from jbert.data import manifest as manifest_lib
from jbert.data import prepare
from jbert.data import prepared
from jbert.data import sources
from jbert.runtime import processes

REPO = pathlib.Path(__file__).resolve().parents[2]
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]


def sentence(d: int, s: int) -> str:
  return f"Document {d} says {WORDS[(d + s) % 10]} {WORDS[(3 * d + s) % 10]} in sentence {s}."


DOCUMENTS = [[sentence(d, s) for s in range(1 + d % 5)] for d in range(60)]


def options(inputs, output, **changes) -> prepare.Options:
  settings = {k: changes.pop(k) for k in list(changes) if k in formats.Settings.__dataclass_fields__}
  return prepare.Options(inputs=str(inputs), output=str(output), settings=formats.Settings(**settings),
                         **{"workers": 1, "shard_mb": 0.002, "eval_documents": 4, **changes})


def corpus(directory) -> list[list[str]]:
  """Every document of a prepared corpus, in corpus order."""
  manifest = manifest_lib.read(str(directory))
  found = []
  for shard in manifest["shards"]:
    reader = array_record_module.ArrayRecordReader(os.path.join(str(directory), shard["name"]))
    found += [r.decode().split("\n") for r in reader.read(list(range(reader.num_records())))]
    reader.close()
  assert len(found) == manifest["documents"]
  return found


def tree(directory) -> dict[str, str]:
  root = pathlib.Path(directory)
  return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
          if p.is_file()}


def plain_text(path) -> pathlib.Path:
  path.write_text("\n\n".join("\n".join(doc) for doc in DOCUMENTS) + "\n")
  return path


def test_every_format_gives_the_documents_of_the_same_text_in_a_plain_file(tmp_path):
  text = plain_text(tmp_path / "plain.txt")
  expected = [sources.TextFiles(str(text))[i] for i in range(len(DOCUMENTS))]
  assert expected == DOCUMENTS  # sentencex splits these sentences as they were written
  lines = [json.dumps({"id": str(d), "text": "\n".join(doc)}) + "\n" for d, doc in enumerate(DOCUMENTS)]
  (tmp_path / "docs.jsonl").write_text("".join(lines))
  (tmp_path / "docs.jsonl.gz").write_bytes(gzip.compress("".join(lines).encode()))
  (tmp_path / "docs.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress("".join(lines).encode()))
  (tmp_path / "bert.txt").write_text("\n\n".join("\n".join(doc) for doc in DOCUMENTS))
  table = pa.table({"id": [str(d) for d in range(60)], "url": ["u"] * 60, "title": ["t"] * 60,
                    "text": [" ".join(doc) for doc in DOCUMENTS]})  # Hugging Face's wikimedia/wikipedia layout
  pq.write_table(table, tmp_path / "train-00000-of-00001.parquet", row_group_size=7)
  memory = fsspec.filesystem("memory")
  memory.pipe("/corpus/plain.txt", text.read_bytes())
  memory.pipe("/corpus/docs.jsonl.gz", gzip.compress("".join(lines).encode()))
  cases = {"text in byte ranges": (text, {}), "jsonl": (tmp_path / "docs.jsonl", {}),
           "jsonl.gz": (tmp_path / "docs.jsonl.gz", {}), "jsonl.zst": (tmp_path / "docs.jsonl.zst", {}),
           "bert": (tmp_path / "bert.txt", {"format": "bert"}),
           "parquet": (tmp_path / "train-00000-of-00001.parquet", {}),
           "memory:// text": ("memory://corpus/plain.txt", {}), "memory:// jsonl.gz": ("memory://corpus/*.gz", {})}
  try:
    for name, (path, changes) in cases.items():
      out = tmp_path / name.replace(" ", "_").replace("/", "")
      manifest = prepare.prepare(options(path, out, **changes), log=lambda line: None)
      assert corpus(out) == expected, name
      assert manifest["bad_records"] == {}, name
    units = manifest_lib.read_json(str(tmp_path / "text_in_byte_ranges" / "plan.json"))["shards"]
    assert sum(len(s) for s in units) > 3  # the plain file was read as several byte ranges
    assert len(pq.ParquetFile(tmp_path / "train-00000-of-00001.parquet").metadata.to_dict()["row_groups"]) == 9
  finally:
    memory.rm("/corpus", recursive=True)


def test_held_out_documents_are_a_seeded_sample_of_several_sentences(tmp_path):
  manifest = prepare.prepare(options(plain_text(tmp_path / "plain.txt"), tmp_path / "out", eval_documents=6),
                             log=lambda line: None)
  held = manifest["held_out"]["documents"]
  assert len(held) == 6 and held == sorted(held) and manifest["held_out"]["several_sentences"] == 6
  assert all(len(DOCUMENTS[d]) > 1 for d in held)
  again = prepare.prepare(options(tmp_path / "plain.txt", tmp_path / "seed1", eval_documents=6, seed=1),
                          log=lambda line: None)
  assert again["held_out"]["documents"] != held
  tiny = prepare.prepare(options(plain_text(tmp_path / "plain.txt"), tmp_path / "tenth", eval_documents=2000),
                         log=lambda line: None)
  assert len(tiny["held_out"]["documents"]) == 6  # at most a tenth of the 60 documents


def test_bad_records_are_counted_reported_and_skipped(tmp_path):
  long_line = "word " * 2_000_000  # a 10 MB line
  records = [b'{"text": "A fine document. It has two sentences."}', b'{"text": ""}', b'{"text": "caf\xe9 au lait."}',
             b'{"text": "A lone surrogate \\ud800 here."}',
             b'this is not json', b'{"title": "no text field"}', b'{"text": null}', b'[1, 2]',
             json.dumps({"text": long_line}).encode(), b'{"text": "The last one."}']
  (tmp_path / "bad.jsonl").write_bytes(b"\n".join(records) + b"\n")
  lines = []
  manifest = prepare.prepare(options(tmp_path / "bad.jsonl", tmp_path / "out", shard_mb=1000), log=lines.append)
  assert manifest["bad_records"] == {"empty": 1, "missing_text": 2, "not_json": 2, "truncated_lines": 1,
                                     "undecodable": 2}
  assert manifest["bad_records_by_input"] == {str(tmp_path / "bad.jsonl"): manifest["bad_records"]}
  assert [doc[0][:20] for doc in corpus(tmp_path / "out")] == [
      "A fine document.", "caf\ufffd au lait.", "A lone surrogate \ufffd h", "word word word word ", "The last one."]
  assert "prepare: bad records: 1 no text (dropped); 2 records without a text field" in "\n".join(lines)
  # With a smaller record limit the 10 MB line is dropped unread instead of cut.
  manifest = prepare.prepare(options(tmp_path / "bad.jsonl", tmp_path / "small", shard_mb=1000,
                                     max_record_bytes=1 << 20), log=lambda line: None)
  assert manifest["bad_records"]["oversized"] == 1 and manifest["documents"] == 4


def test_nothing_usable_is_an_error_naming_the_inputs(tmp_path):
  (tmp_path / "empty.jsonl").write_text('{"text": ""}\n{"text": "  "}\n')
  (tmp_path / "zero.jsonl").write_text("")  # no records at all: not a mislabelled file
  with pytest.raises(ValueError, match=r"nothing usable in .*empty.jsonl, .*zero.jsonl: every record was bad \(2 no "
                                       r"text"):
    prepare.prepare(options(tmp_path / "*.jsonl", tmp_path / "out"), log=lambda line: None)
  assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.parametrize("name, data, flags, message", [
    ("wiki.parquet", b'{"text": "json, not parquet"}\n', {},
     r"wiki.parquet is not a Parquet file \(it does not start with PAR1; it looks like JSON\): rename it"),
    ("docs.jsonl", b"Plain text, one sentence.\nAnother.\n", {},
     r"docs.jsonl is not JSON Lines: its first line is not a JSON object \('Plain text, one sentence.', text\)"),
    ("docs.jsonl", b'{"body": "x"}\n', {}, r"docs.jsonl: its records have no field 'text' \(the first has body\); "
                                          r"pass --text_key=NAME."),
    ("docs.txt", bytes(range(256)) * 8, {}, r"docs.txt is not UTF-8 text"),
    ("docs.txt", b"PAR1" + b"\0" * 100, {}, r"docs.txt is a Parquet file, not text: name it .parquet"),
    ("docs.parquet", None, {"text_column": "body"}, r"docs.parquet has no column 'body' \(its columns: id, text\); "
                                                     r"pass --text_column=NAME."),
])
def test_a_file_that_is_not_what_its_name_says_is_named(tmp_path, name, data, flags, message):
  if data is None:
    pq.write_table(pa.table({"id": ["1"], "text": ["x"]}), tmp_path / name)
  else:
    (tmp_path / name).write_bytes(data)
  with pytest.raises(ValueError, match=message):
    prepare.prepare(options(tmp_path / name, tmp_path / "out", **flags), log=lambda line: None)
  assert not (tmp_path / "out" / "plan.json").exists()


def test_a_rerun_with_other_inputs_or_settings_is_refused(tmp_path):
  text = plain_text(tmp_path / "plain.txt")
  prepare.prepare(options(text, tmp_path / "out"), log=lambda line: None)
  with pytest.raises(ValueError, match=r"holds a preparation of other inputs or settings \(--language 'en' -> 'de'\)"):
    prepare.prepare(options(text, tmp_path / "out", language="de"), log=lambda line: None)
  text.write_text(text.read_text() + "One more document.\n")
  with pytest.raises(ValueError, match=r"\(input .*plain.txt: \d+ -> \d+ bytes\)"):
    prepare.prepare(options(text, tmp_path / "out"), log=lambda line: None)
  # Every difference is named, not the first one alone.
  (tmp_path / "new.txt").write_text("A new file.\n")
  size = text.stat().st_size
  with pytest.raises(ValueError) as error:
    prepare.prepare(options(tmp_path / "*.txt", tmp_path / "out", shard_mb=0.004, language="de"),
                    log=lambda line: None)
  assert str(error.value) == (
      f"{tmp_path}/out holds a preparation of other inputs or settings (--language 'en' -> 'de'; --shard_mb 0.002 "
      f"-> 0.004; input {tmp_path}/new.txt: new; input {text}: {size - 19} -> {size} bytes); pass another "
      "--output, or the same --input and settings to finish or reuse it.")


def cli(*args, **kwargs):
  return subprocess.Popen([sys.executable, "-m", "jbert.data", "prepare", *args], cwd=REPO, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)


@pytest.fixture(scope="module")
def big(tmp_path_factory):
  """A corpus of 10 files of 400 kB, about 40 shards, and its uninterrupted preparation in this process."""
  root = tmp_path_factory.mktemp("big")
  for f in range(10):
    (root / f"part-{f:02d}.txt").write_text("\n\n".join(
        " ".join(sentence(d, s) for s in range(8)) for d in range(f * 1100, f * 1100 + 1100)) + "\n")
  reference = root / "reference"
  prepare.prepare(options(root / "part-*.txt", reference, shard_mb=0.1, workers=1), log=lambda line: None)
  return root, reference


def test_two_hosts_write_what_one_process_writes(big, tmp_path):
  root, reference = big
  assert len(manifest_lib.read(str(reference))["shards"]) >= 40
  out = tmp_path / "hosts"
  flags = [f"--input={root}/part-*.txt", f"--output={out}", "--shard_mb=0.1", "--eval_documents=4"]
  hosts = [cli(*flags, "--num_hosts=2", f"--host_index={i}", "--workers=1") for i in range(2)]
  outputs = [h.communicate(timeout=300) for h in hosts]
  assert [h.returncode for h in hosts] == [0, 0], outputs
  assert tree(out) == tree(reference)
  assert any("host 1 of 2 writes" in o for o, _ in outputs)


def test_kill_9_then_the_same_command_gives_the_uninterrupted_output(big, tmp_path):
  """Two worker processes each time: equal to the reference (one process), so the worker count changes nothing."""
  root, reference = big
  out = tmp_path / "out"
  flags = [f"--input={root}/part-*.txt", f"--output={out}", "--shard_mb=0.1", "--eval_documents=4", "--workers=2"]
  proc = cli(*flags, start_new_session=True)
  parts, deadline = out / "parts", time.monotonic() + 120
  while time.monotonic() < deadline and len(list(parts.glob("*.json")) if parts.exists() else []) < 4:
    time.sleep(0.005)
  os.killpg(proc.pid, signal.SIGKILL)  # the command; its workers (a process group of their own) die with it
  proc.wait()
  deadline = time.monotonic() + 10
  while workers_of(proc.pid) and time.monotonic() < deadline:
    time.sleep(0.01)
  assert not workers_of(proc.pid)
  written = tree(out)
  expected = tree(reference)
  shards = len(manifest_lib.read(str(reference))["shards"])
  assert "manifest.json" not in written and 4 <= len([k for k in written if k.startswith("parts/")]) < shards
  # Nothing half-written under a final name: every shard there is the finished shard.
  finals = [k for k in written if not os.path.basename(k).startswith(".")]  # temporaries start with a dot
  assert finals and all(written[k] == expected[k] for k in finals)
  # A kill can also land while a shard's record is written: its temporary in parts/ goes too (a dead pid's).
  dead = 2 ** 22 + 12345  # above Linux's pid_max default: no such process
  (parts / f".documents-00000-of-{shards:05d}.json.{socket.gethostname()}.{dead}.tmp").write_bytes(b"{")
  rerun = cli(*flags)
  stdout, stderr = rerun.communicate(timeout=300)
  assert rerun.returncode == 0, stderr
  assert "already written" in stdout
  assert tree(out) == expected  # the killed run's temporary files are gone too


def test_a_tfds_split_is_read_in_ranges_of_examples(tmp_path, monkeypatch):
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  examples = [{"text": "\n".join(doc).encode(), "title": b"t"} for doc in DOCUMENTS]
  monkeypatch.setattr(formats, "TFDS_UNIT", 16)
  with tfds.testing.mock_data(as_data_source_fn=lambda self, split, **kwargs: examples):
    manifest = prepare.prepare(options("tfds:wikipedia/20230601.en:train", tmp_path / "out"), log=lambda line: None)
  assert corpus(tmp_path / "out") == DOCUMENTS and len(manifest["shards"]) == 4
  assert manifest["inputs"] == [{"path": "tfds:wikipedia/20230601.en:train", "format": "tfds", "bytes": 0}]


def test_the_command_s_mistakes_are_one_line_and_exit_status_2(tmp_path):
  (tmp_path / "wiki.parquet").write_text('{"text": "json"}\n')
  plain_text(tmp_path / "plain.txt")
  out = tmp_path / "out"
  cases = [
      ([f"--input={tmp_path}/wiki.parquet", f"--output={out}"],
       f"jbert.data: {tmp_path}/wiki.parquet is not a Parquet file (it does not start with PAR1; it looks like JSON): "
       "rename it to its real suffix, or pass --format."),
      ([f"--output={out}", "--finalize"],
       f"jbert.data: {out}: 5 of 9 shards are not written yet (shards 0, 2, 4, 6, 8); run prepare on every host (the "
       "same command; each writes its own share) before --finalize."),
  ]
  lines = []  # host 1 of 2 has written its share
  prepare.prepare(options(tmp_path / "plain.txt", out, num_hosts=2, host_index=1, shard_mb=0.001), log=lines.append)
  assert "host 0 writes the manifest once every host's are (5 shard(s) to go)" in lines[-1]
  for flags, message in cases:
    proc = cli(*flags)
    _, stderr = proc.communicate(timeout=120)
    assert (proc.returncode, stderr) == (2, message + "\n"), flags


def test_a_full_disk_is_one_line_keeps_what_was_written_and_a_rerun_finishes(big, tmp_path, monkeypatch):
  root, reference = big
  out = tmp_path / "disk"
  out.mkdir()
  if storage_faults.CAN_MOUNT:  # a real file system that fills up after a few shards
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(out)], check=True)
  else:  # ArrayRecord's own words for ENOSPC, from the tenth shard on
    real, made = array_record_module.ArrayRecordWriter, []

    def writer(path, options):
      made.append(path)
      if len(made) >= 10:
        raise RuntimeError(f"write() failed: No space left on device; writing {path}")
      return real(path, options)
    monkeypatch.setattr(array_record_module, "ArrayRecordWriter", writer)
  try:
    flags = {"shard_mb": 0.1, "workers": 1}
    with pytest.raises((ValueError, OSError)) as error:  # a shard, or the part file marking it done
      prepare.prepare(options(root / "part-*.txt", out, **flags), log=lambda line: None)
    message = errors.one_line(error.value)  # the line the command prints
    assert "No space left on device" in message and str(out) in message
    written, expected = tree(out), tree(reference)
    assert "manifest.json" not in written and any(k.startswith("parts/") for k in written)
    assert all(written[k] == expected[k] for k in written)  # no temporary left, no shard half-written
    if storage_faults.CAN_MOUNT:
      subprocess.run(["mount", "-o", "remount,size=64m", str(out)], check=True)  # the user frees space
    else:
      monkeypatch.undo()
    prepare.prepare(options(root / "part-*.txt", out, **flags), log=lambda line: None)
    assert tree(out) == expected
  finally:
    if storage_faults.CAN_MOUNT:
      subprocess.run(["umount", str(out)], check=True)


def test_damaged_or_missing_shards_are_written_again_alone_by_the_same_command(big, tmp_path):
  """A truncated shard, one with a flipped byte (same size) and a deleted one: the rerun names them, writes those
  three again and nothing else, and the corpus is the uninterrupted one byte for byte."""
  root, reference = big
  out = tmp_path / "out"
  shutil.copytree(reference, out)  # copy2: the mtimes of the copies are the reference's
  names = sorted(p.name for p in out.glob("*.array_record"))
  truncated, flipped, deleted = out / names[3], out / names[7], out / names[11]
  truncated.write_bytes(truncated.read_bytes()[:10_000])
  data = bytearray(flipped.read_bytes())
  data[len(data) // 3] ^= 0xFF
  flipped.write_bytes(bytes(data))
  deleted.unlink()
  before = {n: (out / n).stat().st_mtime_ns for n in names if (out / n).exists()}
  proc = cli(f"--input={root}/part-*.txt", f"--output={out}", "--shard_mb=0.1", "--eval_documents=4", "--workers=2")
  stdout, stderr = proc.communicate(timeout=300)
  assert proc.returncode == 0, stderr
  assert (f"prepare: 3 written shard(s) are damaged or missing and are written again: {names[3]} holds 10,000 "
          f"bytes, not the ") in stdout
  assert f"{names[7]} has CRC32C " in stdout and f"{names[11]} is missing" in stdout
  rewritten = {n for n in names if (out / n).stat().st_mtime_ns != before.get(n)}
  assert rewritten == {names[3], names[7], names[11]}
  assert tree(out) == tree(reference)


@pytest.mark.parametrize("signals", [["SIGINT"], ["SIGINT", "SIGINT"], ["SIGTERM"]])
def test_ctrl_c_and_sigterm_stop_the_workers_at_once_and_the_same_command_finishes(big, tmp_path, signals):
  """What a terminal sends (the signal to the whole process group), once, twice in quick succession, and SIGTERM:
  the command ends within seconds with one line and the signal's status, leaves no process and no temporary file,
  and the same command then finishes to the uninterrupted corpus."""
  root, reference = big
  out = tmp_path / "out"
  flags = [f"--input={root}/part-*.txt", f"--output={out}", "--shard_mb=0.1", "--eval_documents=4", "--workers=2"]
  proc = cli(*flags, start_new_session=True)
  parts, deadline = out / "parts", time.monotonic() + 120
  while time.monotonic() < deadline and len(list(parts.glob("*.json")) if parts.exists() else []) < 2:
    time.sleep(0.005)
  assert proc.poll() is None, "prepare finished before it could be interrupted"
  sent = time.monotonic()
  for name in signals:
    os.killpg(proc.pid, getattr(signal, name))
    time.sleep(0.05)
  stdout, stderr = proc.communicate(timeout=10)
  assert time.monotonic() - sent < 3
  assert proc.returncode == (143 if signals == ["SIGTERM"] else 130), stderr
  assert stderr == ("jbert.data: prepare interrupted; rerun the same command to finish it (the shards written are "
                    "kept).\n")  # no traceback, no resource tracker's "leaked semaphore" warning
  # Killed and reaped before the command ends; after a second signal, which ends it at once, they die with it.
  deadline = time.monotonic() + 3
  while workers_of(proc.pid) and time.monotonic() < deadline:
    time.sleep(0.01)
  assert not workers_of(proc.pid)
  written = tree(out)
  if len(signals) == 1:  # the killed workers' temporaries are swept (else by the rerun)
    assert not [k for k in written if os.path.basename(k).startswith(".")]
  assert "manifest.json" not in written and len([k for k in written if k.startswith("parts/")]) < 41
  rerun = cli(*flags)
  stdout, stderr = rerun.communicate(timeout=300)
  assert rerun.returncode == 0, stderr
  assert tree(out) == tree(reference)


def workers_of(parent: int) -> list[str]:
  """The command lines of the live worker processes of prepare process `parent` (they name it last)."""
  found = []
  for entry in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{entry}/cmdline", "rb") as f:
        args = f.read().decode(errors="replace").split("\0")[:-1]
    except OSError:
      continue
    if "jbert.data.workers" in args and args[-1] == str(parent) and processes.alive(int(entry)):
      found.append(" ".join(args))
  return found


def test_a_preparation_of_an_older_jbert_is_refused_by_readers_and_upgraded_by_the_same_command(tmp_path):
  """Version 1 recorded no shard sizes or checksums: training refuses it in one line, and the same prepare command
  writes its shards again, recording them, to the corpus this jbert writes."""
  out = tmp_path / "out"
  prepare.prepare(options(plain_text(tmp_path / "plain.txt"), out), log=lambda line: None)
  expected = tree(out)
  for path in [out / "plan.json", out / "manifest.json", *(out / "parts").glob("*.json")]:
    record = json.loads(path.read_text())
    record.pop("bytes", None), record.pop("crc32c", None)
    if "version" in record:
      record["version"] = 1
    path.write_text(json.dumps(record))
  with pytest.raises(ValueError, match=r"manifest.json is version 1 of the prepared format; this jbert reads "
                                       r"version 2: rerun the `python -m jbert.data prepare` command"):
    prepared.PreparedDocuments(str(out))
  lines = []
  prepare.prepare(options(tmp_path / "plain.txt", out), log=lines.append)
  assert lines[0].startswith("prepare: 5 written shard(s) are damaged or missing and are written again: "
                             "documents-00000-of-00005.array_record has no recorded checksum (an older jbert's)")
  assert tree(out) == expected
