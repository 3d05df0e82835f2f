"""Models in a bucket: `load_pretrained("gs://...")`, `--model=gs://...`, `init_from=gs://...`.

A training workdir is read where it is (Orbax and tensorstore open `gs://` themselves, and it may hold several
large checkpoints of which one step's parameters are read). Every other model (a Hugging Face,
sentence-transformers or jbert folder, a TF1 checkpoint) is read by code that opens local files (safetensors,
torch, the tokenizer libraries), so it is downloaded once into the local cache (`jbert.runtime.mirror`: fetched
again only when it changed) and read from there.
"""
from __future__ import annotations

import os
import re

from etils import epath

from jbert.runtime import mirror
from jbert.runtime import storage

# Beside a TF1 checkpoint prefix: what `tf1.find_checkpoint` and the tokenizer look for.
_TF1_COMPANIONS = ("bert_config.json", "vocab.txt", "checkpoint", "spiece.model")
_TF1_SUFFIX = re.compile(r"\.(index|meta|data-\d+-of-\d+)$")


def exists(path: str | os.PathLike) -> bool:
  """Whether a model path (a folder, a file, or a TF1 prefix with its `.index`) exists, local or remote."""
  path = os.fspath(path)
  return epath.Path(path).exists() or epath.Path(path + ".index").exists()


def is_dir(path: str | os.PathLike) -> bool:
  return epath.Path(os.fspath(path)).is_dir()


def is_workdir(path: str | os.PathLike) -> bool:
  """A jbert training workdir (or its checkpoints folder), local or remote."""
  from jbert.checkpoint import reading  # pylint: disable=g-import-not-at-top  (Orbax only when needed)
  return reading.find_checkpoint_dir(path) is not None


def local_model(path: str | os.PathLike) -> str:
  """`path` as the model readers need it: a local path, or a training workdir in a bucket, as it is; any other
  `gs://` model downloaded into the local cache (the copy's path is returned). A remote path that does not
  exist stays as it is, for the readers to report."""
  path = os.fspath(path)
  if not storage.is_remote(path) or is_workdir(path):
    return path
  remote = epath.Path(path)
  if remote.is_dir():
    # A fine-tuning run's export/ has the run's settings in results.json beside it, which prediction follows.
    results = remote.parent / "results.json"
    if results.exists():
      mirror.download(os.fspath(results), os.path.join(os.path.dirname(mirror.cache_path(path)), results.name))
    return mirror.download(path)
  prefix = _TF1_SUFFIX.sub("", path)
  folder = epath.Path(prefix).parent
  if not epath.Path(prefix + ".index").exists():
    return mirror.download(path) if remote.exists() else path
  local_folder = mirror.cache_path(os.fspath(folder))
  name = os.path.basename(prefix)
  for file in folder.iterdir():
    if file.name.startswith(name + ".") or file.name in _TF1_COMPANIONS:
      mirror.download(os.fspath(file), os.path.join(local_folder, file.name))
  return os.path.join(local_folder, name)
