"""Copies between a bucket and the local disk, for the readers and writers that only open local files.

ArrayRecord (TFDS's prepared files), the tokenizer libraries, safetensors and the inference writers open local
paths only. A `gs://` folder they need is downloaded once into a local cache (`download`, `local_tfds_dir`) and
read there; what they write goes to a local temporary folder that is then uploaded (`upload`).

The cache is `$XDG_CACHE_HOME/jbert/gs/BUCKET/PATH` (else `~/.cache/jbert/gs/...`; `$JBERT_GS_CACHE` overrides
the root). A file is fetched again only when its size or modification time in the bucket changed (recorded in
`.jbert-mirror.json` beside the copy); each lands under a temporary name and is renamed into place, so processes
sharing a cache never read half a file.
"""
from __future__ import annotations

import json
import os
import posixpath
import shutil
import tempfile

from etils import epath

from jbert.runtime import storage

CACHE_ENV = "JBERT_GS_CACHE"
RECORD = ".jbert-mirror.json"
_CHUNK = 16 << 20


def cache_root() -> str:
  if os.environ.get(CACHE_ENV):
    return os.path.expanduser(os.environ[CACHE_ENV])
  cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(cache, "jbert", "gs")


def cache_path(url: str) -> str:
  """Where `download` puts `url` (gs://BUCKET/PATH -> CACHE/BUCKET/PATH)."""
  scheme, _, rest = os.fspath(url).partition("://")
  return os.path.join(cache_root(), *([scheme] if scheme != "gs" else []), *rest.strip("/").split("/"))


def _copy(source, destination) -> None:
  """Streams `source` to `destination` (epath or local paths), which appears only once complete."""
  destination = epath.Path(destination)
  local = not storage.is_remote(destination)
  tmp = destination.parent / f".{destination.name}.{os.getpid()}.tmp" if local else destination
  if local:
    os.makedirs(destination.parent, exist_ok=True)
  try:
    with epath.Path(source).open("rb") as reader:
      writer = tmp.open("wb")
      try:
        shutil.copyfileobj(reader, writer, _CHUNK)
      except BaseException:
        # An object is created when its writer closes, which a `with` block would do on an error too:
        # abandon the upload instead (gcsfs), so that no half-written object ever appears.
        getattr(writer, "discard", writer.close)()
        raise
      writer.close()
    if local:
      os.replace(tmp, destination)
  except BaseException:
    if local and tmp.exists():
      tmp.unlink()
    raise


def _remote_files(url: str) -> dict[str, tuple[int, float]]:
  """{path relative to `url`: (size, modification time)} of every file under the remote folder `url`."""
  root = epath.Path(url)
  # Through fsspec, walk() names folders without their scheme ("bucket/path"): paths are rebuilt from `root`.
  base = os.fspath(root).split("://", 1)[-1].rstrip("/")
  found = {}
  for folder, _, names in root.walk():
    below = os.fspath(folder).split("://", 1)[-1].rstrip("/")[len(base):].strip("/")
    for name in names:
      relative = f"{below}/{name}" if below else name
      stat = (root / relative).stat()
      found[relative] = (int(stat.length), float(stat.mtime or 0))
  return found


def download(url: str, local: str | None = None) -> str:
  """A local copy of the remote file or folder `url` (in `local`, else the cache); returns its path.

  Files unchanged since the last call are not fetched again; files no longer in the bucket are removed."""
  local = local or cache_path(url)
  source = epath.Path(url)
  if not source.is_dir():
    if not source.exists():
      raise FileNotFoundError(f"{url} does not exist.")
    stat = source.stat()
    version = [int(stat.length), float(stat.mtime or 0)]
    record = local + RECORD
    if not (os.path.isfile(local) and _read_record(record).get("") == version):
      _copy(source, local)
      _write_record(record, {"": version})
    return local
  files = _remote_files(url)
  record_path = os.path.join(local, RECORD)
  have = _read_record(record_path)
  for relative, version in sorted(files.items()):
    target = os.path.join(local, *relative.split("/"))
    if have.get(relative) != list(version) or not os.path.isfile(target):
      _copy(source / relative, target)
  for relative in set(have) - set(files):
    stale = os.path.join(local, *relative.split("/"))
    if os.path.isfile(stale):
      os.remove(stale)
  _write_record(record_path, {k: list(v) for k, v in files.items()})
  return local


def _read_record(path: str) -> dict:
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}


def _write_record(path: str, record: dict) -> None:
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".mirror-")
  with os.fdopen(fd, "w", encoding="utf-8") as f:
    json.dump(record, f)
  os.replace(tmp, path)


def upload(local: str, url: str, *, replace: bool = False, last: tuple[str, ...] = ()) -> list[str]:
  """Copies the local file or folder `local` to `url` (each file one object, written whole); files named in
  `last` go after all others (a marker that says the rest is there). With `replace`, objects under `url` that
  `local` does not have are deleted afterwards. Returns the URLs written."""
  destination = epath.Path(url)
  if os.path.isfile(local):
    _copy(local, destination)
    return [url]
  files = sorted(os.path.relpath(os.path.join(folder, name), local).replace(os.sep, "/")
                 for folder, _, names in os.walk(local) for name in names)
  written = []
  for relative in sorted(files, key=lambda f: posixpath.basename(f) in last):
    _copy(os.path.join(local, *relative.split("/")), destination / relative)
    written.append(f"{url.rstrip('/')}/{relative}")
  if replace and destination.is_dir():
    keep = {w.split(url.rstrip("/") + "/", 1)[1] for w in written}
    for relative in set(_remote_files(url)) - keep:
      (destination / relative).unlink()
  return written


def remove(url: str) -> None:
  """Deletes the remote folder (or file) `url` and everything under it; nothing when it does not exist."""
  path = epath.Path(url)
  if path.is_dir():
    path.rmtree()
  elif path.exists():
    path.unlink()


def local_tfds_dir(data_dir: str | None, name: str | None) -> str | None:
  """A TFDS data dir that ArrayRecord can open for dataset `name` (`dataset[/config][:version]`).

  ArrayRecord reads local files only, so for a `gs://` data dir the dataset's own folder (DATA_DIR/dataset/
  config/, not the whole data dir) is downloaded into the cache, whose root is returned. A dataset the bucket
  does not hold leaves `data_dir` as it is, for TFDS to report it unprepared there."""
  if data_dir is None or not name or not storage.is_remote(data_dir):
    return data_dir
  folder = name.split(":", 1)[0].strip("/")
  if not epath.Path(data_dir, folder).is_dir():
    return data_dir
  download(f"{data_dir.rstrip('/')}/{folder}")
  return cache_path(data_dir)


def copy_folder(source: str, destination: str, *, last: tuple[str, ...] = ()) -> None:
  """Copies every object under `source` to `destination` inside the object store (no data through this
  machine); files named in `last` go after the others."""
  files = _remote_files(source)
  for relative in sorted(files, key=lambda f: posixpath.basename(f) in last):
    epath.Path(source, relative).copy(epath.Path(destination, relative), overwrite=True)


def publish_folder(local: str, url: str, staging: str, *, last: tuple[str, ...] = ()) -> None:
  """Replaces the remote folder `url` with the local folder `local`, as nearly atomically as an object store
  allows: uploaded whole to `staging` first (the slow part, while `url` is untouched), then `url` removed and
  `staging` copied over it inside the store (seconds), `last` files last. A crash before the copy leaves `url`
  as it was; during it, `staging` is complete and `recover_folder` finishes the job."""
  remove(staging)
  upload(local, staging, last=last)
  remove(url)
  copy_folder(staging, url, last=last)
  remove(staging)


def recover_folder(url: str, staging: str, marker: str) -> None:
  """Finishes a `publish_folder` that a crash cut short: `url` without its `marker` file while `staging` has
  one is replaced by `staging`; any other staging folder is an unfinished upload and is removed."""
  if not epath.Path(url, marker).exists() and epath.Path(staging, marker).exists():
    remove(url)
    copy_folder(staging, url, last=(marker,))
  remove(staging)
