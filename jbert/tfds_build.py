r"""`python -m jbert.tfds_build NAME [NAME ...]`: prepares TFDS datasets (GLUE, SQuAD, CoNLL-2003, ...) as the
ArrayRecord files that jbert reads by random access, with nothing beyond jbert's own install.

  python -m jbert.tfds_build glue/sst2 glue/mnli squad/v1.1 conll2003 [--data_dir=gs://BUCKET/tfds]

TFDS's own `tfds build` command imports Apache Beam for every dataset, and installing Beam beside jbert would
downgrade protobuf and pyarrow. This command calls TFDS's builder API instead (`builder.download_and_prepare` with
`file_format=array_record`), which is what `tfds build` does for a dataset that is not a Beam dataset. A Beam
dataset (TFDS's `wikipedia`) is refused before anything is downloaded, with the route that works: Wikipedia
comes from the Hugging Face parquet dump through `python -m jbert.data prepare`.

Flags: --data_dir (default: $TFDS_DATA_DIR, else ~/tensorflow_datasets; `gs://` works), --manual_dir (datasets
whose files the user downloads by hand), --imports (modules that define builders of your own),
--max_examples_per_split (a quick sample), --overwrite (prepare again). A dataset already prepared in that form is
left as it is. A user's mistake (an unknown name, a Beam dataset, an unwritable --data_dir) is one line,
`jbert.tfds_build: ...`, exit status 2.
"""
from __future__ import annotations

import importlib
import logging
import os
import sys
import tempfile
import time
from typing import Sequence

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


class BeamDataset(errors.UserError):
  """The dataset needs Apache Beam to prepare."""


def _tfds():
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top  (slow)
  # Registers the text datasets (glue, conll2003) where TFDS does not import them by itself (no TensorFlow).
  import tensorflow_datasets.text  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  return tfds


def _beam_refusal(name: str) -> BeamDataset:
  return BeamDataset(
      f"{name} is an Apache Beam dataset, which jbert's install leaves out (Beam pins older protobuf and pyarrow "
      "than jbert's). For Wikipedia, prepare the Hugging Face dump instead: `python -m jbert.data prepare "
      "--input=PARQUET_GLOB --output=DIR` (README: Pretraining BERT-base on English Wikipedia); otherwise "
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
  try:
    found.download_and_prepare(download_config=config, file_format=FORMAT)
  except ImportError as e:
    if "apache_beam" in str(e) or getattr(e, "name", None) == "apache_beam":
      raise _beam_refusal(name) from None
    raise
  return os.fspath(found.data_dir)


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
