r"""`python -m jbert.tfds_build NAME [NAME ...]`: prepares TFDS datasets (GLUE, SQuAD, CoNLL-2003, ...) as the
ArrayRecord files that jbert reads by random access, with nothing beyond jbert's own install.

  python -m jbert.tfds_build glue/sst2 glue/mnli squad/v1.1 conll2003 [--data_dir=gs://BUCKET/tfds]

TFDS's own `tfds build` command imports Apache Beam for every dataset, and installing Beam beside jbert would
downgrade protobuf and pyarrow. This command calls TFDS's builder API instead (`builder.download_and_prepare` with
`file_format=array_record`), which is what `tfds build` does for a dataset that is not a Beam dataset. A Beam
dataset (TFDS's `wikipedia`) is refused before anything is downloaded, with the route that works: Wikipedia
comes from the Hugging Face parquet dump through `python -m jbert.data prepare`.

Flags: --data_dir (default: $TFDS_DATA_DIR, else ~/tensorflow_datasets; `gs://` works), --manual_dir (datasets
whose files the user downloads by hand, and any dataset's files downloaded elsewhere: TFDS takes a file there,
under the name its checksums give, instead of downloading it), --imports (modules that define builders of your own),
--max_examples_per_split (a quick sample), --overwrite (prepare again). A dataset already prepared in that form is
left as it is. A user's mistake (an unknown name, a Beam dataset, an unwritable --data_dir) is one line,
`jbert.tfds_build: ...`, exit status 2. So is a download host that cannot be reached (no network, DNS, a proxy
refusing): each file's host is tried once before TFDS downloads it, so the line comes within seconds, naming the
host, the file and --manual_dir, instead of after TFDS's ten retries (~3.4 minutes of back-off).
"""
from __future__ import annotations

import collections
import contextlib
import importlib
import logging
import os
import sys
import tempfile
import time
from typing import Iterator, Sequence
from urllib import parse

from absl import app
from absl import flags

from jbert import errors
from jbert.runtime import mirror
from jbert.runtime import storage

PROGRAM = "jbert.tfds_build"
FORMAT = "array_record"

_DATA_DIR = flags.DEFINE_string("data_dir", None, "Where to prepare (local or gs://); default: TFDS's data dir.")
_MANUAL_DIR = flags.DEFINE_string("manual_dir", None, "Files a dataset asks the user to download by hand.")
_IMPORTS = flags.DEFINE_list("imports", [], "Modules to import first: they define (register) builders.")
_MAX_EXAMPLES = flags.DEFINE_integer("max_examples_per_split", None, "Prepare at most this many examples per "
                                     "split (a sample to try things on).")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Prepare again even if the dataset is already prepared.")


# Seconds to connect to a download host (and for its first answer) before it counts as unreachable.
CONNECT_TIMEOUT_S = 10.0


class BeamDataset(errors.UserError):
  """The dataset needs Apache Beam to prepare."""


class Unreachable(errors.UserError):
  """A file of the dataset cannot be downloaded from here."""


def _tfds():
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top  (slow)
  # Registers the text datasets (glue, conll2003) where TFDS does not import them by itself (no TensorFlow).
  import tensorflow_datasets.text  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  return tfds


def _beam_refusal(name: str) -> BeamDataset:
  return BeamDataset(
      f"{name} is an Apache Beam dataset, which jbert's install leaves out (Beam pins older protobuf and pyarrow "
      "than jbert's). For Wikipedia, prepare the Hugging Face dump instead: `python -m jbert.data prepare "
      "--input=PARQUET_GLOB --output=DIR` (docs/pretraining.md: Pretraining BERT-base on English Wikipedia); otherwise "
      f"install apache-beam in a virtualenv of its own and run `tfds build {name} --file_format={FORMAT}`.")


def builder(name: str, data_dir: str | None = None):
  """TFDS's builder of `name` (`dataset/config[:version]`), refusing Beam datasets before any download."""
  tfds = _tfds()
  try:
    found = tfds.builder(name, data_dir=data_dir, file_format=FORMAT)
  except (tfds.core.registered.DatasetNotFoundError, ValueError) as e:  # ValueError: no such config or version
    # TFDS: 'Failed to construct dataset "glue", builder_kwargs "{...}": BuilderConfig x not found ... Here are'
    reason = str(e).strip().rsplit('": ', 1)[-1].split(" Here are")[0].strip().splitlines()[0].rstrip(".")
    raise errors.UserError(f"TFDS has no dataset {name!r} ({reason}); names look like glue/sst2, squad/v1.1, "
                           "conll2003 (https://www.tensorflow.org/datasets/catalog), or pass --imports=MODULE "
                           "for a builder of your own.") from None
  if isinstance(found, tfds.core.BeamBasedBuilder):
    raise _beam_refusal(name)
  return found


def prepared(found) -> bool:
  """True when `found` (a builder) already has its ArrayRecord files and dataset_info.json."""
  from etils import epath  # pylint: disable=g-import-not-at-top
  info = epath.Path(found.data_dir) / "dataset_info.json"
  return info.exists() and any(FORMAT in p.name for p in epath.Path(found.data_dir).iterdir())


def build(name: str, data_dir: str | None = None, *, manual_dir: str | None = None,
          max_examples_per_split: int | None = None, overwrite: bool = False) -> str:
  """Prepares `name` as ArrayRecord files under `data_dir`; returns the dataset's folder.

  ArrayRecord writes local files only: for a `gs://` data dir the dataset is prepared in a local temporary
  folder and uploaded, its dataset_info.json last (TFDS takes a version folder with one for prepared)."""
  found = builder(name, data_dir)
  if prepared(found) and not overwrite:
    logging.info("%s: already prepared in %s", name, found.data_dir)
    return os.fspath(found.data_dir)
  if not storage.is_remote(data_dir):
    return _build_here(name, data_dir, manual_dir, max_examples_per_split)
  with tempfile.TemporaryDirectory(prefix="jbert-tfds-") as local:
    folder = _build_here(name, local, manual_dir, max_examples_per_split)
    relative = os.path.relpath(folder, local).replace(os.sep, "/")
    mirror.upload(folder, f"{data_dir.rstrip('/')}/{relative}", replace=True, last=("dataset_info.json",))
  return os.fspath(found.data_dir)


def _build_here(name, data_dir, manual_dir, max_examples_per_split) -> str:
  tfds = _tfds()
  found = builder(name, data_dir)
  config = tfds.download.DownloadConfig(
      manual_dir=manual_dir, max_examples_per_split=max_examples_per_split,
      # Not prepared as ArrayRecord (`prepared` said so): a TFRecord copy of the version is made again.
      download_mode=tfds.download.GenerateMode.REUSE_CACHE_IF_EXISTS)
  import requests  # pylint: disable=g-import-not-at-top  (TFDS's HTTP client)
  if manual_dir is None:
    _some_host_answers(name, found)
  try:
    with _hosts_tried_first(name, manual_dir):
      found.download_and_prepare(download_config=config, file_format=FORMAT)
  except ImportError as e:
    if "apache_beam" in str(e) or getattr(e, "name", None) == "apache_beam":
      raise _beam_refusal(name) from None
    raise
  except requests.exceptions.RequestException as e:  # the network went away during a download, after retries
    url = getattr(e.request, "url", None) or ""
    raise _unreachable(name, url, None, e, manual_dir) from None
  return os.fspath(found.data_dir)


def _why(error: BaseException) -> str:
  """What went wrong with a connection, in a few words, from requests' and urllib3's nested exceptions."""
  import requests  # pylint: disable=g-import-not-at-top
  text = str(error)
  if isinstance(error, requests.exceptions.ProxyError):
    return "the proxy refused the connection or could not be reached"
  if "NameResolutionError" in text or "Name or service not known" in text or "getaddrinfo" in text:
    return "its name does not resolve: no network or no DNS"
  if isinstance(error, requests.exceptions.ConnectTimeout) or "timed out" in text:
    return f"no answer within {CONNECT_TIMEOUT_S:.0f} s"
  if "Connection refused" in text:
    return "connection refused"
  if isinstance(error, requests.exceptions.SSLError):
    return "TLS failed"
  return errors.preview(text.splitlines()[0] if text else type(error).__name__)


def _unreachable(name: str, url: str, filename: str | None, error: BaseException,
                 manual_dir: str | None) -> Unreachable:
  host = parse.urlsplit(url).hostname or "the download host"
  file = filename or os.path.basename(parse.urlsplit(url).path) or "the file"
  put = (f"put it in {manual_dir} (--manual_dir), where TFDS looks for it under that name" if manual_dir else
         "put it in a folder here and pass --manual_dir=FOLDER (TFDS then reads it instead of downloading)")
  return Unreachable(f"{name}: cannot reach {host} ({_why(error)}) to download {url or 'its files'}; download "
                     f"{file} where there is network access and {put}.")


def _head(url: str) -> BaseException | None:
  """None when `url`'s host answers a HEAD request at all (an HTTP error is an answer), else the connection error."""
  import requests  # pylint: disable=g-import-not-at-top
  try:
    requests.head(url, timeout=CONNECT_TIMEOUT_S, allow_redirects=False)
  except requests.exceptions.ConnectionError as e:  # DNS, refused, connect timeout, proxy, TLS
    return e
  except requests.exceptions.RequestException:
    return None  # it answered, slowly or oddly
  return None


def _some_host_answers(name: str, found) -> None:
  """Before TFDS starts (and prints its progress): when none of the hosts the dataset's checksums list answers and
  nothing was downloaded before, there is no network to prepare it with, and that is one line at once. Which of
  them a config needs TFDS knows only once downloading; a partly reachable network is left to `_hosts_tried_first`."""
  from concurrent import futures  # pylint: disable=g-import-not-at-top
  listed = [u for u in getattr(found, "url_infos", None) or {} if u.startswith(("http://", "https://"))]
  hosts = collections.Counter(parse.urlsplit(u).hostname for u in listed)
  urls = {host: next(u for u in listed if parse.urlsplit(u).hostname == host) for host, _ in hosts.most_common()}
  downloads = os.path.join(os.fspath(getattr(found, "_data_dir_root", found.data_dir)), "downloads")  # TFDS's default
  if not urls or (os.path.isdir(downloads) and any(not n.startswith(".") for n in os.listdir(downloads))):
    return
  with futures.ThreadPoolExecutor(len(urls)) as pool:
    failures = dict(zip(urls, pool.map(_head, urls.values())))
  if all(failures.values()):
    host, error = next(iter(failures.items()))  # the host most of its files come from
    others = [h for h in failures if h != host]
    also = f", nor {' or '.join(others)}," if others else ""
    raise Unreachable(f"{name}: cannot reach {host} ({_why(error)}){also} where TFDS downloads it from; download "
                      "its files where there is network access (TFDS's checksums of the dataset list their URLs), "
                      "put them in a folder here and pass --manual_dir=FOLDER (TFDS then reads them instead of "
                      "downloading).")


@contextlib.contextmanager
def _hosts_tried_first(name: str, manual_dir: str | None) -> Iterator[None]:
  """Each http(s) file TFDS is about to download is first asked for once (a HEAD request, proxies as the
  environment sets them): a host that cannot be reached is `Unreachable` at once, before TFDS's own retries and
  before it makes its temporary download folder. A host that answers at all, even with an error, is left to TFDS."""
  from tensorflow_datasets.core.download import download_manager  # pylint: disable=g-import-not-at-top
  manager = download_manager.DownloadManager
  original = getattr(manager, "_download", None)
  if original is None:  # another TFDS: its own retries, then the one line of `_build_here`
    yield
    return

  def tried_first(self, resource):
    url = getattr(resource, "url", resource)
    error = _head(url) if isinstance(url, str) and url.startswith(("http://", "https://")) else None
    if error is not None:
      expected = getattr(self, "_url_infos", {}).get(url)
      raise _unreachable(name, url, getattr(expected, "filename", None), error, manual_dir)
    return original(self, resource)  # TFDS's download and its retries decide the rest

  manager._download = tried_first  # pylint: disable=protected-access
  try:
    yield
  finally:
    manager._download = original  # pylint: disable=protected-access


def _describe(found) -> str:
  splits = found.info.splits
  return ", ".join(f"{split} {splits[split].num_examples:,}" for split in sorted(splits.keys()))


def main(argv: Sequence[str]) -> None:
  names = list(argv[1:])
  with errors.reported(PROGRAM):
    if not names:
      raise errors.UserError("name the datasets to prepare, e.g. `python -m jbert.tfds_build glue/sst2 "
                             "squad/v1.1 conll2003 [--data_dir=DIR]`.")
    storage.require([_DATA_DIR.value], "--data_dir")
    for module in _IMPORTS.value:
      try:
        importlib.import_module(module)
      except ImportError as e:
        raise errors.UserError(f"--imports={module}: {e}; pass an importable module (on PYTHONPATH).") from None
    for name in names:
      builder(name, _DATA_DIR.value)  # every name checked before the first download
    logging.getLogger("absl").setLevel(logging.WARNING)  # TFDS logs every file it writes
    for name in names:
      start = time.time()
      folder = build(name, _DATA_DIR.value, manual_dir=_MANUAL_DIR.value,
                     max_examples_per_split=_MAX_EXAMPLES.value, overwrite=_OVERWRITE.value)
      found = builder(name, _DATA_DIR.value)
      print(f"{name}: {_describe(found)} examples in {folder} ({time.time() - start:.0f} s)", flush=True)


def run() -> None:
  app.run(main)


if __name__ == "__main__":
  sys.exit(run())
