"""A tiny sentence-transformers bi-encoder, a tiny cross-encoder and a generated corpus for the search tests."""
import hashlib
import json
import os
import pathlib
import shutil
import subprocess

import numpy as np
import pytest

import storage_faults
from inference.tiny_models import VOCAB, WORDS, hf_tokenizer, random_torch_model, write_vocab


def sentences(n: int, seed: int = 0) -> list[str]:
  """`n` distinct sentences of 2 to 9 words of the tiny vocabulary (so several length buckets)."""
  rng = np.random.default_rng(seed)
  out = set()
  while len(out) < n:
    out.add(" ".join(rng.choice(WORDS, int(rng.integers(2, 10)))))
  return sorted(out)


@pytest.fixture(scope="session")
def bi_encoder(tmp_path_factory):
  """A random BERT as a sentence-transformers folder (mean pooling, Normalize, max length 16), as
  sentence-transformers saves it."""
  from sentence_transformers import SentenceTransformer, models  # pylint: disable=import-outside-toplevel
  source = tmp_path_factory.mktemp("bert")
  random_torch_model("BertModel", seed=3).save_pretrained(source)
  hf_tokenizer(write_vocab(source)).save_pretrained(source)
  transformer = models.Transformer(str(source), max_seq_length=16)
  pooling = models.Pooling(transformer.get_embedding_dimension(), pooling_mode="mean")
  folder = tmp_path_factory.mktemp("st") / "bi_encoder"
  SentenceTransformer(modules=[transformer, pooling, models.Normalize()], device="cpu").save(str(folder))
  return folder


@pytest.fixture(scope="session")
def other_encoder(tmp_path_factory, bi_encoder):
  """The bi-encoder's folder with other random weights of the same shapes."""
  folder = tmp_path_factory.mktemp("other") / "encoder"
  shutil.copytree(bi_encoder, folder)
  random_torch_model("BertModel", seed=4).save_pretrained(folder)
  return folder


def _sequence_classifier(tmp_path_factory, name: str, seed: int, num_labels: int):
  folder = tmp_path_factory.mktemp(name)
  random_torch_model("BertForSequenceClassification", seed=seed, num_labels=num_labels).save_pretrained(folder)
  write_vocab(folder)
  return folder


@pytest.fixture(scope="session")
def reranker(tmp_path_factory):
  """A random one-label BertForSequenceClassification with its vocab: a cross-encoder's shape."""
  return _sequence_classifier(tmp_path_factory, "cross_encoder", 5, 1)


@pytest.fixture(scope="session")
def classifier(tmp_path_factory):
  """A random three-label classifier: not a cross-encoder."""
  return _sequence_classifier(tmp_path_factory, "classifier", 6, 3)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
  """40 documents as JSONL with string ids."""
  path = tmp_path_factory.mktemp("corpus") / "docs.jsonl"
  path.write_text("".join(json.dumps({"doc": f"d{i}", "body": s}) + "\n" for i, s in enumerate(sentences(40))),
                  encoding="utf-8")
  return path


OPTIONS_KW = dict(text_column="body", id_column="doc", chunk_size=16)


@pytest.fixture(scope="session")
def built_dir(tmp_path_factory, bi_encoder, corpus):
  """The corpus indexed by the bi-encoder in chunks of 16 (three chunks), uninterrupted: what every resumed or
  repaired build must equal. Read it, never change it (copy it first)."""
  from jbert.search import BuildOptions, build_index  # pylint: disable=import-outside-toplevel
  folder = tmp_path_factory.mktemp("built") / "index"
  build_index(str(corpus), str(bi_encoder), str(folder), options=BuildOptions(**OPTIONS_KW))
  return folder


def interrupted_build(index_dir, corpus, model, chunks: int = 1) -> None:
  """A build of the corpus (chunks of 16) stopped by Ctrl-C once `chunks` chunks are written."""
  from jbert.search import BuildOptions, build_index  # pylint: disable=import-outside-toplevel
  from jbert.search import build as build_lib  # pylint: disable=import-outside-toplevel
  calls = []
  real = build_lib.Embedder.__call__

  def call(self, texts, **kw):
    if len(calls) == chunks:
      raise KeyboardInterrupt
    calls.append(len(texts))
    return real(self, texts, **kw)

  build_lib.Embedder.__call__ = call
  try:
    with pytest.raises(KeyboardInterrupt):
      build_index(str(corpus), str(model), str(index_dir), options=BuildOptions(**OPTIONS_KW))
  finally:
    build_lib.Embedder.__call__ = real


def tree_hashes(root: pathlib.Path) -> dict[str, str | None]:
  """sha256 of every file under `root` (None for a folder), by relative path: equal before and after means
  nothing was written, removed or added."""
  out = {}
  for path in sorted(root.rglob("*")):
    out[str(path.relative_to(root))] = (hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None)
  return out


def vectors(index) -> np.ndarray:
  return index._index.reconstruct_n(0, index.size)  # pylint: disable=protected-access


def dead_pid() -> int:
  """The pid of a process that has exited (and been reaped)."""
  child = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True, check=True)
  return int(child.stdout)


@pytest.fixture(scope="session")
def permuted_vocab(tmp_path_factory):
  """The tiny vocabulary with its words in reverse order after the special tokens: the same size, other ids."""
  path = tmp_path_factory.mktemp("permuted") / "vocab.txt"
  path.write_text("".join(t + "\n" for t in VOCAB[:5] + VOCAB[5:][::-1]), encoding="utf-8")
  return path


@pytest.fixture(scope="session")
def untokenized_encoder(tmp_path_factory, bi_encoder):
  """The bi-encoder's folder without its tokenizer (it must be given with --tokenizer), and that tokenizer as a
  vocab.txt elsewhere: (folder, vocab)."""
  root = tmp_path_factory.mktemp("untokenized")
  folder = root / "encoder"
  shutil.copytree(bi_encoder, folder)
  (folder / "tokenizer.json").unlink()
  return folder, write_vocab(root / "vocab")


def _dense_encoder(folder: pathlib.Path, seed: int) -> pathlib.Path:
  """A random BERT + mean pooling + Dense(32 -> 16, tanh) + Normalize, as sentence-transformers saves it."""
  import torch  # pylint: disable=import-outside-toplevel
  from sentence_transformers import SentenceTransformer, models  # pylint: disable=import-outside-toplevel
  source = folder.parent / f"{folder.name}_bert"
  random_torch_model("BertModel", seed=3).save_pretrained(source)
  hf_tokenizer(write_vocab(source)).save_pretrained(source)
  transformer = models.Transformer(str(source), max_seq_length=16)
  pooling = models.Pooling(transformer.get_embedding_dimension(), pooling_mode="mean")
  torch.manual_seed(seed)
  dense = models.Dense(transformer.get_embedding_dimension(), 16)
  SentenceTransformer(modules=[transformer, pooling, dense, models.Normalize()], device="cpu").save(str(folder))
  return folder


@pytest.fixture(scope="session")
def dense_encoders(tmp_path_factory):
  """Two sentence-transformers folders with the same BERT and Dense modules of the same shape, other weights."""
  root = tmp_path_factory.mktemp("dense")
  return _dense_encoder(root / "a", seed=7), _dense_encoder(root / "b", seed=8)


def command(*args) -> int:
  """`python -m jbert.search ARGS` in this process: its exit status (0 when it returns)."""
  import importlib  # pylint: disable=import-outside-toplevel
  from absl import flags  # pylint: disable=import-outside-toplevel
  main = importlib.import_module("jbert.search.__main__")
  flags.FLAGS.unparse_flags()
  argv = flags.FLAGS(["jbert.search", *map(str, args)])
  try:
    main.main(argv)
    return 0
  except SystemExit as e:
    return e.code
  finally:
    flags.FLAGS.unparse_flags()


def one_line(capsys) -> str:
  """The one line a refused command printed on stderr (asserted to be one)."""
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1, err
  return err[0]


class SmallDisk:
  """A file system of its own mounted on the empty folder `directory` (a tmpfs: the tests run as root), which
  `fill()` makes full (no free block left: the next byte written fails with ENOSPC, as on a full disk) and
  `grow()` gives room again, as a user freeing space would."""

  def __init__(self, directory: pathlib.Path):
    self.directory = directory
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(directory)], check=True,
                   capture_output=True)

  def fill(self) -> None:
    stats = os.statvfs(self.directory)
    used_kb = (stats.f_blocks - stats.f_bfree) * stats.f_frsize // 1024
    subprocess.run(["mount", "-o", f"remount,size={max(used_kb, 4)}k", str(self.directory)], check=True,
                   capture_output=True)
    if used_kb < 4:  # tmpfs' smallest size is one page: take it with a file
      (self.directory / ".filler").write_bytes(b"\0" * 4096)

  def grow(self) -> None:
    subprocess.run(["mount", "-o", "remount,size=8m", str(self.directory)], check=True, capture_output=True)
    (self.directory / ".filler").unlink(missing_ok=True)

  def close(self) -> None:
    subprocess.run(["umount", str(self.directory)], check=True, capture_output=True)


@pytest.fixture
def small_disk(tmp_path):
  if not storage_faults.CAN_MOUNT:
    pytest.skip(f"needs a tmpfs mount (root with CAP_SYS_ADMIN); storage faults here are {storage_faults.MODE}")
  disk = SmallDisk(tmp_path / "disk")
  yield disk
  disk.close()
