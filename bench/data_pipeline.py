r"""Pretraining input per host core: from raw text, and from a corpus prepared once (`python -m jbert.data prepare`).

  python bench/data_pipeline.py [--routes=raw,prepared] [--text=botchan.txt --vocab=bert-base-uncased-vocab.txt]
      [--prepare_mb=20] [--first_batch_mb=20,2000] [--workdir=/tmp/jbert_bench_data]   (../shared/data)

Everything runs in this process on one core (no grain workers, no prefetch thread, one tokenizer thread), and the
rates per core divide by this process's CPU time, so that other load on the host does not lower them (the time to
the first batch is wall time).

* raw: the `text` source, which reads and sentence-splits the text again every epoch: sequences/s at 128 and 512,
  and the time to the first batch at each --raw_first_batch_mb size (it reads and indexes the whole file first).
* prepared:
  - prepare MB/s per core: what each worker of `prepare` does (read, sentence-split, write ArrayRecord), here in
    one process, over Hugging Face-layout Parquet (`id, url, title, text`) of Wikipedia-sized articles (~3 kB,
    English Wikipedia's mean) generated from --text;
  - sequences/s at 128 and 512 from that prepared corpus (read, tokenise, instances, masking, batching);
  - time to the first batch (the corpus opened, checked and the iterator built, one batch out) at each
    --first_batch_mb size. Those corpora are written straight into the shard layout prepare writes (the same
    articles, already split, repeated), so that a 2 GB one takes a minute here rather than the ~15 minutes of
    preparing it on this 2-core host; the reader cannot tell them apart.
Generated files go under --workdir, which is deleted at the end. The last line is a JSON object.
"""
import os

os.environ["RAYON_NUM_THREADS"] = "1"  # One tokenizer thread: a per-core number. Must precede the import.

import json  # noqa: E402
import pathlib  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import numpy as np  # noqa: E402

from jbert.data import config as data_config  # noqa: E402
from jbert.data import loader  # noqa: E402
from jbert.data import manifest as manifest_lib  # noqa: E402
from jbert.data import prepare  # noqa: E402
from jbert.data import shards as shards_lib  # noqa: E402
from jbert.data import sources  # noqa: E402

_DATA = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"
_TEXT = flags.DEFINE_string("text", str(_DATA / "botchan.txt"), "Plain-text corpus the inputs are made from.")
_VOCAB = flags.DEFINE_string("vocab", str(_DATA / "bert-base-uncased-vocab.txt"), "WordPiece vocab.txt.")
_ROUTES = flags.DEFINE_list("routes", ["raw", "prepared"], "raw and/or prepared.")
_SEQUENCES = flags.DEFINE_integer("sequences", 4000, "Sequences measured per length (whole groups, at least).")
_BATCH = flags.DEFINE_integer("batch_size", 64, "Rows per batch.")
_PREPARE_MB = flags.DEFINE_float("prepare_mb", 20.0, "MB of Parquet text the prepare measurement reads.")
_FIRST_BATCH_MB = flags.DEFINE_list("first_batch_mb", ["20", "2000"], "Prepared corpus sizes (MB of text) whose "
                                    "time to the first batch is measured.")
_RAW_FIRST_BATCH_MB = flags.DEFINE_list("raw_first_batch_mb", ["20", "2000"], "Plain-text corpus sizes (MB) whose "
                                        "time to the first batch the raw route measures (it indexes the whole "
                                        "file first).")
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/jbert_bench_data", "Scratch directory, deleted at the end.")


def throughput(cfg, max_seq_length: int, max_predictions: int) -> float:
  """Sequences/s of one in-process pipeline over whole document groups (`loader.time_groups`: batches are sliced
  from groups made whole, so timing batches would time slicing), after a warm-up group."""
  cfg = cfg.copy_and_resolve_references()
  cfg.max_seq_length, cfg.max_predictions_per_seq = max_seq_length, max_predictions
  tokenizer = loader.build_tokenizer(cfg)
  loader.time_groups(cfg, tokenizer, seed=0, min_sequences=1)
  cpu = time.process_time()
  sequences, _ = loader.time_groups(cfg, tokenizer, seed=0, min_sequences=_SEQUENCES.value)
  return sequences / (time.process_time() - cpu)


def articles(megabytes: float) -> list[str]:
  """Articles of ~3 kB adding up to `megabytes`: runs of --text's sentences from seeded random places, in
  paragraphs of five sentences (botchan.txt is one hard-wrapped document without blank lines)."""
  text = pathlib.Path(_TEXT.value).read_text(encoding="utf-8").replace("\r\n", "\n")
  sentences = sources.split_sentences(" ".join(text.split()), "en")
  rng, found, size = np.random.default_rng(0), [], 0
  while size < megabytes * 1e6:
    start, article = int(rng.integers(len(sentences))), []
    while sum(map(len, article)) < 3000:
      article.append(sentences[(start + len(article)) % len(sentences)])
    found.append("\n".join(" ".join(article[i:i + 5]) for i in range(0, len(article), 5)))
    size += len(found[-1].encode())
  return found


def prepare_rate(root: pathlib.Path) -> tuple[float, str]:
  """(MB/s of one prepare worker, the prepared directory) over generated Hugging Face-layout Parquet."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  texts = articles(_PREPARE_MB.value)
  parquet = root / "wiki-train-00000-of-00001.parquet"
  pq.write_table(pa.table({"id": [str(i) for i in range(len(texts))], "url": ["https://example.org"] * len(texts),
                           "title": ["title"] * len(texts), "text": texts}), parquet, row_group_size=1000)
  megabytes = sum(len(t.encode()) for t in texts) / 1e6
  out = root / "prepared"
  cpu = time.process_time()
  prepare.prepare(prepare.Options(inputs=str(parquet), output=str(out), workers=1, vocab=_VOCAB.value),
                  log=lambda line: None)
  return megabytes / (time.process_time() - cpu), str(out)


def write_corpus(directory: pathlib.Path, megabytes: float, documents: list[list[str]]) -> None:
  """A prepared corpus of `megabytes` of text in prepare's layout, from `documents` repeated."""
  from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top
  directory.mkdir(parents=True)
  records = ["\n".join(d).encode() for d in documents]
  per_shard, total, shards = 32e6, 0, []
  while total < megabytes * 1e6:
    name = f"documents-{len(shards):05d}-of-XXXXX.array_record"
    writer = array_record_module.ArrayRecordWriter(str(directory / name), prepare.ARRAY_RECORD_OPTIONS)
    size = count = 0
    while size < per_shard and total + size < megabytes * 1e6:
      record = records[(total // 3000 + count) % len(records)]
      writer.write(record)
      size, count = size + len(record), count + 1
    writer.close()
    shards.append({"name": name, "documents": count, "sentences": 0, "bytes": (directory / name).stat().st_size,
                   "crc32c": shards_lib.crc32c(str(directory / name))})
    total += size
  for i, shard in enumerate(shards):  # the real names, now that the count is known
    final = manifest_lib.shard_name(i, len(shards))
    (directory / shard["name"]).rename(directory / final)
    shard["name"] = final
  documents = sum(s["documents"] for s in shards)
  held = min(2000, documents // 10)
  held_out = np.sort(np.random.default_rng(0).choice(documents, held, replace=False)).tolist()
  shutil.copy(_VOCAB.value, directory / "vocab.txt")
  (directory / manifest_lib.MANIFEST).write_bytes(manifest_lib.dumps({
      "format": manifest_lib.FORMAT, "version": manifest_lib.VERSION, "settings": {"max_line_chars": 20_000},
      "shards": shards, "documents": documents, "sentences": 0, "vocab": "vocab.txt",
      "held_out": {"documents": held_out, "several_sentences": held}}))


def first_batch_seconds(cfg) -> float:
  """Wall time from opening and checking the corpus to the first global batch of 256 sequences of 128."""
  tokenizer = loader.build_tokenizer(cfg)
  start = time.perf_counter()
  loader.check_data(cfg, eval_enabled=True)
  next(loader.make_pretrain_iterator(cfg, tokenizer, global_batch_size=256, seed=0))
  return time.perf_counter() - start


def main(argv):
  del argv
  for path in (_TEXT.value, _VOCAB.value):
    if not os.path.exists(path):
      raise app.UsageError(f"{path} does not exist; pass --text and --vocab.")
  results, root = {}, pathlib.Path(_WORKDIR.value)
  shutil.rmtree(root, ignore_errors=True)
  root.mkdir(parents=True)
  try:
    if "raw" in _ROUTES.value:
      cfg = data_config.default_pretrain_config()
      cfg.source, cfg.text_files, cfg.vocab = "text", _TEXT.value, _VOCAB.value
      for length, predictions in ((128, 20), (512, 80)):
        results[f"raw_seq_per_sec_per_core_{length}"] = rate = throughput(cfg, length, predictions)
        print(f"raw text, max_seq_length={length}: {rate:.0f} sequences/s per core", flush=True)
      texts = articles(5)
      for megabytes in map(float, _RAW_FIRST_BATCH_MB.value):
        path = root / f"corpus_{megabytes:g}mb.txt"
        with open(path, "w", encoding="utf-8") as f:  # blank lines between the articles: documents
          for i in range(int(megabytes * 1e6 / len("\n\n".join(texts))) + 1):
            f.write("\n\n".join(texts) + "\n\n")
        cfg.text_files = str(path)
        seconds = first_batch_seconds(cfg)
        results[f"raw_first_batch_seconds_{megabytes:g}mb"] = seconds
        print(f"time to the first batch, {megabytes:g} MB text file: {seconds:.2f} s", flush=True)
        path.unlink()
    if "prepared" in _ROUTES.value:
      results["prepare_mb_per_sec_per_core"], directory = prepare_rate(root)
      print(f"prepare: {results['prepare_mb_per_sec_per_core']:.2f} MB/s per core (Parquet, "
            f"{_PREPARE_MB.value:g} MB)", flush=True)
      cfg = data_config.default_pretrain_config()
      cfg.source, cfg.prepared = "prepared", directory
      for length, predictions in ((128, 20), (512, 80)):
        results[f"prepared_seq_per_sec_per_core_{length}"] = rate = throughput(cfg, length, predictions)
        print(f"prepared, max_seq_length={length}: {rate:.0f} sequences/s per core", flush=True)
      documents = [sources.split_sentences(t, "en") for t in articles(5)]
      for megabytes in map(float, _FIRST_BATCH_MB.value):
        corpus = root / f"corpus_{megabytes:g}mb"
        write_corpus(corpus, megabytes, documents)
        cfg = data_config.default_pretrain_config()
        cfg.source, cfg.prepared = "prepared", str(corpus)
        seconds = first_batch_seconds(cfg)
        results[f"first_batch_seconds_{megabytes:g}mb"] = seconds
        print(f"time to the first batch, {megabytes:g} MB prepared corpus: {seconds:.2f} s", flush=True)
        shutil.rmtree(corpus)
  finally:
    shutil.rmtree(root, ignore_errors=True)
  print(json.dumps(results))


if __name__ == "__main__":
  app.run(main)
