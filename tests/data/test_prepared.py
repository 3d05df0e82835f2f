"""Training on a prepared corpus (`data.source=prepared`): its splits, its vocabulary, a start that reads no
document whatever the corpus size, exact resume and the same global batches for 1 and 2 processes."""
import dataclasses
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from array_record.python import array_record_data_source
from array_record.python import array_record_module

from jbert.data import config as data_config
from jbert.data import formats
from jbert.data import loader
from jbert.data import manifest as manifest_lib
from jbert.data import prepare
from jbert.data import prepared
from jbert.data import shards as shards_lib
from jbert.data import streams

REPO = pathlib.Path(__file__).resolve().parents[2]
SENTENCES = [f"Item {d} has part {s} of the story about the {['red', 'green', 'blue'][d % 3]} house."
             for d in range(120) for s in range(4)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """120 documents of 1-4 sentences, 12 held out, with a WordPiece vocabulary trained by prepare."""
  root = tmp_path_factory.mktemp("prepared")
  (root / "story.txt").write_text("\n\n".join(" ".join(SENTENCES[4 * d:4 * d + 1 + d % 4]) for d in range(120)))
  prepare.prepare(prepare.Options(inputs=str(root / "story.txt"), output=str(root / "corpus"), workers=1,
                                  shard_mb=0.001, eval_documents=12, train_vocab=120), log=lambda line: None)
  return str(root / "corpus")


def data_cfg(directory, **changes):
  cfg = data_config.default_pretrain_config()
  cfg.source, cfg.prepared = "prepared", directory
  cfg.max_seq_length, cfg.max_predictions_per_seq, cfg.docs_per_group, cfg.prefetch_groups = 32, 5, 16, 0
  for key, value in changes.items():
    cfg[key] = value
  return cfg


def test_the_splits_partition_the_corpus_in_order(corpus):
  manifest = manifest_lib.read(corpus)
  held = manifest["held_out"]["documents"]
  train, held_out = prepared.PreparedDocuments(corpus, "train"), prepared.PreparedDocuments(corpus, "eval")
  assert (len(train), len(held_out)) == (108, 12)
  rest = [d for d in range(120) if d not in held]
  np.testing.assert_array_equal(train.corpus_index(np.arange(108)), rest)
  np.testing.assert_array_equal(held_out.corpus_index(np.arange(12)), held)
  story = [s for d in range(120) for s in SENTENCES[4 * d:4 * d + 1 + d % 4]]
  documents = {int(train.corpus_index([i])[0]): train[i] for i in range(108)}
  documents.update({held[i]: held_out[i] for i in range(12)})
  assert [s for d in range(120) for s in documents[d]] == story  # sentence-split once, by prepare


def test_the_corpus_brings_its_vocabulary(corpus, tmp_path):
  tokenizer = loader.build_tokenizer(data_cfg(corpus))
  assert tokenizer.vocab_size == 120 and tokenizer.convert_ids_to_tokens([0, 1, 2, 3, 4]) == [
      "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  assert tokenizer.tokenize("Item 7 has part 2")[:3] == ["item", "7", "has"]
  bare = tmp_path / "bare"
  prepare.prepare(prepare.Options(inputs=os.path.join(os.path.dirname(corpus), "story.txt"), output=str(bare),
                                  workers=1), log=lambda line: None)
  with pytest.raises(ValueError, match=r"carries no vocabulary: set --config.data.vocab=PATH .* or prepare the "
                                       r"corpus with --vocab=PATH or --train_vocab=30522."):
    loader.build_tokenizer(data_cfg(str(bare)))
  assert loader.build_tokenizer(data_cfg(str(bare), vocab=os.path.join(corpus, "vocab.txt"))).vocab_size == 120
  # Copied in: the same bytes. A rerun of a finished preparation keeps the vocabulary it trained.
  story = os.path.join(os.path.dirname(corpus), "story.txt")
  vocab = os.path.join(corpus, "vocab.txt")
  prepare.prepare(prepare.Options(inputs=story, output=str(tmp_path / "copied"), workers=1, vocab=vocab),
                  log=lambda line: None)
  with open(tmp_path / "copied" / "vocab.txt", "rb") as copy, open(vocab, "rb") as f:
    assert copy.read() == f.read()
  lines, before = [], os.stat(vocab).st_mtime_ns
  prepare.prepare(prepare.Options(inputs=story, output=corpus, workers=1, shard_mb=0.001, eval_documents=12,
                                  train_vocab=120), log=lines.append)
  assert lines[-1] == f"prepare: {corpus} is already prepared (120 documents); nothing to do."
  assert os.stat(vocab).st_mtime_ns == before
  with pytest.raises(ValueError, match=r"--vocab=.*story.txt is not a usable vocabulary: Vocabulary .* lacks the "
                                       r"special tokens"):
    prepare.prepare(prepare.Options(inputs=story, output=str(tmp_path / "bad"), workers=1, vocab=story),
                    log=lambda line: None)


def test_missing_or_unfinished_corpora_say_what_to_run(tmp_path):
  with pytest.raises(ValueError, match=r"needs data.prepared: prepare the corpus once with `python -m jbert.data "
                                       r"prepare --input=GLOB --output=DIR`"):
    loader.check_data(data_cfg(None), eval_enabled=False)
  with pytest.raises(ValueError, match=r"is not a prepared corpus \(no manifest.json\)"):
    loader.check_data(data_cfg(str(tmp_path)), eval_enabled=False)
  (tmp_path / "plan.json").write_text("{}")
  with pytest.raises(ValueError, match=r"is an unfinished preparation .* rerun the same"):
    loader.check_data(data_cfg(str(tmp_path)), eval_enabled=False)


def write_corpus(directory, documents: int, shards: int = 20) -> str:
  """A prepared corpus written directly: `documents` one-word documents, no vocabulary needed beyond digits."""
  os.makedirs(directory)
  per = documents // shards
  listing = []
  for s in range(shards):
    name = manifest_lib.shard_name(s, shards)
    writer = array_record_module.ArrayRecordWriter(os.path.join(directory, name), prepare.ARRAY_RECORD_OPTIONS)
    for d in range(s * per, (s + 1) * per):
      writer.write(f"{d % 10} {d % 7} {d % 3}.\n{d % 5} {d % 9}.".encode())
    writer.close()
    path = os.path.join(directory, name)
    listing.append({"name": name, "documents": per, "sentences": 2 * per, "bytes": os.path.getsize(path),
                    "crc32c": shards_lib.crc32c(path)})
  manifest = {"format": manifest_lib.FORMAT, "version": manifest_lib.VERSION, "shards": listing,
              "settings": {"max_line_chars": 20_000}, "documents": documents, "sentences": 2 * documents,
              "held_out": {"documents": list(range(0, documents, documents // 10))[:10]}, "vocab": None}
  with open(os.path.join(directory, "manifest.json"), "w", encoding="utf-8") as f:
    json.dump(manifest, f)
  with open(os.path.join(directory, "vocab.txt"), "w", encoding="utf-8") as f:
    f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *map(str, range(10))]) + "\n")
  return directory


def test_starting_to_train_reads_no_document_whatever_the_corpus_size(tmp_path, monkeypatch):
  opened, read = [], []
  real_reader = array_record_data_source._create_reader
  real_items = array_record_data_source.ArrayRecordDataSource.__getitems__
  monkeypatch.setattr(array_record_data_source, "_create_reader", lambda *a: opened.append(a[0]) or real_reader(*a))
  monkeypatch.setattr(array_record_data_source.ArrayRecordDataSource, "__getitems__",
                      lambda self, keys: read.extend(keys) or real_items(self, keys))
  for documents in (2_000, 200_000):
    directory = write_corpus(str(tmp_path / str(documents)), documents)
    cfg = data_cfg(directory, vocab=os.path.join(directory, "vocab.txt"), docs_per_group=64)
    tokenizer = loader.build_tokenizer(cfg)
    opened.clear(), read.clear()
    loader.check_data(cfg, eval_enabled=True, num_shards=2)
    it = loader.make_pretrain_iterator(cfg, tokenizer, global_batch_size=8, seed=0, process_count=2)
    assert (opened, read) == ([], []), documents  # the manifest alone
    next(it)
    assert 62 <= len(read) <= 64, documents  # one group (~64 documents) of this process, whatever the corpus size
    assert 0 < len(opened) <= 20


def test_resume_is_exact_and_two_processes_make_the_global_batches_of_one(corpus):
  cfg = data_cfg(corpus, max_seq_length=64, max_predictions_per_seq=10)  # rows that hold several sequences
  tokenizer = loader.build_tokenizer(cfg)
  both = streams.DataShards(num_shards=2, shards=(0, 1), rows_per_shard=4)

  def make(shards):  # pretraining's stream: one grain iterator per data shard of this process
    return streams.PretrainBatches(lambda shard, num_shards: loader.make_pretrain_iterator(
        cfg, tokenizer, global_batch_size=8, seed=3, process_index=shard, process_count=num_shards), shards)

  one = make(both)
  first = [next(one) for _ in range(6)]
  # Packed rows (the default) of several of these short documents' sequences: packing resumes exactly too.
  assert all(b["sequence_weights"].sum(1).max() > 1 for b in first)
  states = json.loads(json.dumps(one.get_states()))
  expected = [next(one) for _ in range(3)]
  halves = [make(streams.DataShards(2, (s,), 4)) for s in (0, 1)]
  for step in range(6):
    parts = [next(h) for h in halves]
    for key in first[step]:
      np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), first[step][key])
  resumed = make(both)
  resumed.set_states({int(k): v for k, v in states.items()})
  for want in expected:
    got = next(resumed)
    assert all(np.array_equal(got[k], want[k]) for k in want)


def test_evaluation_reads_only_the_held_out_documents_and_training_never_does(corpus):
  cfg = data_cfg(corpus)
  tokenizer = loader.build_tokenizer(cfg)
  held = set(manifest_lib.read(corpus)["held_out"]["documents"])

  def items(batches) -> set[int]:
    """The documents whose text the batches hold (`Item N` opens each sentence), read before masking."""
    found = set()
    for b in batches:
      ids = b["input_ids"].copy()
      rows, cols = np.nonzero(b["masked_lm_weights"])
      ids[rows, b["masked_lm_positions"][rows, cols]] = b["masked_lm_ids"][rows, cols]
      for row in ids:
        words = tokenizer.decode([int(i) for i in row], skip_special_tokens=True).split()
        found |= {int(words[i + 1]) for i, w in enumerate(words[:-1]) if w == "item" and words[i + 1].isdigit()}
    return found

  held_out = items(loader.make_eval_batches(cfg, tokenizer, global_batch_size=8, num_batches=3))
  it = loader.make_pretrain_iterator(cfg, tokenizer, global_batch_size=8, seed=0)
  train = items([next(it) for _ in range(40)])
  assert held_out <= held and len(held_out) >= 6
  assert not train & held and len(train) > 60


def show(directory, tmp_path) -> subprocess.CompletedProcess:
  """`python -m jbert.data --show=2` on the prepared corpus: what a training run reads, through the same loader."""
  config = tmp_path / "config.py"
  config.write_text(f'''
import ml_collections
from jbert.data import config as data_config

def get_config():
  config = ml_collections.ConfigDict()
  config.seed, config.batch_size = 0, 4
  config.data = data_config.default_pretrain_config()
  config.data.source, config.data.prepared = "prepared", {str(directory)!r}
  config.data.max_seq_length, config.data.max_predictions_per_seq = 32, 5
  return config
''')
  return subprocess.run([sys.executable, "-m", "jbert.data", f"--config={config}", "--show=2"], cwd=REPO,
                        capture_output=True, text=True, timeout=300, check=False,
                        env={**os.environ, "JAX_PLATFORMS": "cpu"})


def options_of(corpus_dir, output) -> prepare.Options:
  """The options that made the `corpus` fixture, into `output`."""
  return prepare.Options(inputs=os.path.join(os.path.dirname(corpus_dir), "story.txt"), output=str(output),
                         workers=1, shard_mb=0.001, eval_documents=12, train_vocab=120)


@pytest.mark.parametrize("damage", ["another_manifest", "truncated", "flipped", "missing"])
def test_a_damaged_corpus_is_one_line_naming_the_shard_and_the_same_prepare_mends_it(corpus, tmp_path, damage):
  """Another corpus's manifest over these shards (caught by size at open, or by CRC32C at a shard's first read), a
  truncated shard, a flipped byte, a missing shard: exit status 2 and one line naming the shard and the command."""
  out = tmp_path / "corpus"
  shutil.copytree(corpus, out)
  original = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
  names = [s["name"] for s in manifest_lib.read(str(out))["shards"]]
  shard = out / names[1]
  if damage == "another_manifest":  # the same inputs upper-cased: other shards under the same names
    other = tmp_path / "other.txt"
    other.write_text(open(os.path.join(os.path.dirname(corpus), "story.txt"), encoding="utf-8").read().upper())
    theirs = prepare.prepare(dataclasses.replace(options_of(corpus, tmp_path / "theirs"), inputs=str(other)),
                             log=lambda line: None)
    assert [s["name"] for s in theirs["shards"]] == names
    shutil.copy(tmp_path / "theirs" / "manifest.json", out / "manifest.json")
    expected = r"documents-00000-of-\d+\.array_record (holds [\d,]+ bytes, not the|has CRC32C \w+, not the \w+ of)"
  elif damage == "truncated":
    shard.write_bytes(shard.read_bytes()[:10_000])
    expected = rf"{names[1]} holds 10,000 bytes, not the {original[names[1]].__len__():,} prepare wrote"
  elif damage == "flipped":
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    expected = rf"{names[1]} has CRC32C \w{{8}}, not the \w{{8}} of the shard prepare wrote"
  else:
    shard.unlink()
    expected = rf"{names[1]} is missing"
  line = (rf"prepared corpus {out} is damaged: {expected}[^\n]*; rerun the `python -m jbert\.data prepare` command "
          r"that made it \(the same --input, --output and settings\): it writes again only the damaged or missing "
          r"shards, and the manifest\.")
  if damage in ("another_manifest", "flipped"):  # the command, once for damage found at open and once at a read
    result = show(out, tmp_path)
    assert result.returncode == 2 and re.fullmatch(rf"jbert\.data: {line}\n", result.stderr), result.stderr[-3000:]
  else:  # what a training run meets: the checks of the data, then its first batch
    cfg = data_cfg(str(out))
    with pytest.raises(ValueError) as error:
      loader.check_data(cfg, eval_enabled=True)
      next(loader.make_pretrain_iterator(cfg, loader.build_tokenizer(cfg), global_batch_size=8, seed=0))
    assert re.fullmatch(line, str(error.value)), str(error.value)
  prepare.prepare(options_of(corpus, out), log=lambda line: None)
  assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == original
  documents = prepared.PreparedDocuments(str(out))
  assert len(documents.get_many(range(len(documents)))) == 108  # every shard read, and checked, again


def test_a_shard_arrayrecord_cannot_decode_is_one_line_naming_it(corpus, tmp_path, monkeypatch):
  """Damage the checksum did not see (a bucket's shard changed after the listing at open): ArrayRecord's own
  error becomes the line naming the shard."""
  out = tmp_path / "corpus"
  shutil.copytree(corpus, out)
  documents = prepared.PreparedDocuments(str(out))
  monkeypatch.setattr(prepared.PreparedDocuments, "_verify", lambda self, shards: None)
  name = documents.manifest["shards"][0]["name"]
  data = bytearray((out / name).read_bytes())
  data[64:72] = b"\xff" * 8  # the header of the first chunk, after the file signature
  (out / name).write_bytes(bytes(data))
  with pytest.raises(ValueError) as error:
    documents.get_many([0])
  assert re.fullmatch(rf"prepared corpus {out} is damaged: reading {name} failed \(.*Riegeli.*\); rerun the .*",
                      str(error.value)), str(error.value)
