"""Random-access document sources: `len(src)` documents, `src[i]` a list of sentences (str).

Random access (rather than a stream) lets every process read its own 1/N of the documents and lets grain
resume at any position without replaying data.

* `BertFormatFiles`: google-research/bert's input format, a sentence per line, a blank line between documents.
  Like `TextFiles`, it takes local paths or URLs (gs://, ...) and compressed files (.gz, .zst, ...; held
  decompressed in memory), indexing every file whole when it is made: fine for one machine, while a pod reads a
  prepared corpus (`jbert.data.prepared`), whose start-up does not grow with the corpus.
* `TextFiles`: plain text, documents separated by blank lines, lines joined (hard-wrapped text is common) and
  split into sentences.
* `TfdsDocuments`: any TFDS dataset with a text feature through `tfds.data_source` (ArrayRecord, no
  TensorFlow); paragraphs are the text's lines, split into sentences. Data is never downloaded at run time:
  `tfds_data_source` says how to prepare a missing dataset.
* `HeldOutSentences`: a source whose documents are each cut in two at a sentence, for holding out the tails of
  a corpus too small to spare whole documents (a novel without blank lines is one document).

Sentences are split by `sentencex` (Wikimedia): rule-based, maintained, about 300 languages, pure Python with
no model to download, so it runs offline on every host; NLTK's punkt would need a data download and spaCy a
model. Bad bytes never crash a run: they are decoded with U+FFFD replacement characters and counted in
`stats`, as are lines cut at `max_line_chars`.
"""
import abc
import collections
import contextlib
import logging
import os
import re
from collections.abc import Iterator, Sequence

import numpy as np
import sentencex

from jbert.data import paths

log = logging.getLogger(__name__)

# One or more blank lines: what separates documents. Anchored on a newline, so matching stays linear in the
# file size even on pathological whitespace-only lines.
_SEPARATOR = re.compile(rb"\n(?:[ \t\r\f\v]*\n)+")
# A file is refused as not text when more than this share of the characters of its first `_SAMPLE_BYTES` (blanks
# aside) are U+FFFD (bytes that are not UTF-8) or control characters such as NUL: text with a few bad bytes trains
# (they are counted), a binary file or a whole file in another encoding would train on noise.
_MAX_BAD_SHARE = 0.5
_SAMPLE_BYTES = 1 << 20
_BAD_CHARS = re.compile("[\ufffd\x00-\x08\x0e-\x1f\x7f]")


expand_globs = paths.expand_globs  # the name this module has always offered


def check_text(data: bytes, path: str) -> None:
  """A ValueError naming `path` when its bytes are mostly not UTF-8 text (binary, or Latin-1 and the like)."""
  sample = data[:_SAMPLE_BYTES].decode("utf-8", errors="replace")
  shown = "".join(sample.split())
  bad = len(_BAD_CHARS.findall(shown))
  if shown and bad > _MAX_BAD_SHARE * len(shown):
    raise ValueError(f"{path} is not UTF-8 text: {bad} of the first {len(shown)} characters are NUL, control "
                     "characters or bytes that are not UTF-8 (a binary file, or text in another encoding); convert "
                     "it to UTF-8 (e.g. `iconv -f latin1 -t utf-8`) or leave it out of the data files.")


def split_sentences(text: str, language: str) -> list[str]:
  """Sentences of `text`, each of its non-blank lines (paragraphs) split by sentencex."""
  sentences = []
  for paragraph in text.split("\n"):
    if paragraph.strip():
      sentences += [s.strip() for s in sentencex.segment(language, paragraph) if s.strip()]
  return sentences


class DocumentSource(abc.ABC):
  """Base class: counts decoding replacements and cut lines in `stats`, warning once for each kind."""

  def __init__(self, max_line_chars: int):
    if max_line_chars < 1:
      raise ValueError(f"max_line_chars={max_line_chars} must be >= 1.")
    self.max_line_chars = max_line_chars
    self.stats = collections.Counter()

  @abc.abstractmethod
  def __len__(self) -> int:
    """Number of documents."""

  @abc.abstractmethod
  def __getitem__(self, index: int) -> list[str]:
    """The sentences of document `index`."""

  def get_many(self, indices) -> list[list[str]]:
    """The sentences of several documents; sources that read faster in bulk override it."""
    return [self[int(i)] for i in indices]

  @property
  def origin(self) -> str:
    """Where the documents come from, for error messages."""
    return type(self).__name__

  def _count(self, key: str, n: int, where: str) -> None:
    if n:
      if not self.stats[key]:
        log.warning("%s: %d %s (counted in stats[%r]; further cases are not logged).", where, n, key, key)
      self.stats[key] += n

  def decode(self, data: bytes | str, where: str) -> str:
    """UTF-8 text; undecodable bytes become U+FFFD and are counted as `replaced_chars`."""
    if isinstance(data, str):
      return data
    try:
      return data.decode("utf-8")
    except UnicodeDecodeError:
      text = data.decode("utf-8", errors="replace")
      self._count("replaced_chars", text.count("\ufffd"), where)
      return text

  def cut(self, lines: list[str], where: str) -> list[str]:
    """Lines shortened to `max_line_chars`; the number cut is counted as `truncated_lines`."""
    limit = self.max_line_chars
    self._count("truncated_lines", sum(len(line) > limit for line in lines), where)
    return [line[:limit] for line in lines]


class _IndexedFiles(DocumentSource):
  """Documents as byte ranges of files: blank-line separated blocks, indexed once at construction. Local and
  remote uncompressed files are read by range; compressed ones are held decompressed."""

  def __init__(self, patterns: str | Sequence[str], what: str, max_line_chars: int):
    super().__init__(max_line_chars)
    self.paths = expand_globs(patterns, what)
    self._held: dict[int, bytes] = {}  # file id -> decompressed bytes, for compressed files
    file_ids, starts, ends = [], [], []
    for file_id, path in enumerate(self.paths):
      data = paths.read_bytes(path)
      check_text(data, path)
      if paths.compression(path):
        self._held[file_id] = data
      bounds = [0, *(i for m in _SEPARATOR.finditer(data) for i in m.span()), len(data)]
      spans = np.array([(a, b) for a, b in zip(bounds[::2], bounds[1::2]) if data[a:b].strip()],
                       dtype=np.int64).reshape(-1, 2)
      file_ids.append(np.full(len(spans), file_id, np.int32))
      starts.append(spans[:, 0])
      ends.append(spans[:, 1])
    self._file = np.concatenate(file_ids)
    self._start = np.concatenate(starts)
    self._end = np.concatenate(ends)
    if not len(self._file):
      raise ValueError(f"{what}: the files {self.paths} hold no text (every line is blank).")

  def __len__(self) -> int:
    return len(self._file)

  @property
  def origin(self) -> str:
    shown = ", ".join(self.paths[:3])
    return shown + (f" and {len(self.paths) - 3} more files" if len(self.paths) > 3 else "")

  def read(self, index: int) -> tuple[str, str]:
    """The text of document `index` and a description of where it is."""
    file_id, start, end = int(self._file[index]), int(self._start[index]), int(self._end[index])
    path = self.paths[file_id]
    held = self._held.get(file_id)
    data = held[start:end] if held is not None else paths.read_range(path, start, end)
    where = f"{path} (document {index})"
    return self.decode(data.removeprefix(b"\xef\xbb\xbf"), where), where


class BertFormatFiles(_IndexedFiles):
  """google-research/bert input files: one sentence per line, documents separated by blank lines."""

  def __init__(self, patterns: str | Sequence[str], max_line_chars: int = 20_000, what: str = "files"):
    super().__init__(patterns, what, max_line_chars)

  def __getitem__(self, index: int) -> list[str]:
    text, where = self.read(index)
    return self.cut([line.strip() for line in text.split("\n") if line.strip()], where)


class TextFiles(_IndexedFiles):
  """Plain text: documents separated by blank lines; a document's lines are joined, then split."""

  def __init__(self, patterns: str | Sequence[str], language: str = "en", max_line_chars: int = 20_000,
               what: str = "text_files"):
    super().__init__(patterns, what, max_line_chars)
    self.language = language

  def __getitem__(self, index: int) -> list[str]:
    text, where = self.read(index)
    return split_sentences(" ".join(self.cut(text.split("\n"), where)), self.language)


class HeldOutSentences(DocumentSource):
  """`source` with each document cut at a sentence: part "head" keeps all but its last tenth of sentences (at
  least one), part "tail" only that tenth. The two parts are a training and a held-out split that share no
  sentence, for a corpus too small to spare whole documents (a novel without blank lines is one). Every document
  gives its tail, so the held-out split has as many documents as the corpus (NSP pairs draw their random next
  segment from another one) whatever the order of the files. A one-sentence document stays whole in "head"."""

  def __init__(self, source: DocumentSource, part: str):
    if part not in ("head", "tail"):
      raise ValueError(f"part={part!r}; expected 'head' or 'tail'.")
    super().__init__(source.max_line_chars)
    self.source, self.part = source, part
    self.stats = source.stats

  def __len__(self) -> int:
    return len(self.source)

  @property
  def origin(self) -> str:
    return self.source.origin

  def check(self) -> None:
    """Raises now, rather than once training reads it, when no document can spare a sentence."""
    if not any(self[i] for i in range(len(self))) and self.part == "tail":
      raise ValueError(f"{self.origin}: too little text to hold any out for evaluation (no document has two "
                       "sentences); add text, set data.eval_files, or set eval_every_steps=0.")

  def __getitem__(self, index: int) -> list[str]:
    sentences = self.source[index]
    if len(sentences) < 2:  # nothing can be spared: training keeps it
      return sentences if self.part == "head" else []
    held_out = max(1, len(sentences) // 10)
    return sentences[:-held_out] if self.part == "head" else sentences[-held_out:]


class _Holder(logging.Handler):
  def __init__(self):
    super().__init__()
    self.records: list[logging.LogRecord] = []

  def emit(self, record: logging.LogRecord) -> None:
    self.records.append(record)


@contextlib.contextmanager
def _held_records(logger: logging.Logger) -> Iterator[None]:
  """Holds what `logger` emits in the block: replayed if the block succeeds, dropped if it raises (the error
  raised then says all that matters)."""
  handler = _Holder()
  propagate = logger.propagate
  logger.addHandler(handler)
  logger.propagate = False
  try:
    yield
  finally:
    logger.removeHandler(handler)
    logger.propagate = propagate
  for record in handler.records:
    logger.handle(record)


def tfds_data_source(name: str, split: str, data_dir: str | None = None, *, name_key: str = "tfds_name"):
  """`tfds.data_source(name, split=split, data_dir=data_dir)` of prepared data, never downloading.

  A missing or unprepared dataset is one `FileNotFoundError` saying how to prepare it; TFDS's own KeyError
  ("splits is empty") and its warnings about dataset folders that do not exist are kept from the user.
  `name_key` is the config key named when TFDS does not know `name`.
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top  (slow; only TFDS sources)
  where = f"data_dir={data_dir}" if data_dir else "TFDS's data dir (~/tensorflow_datasets or $TFDS_DATA_DIR)"
  build = f"`tfds build {name} --file_format=array_record{f' --data_dir={data_dir}' if data_dir else ''}`"
  not_prepared = (f"TFDS dataset {name!r} split {split!r} has no prepared random-access (array_record) files in "
                  f"{where}; prepare them once with {build}.")
  if data_dir and "://" not in data_dir and not os.path.isdir(data_dir):
    raise FileNotFoundError(f"{not_prepared} ({data_dir} does not exist.)")
  with _held_records(logging.getLogger("absl")):
    try:
      return tfds.data_source(name, split=split, data_dir=data_dir, download=False)
    except tfds.core.registered.DatasetNotFoundError:
      raise ValueError(f"TFDS has no dataset named {name!r} ({name_key}). Check the spelling and version, e.g. "
                       "'wikipedia/20230601.en' (https://www.tensorflow.org/datasets/catalog).") from None
    # KeyError: no dataset_info.json (never prepared); NotImplementedError: TFRecord files only, or none.
    except (KeyError, FileNotFoundError, NotImplementedError):
      raise FileNotFoundError(not_prepared) from None
    except Exception as e:  # pylint: disable=broad-except  (a bad split or a broken file: TFDS's words)
      raise ValueError(f"Cannot open TFDS dataset {name!r} split {split!r} in {where}: {e}\nPrepare it with "
                       f"{build} or fix the split.") from e


class TfdsDocuments(DocumentSource):
  """A TFDS split read by random access (`tfds.data_source`); `text_key` names the document's text feature."""

  def __init__(self, name: str, split: str, text_key: str = "text", data_dir: str | None = None,
               language: str = "en", max_line_chars: int = 20_000):
    super().__init__(max_line_chars)
    self.name, self.split, self.text_key, self.language = name, split, text_key, language
    self._source = tfds_data_source(name, split, data_dir)
    if not len(self._source):
      raise ValueError(f"TFDS dataset {name!r} split {split!r} is empty.")

  def __len__(self) -> int:
    return len(self._source)

  @property
  def origin(self) -> str:
    return f"TFDS {self.name}[{self.split}]"

  def __getitem__(self, index: int) -> list[str]:
    example = self._source[int(index)]
    if self.text_key not in example:
      raise KeyError(f"TFDS dataset {self.name!r} has no feature {self.text_key!r} (tfds_text_key); its "
                     f"features are {sorted(example)}.")
    where = f"tfds {self.name}[{self.split}] document {index}"
    text = self.decode(example[self.text_key], where)
    return split_sentences("\n".join(self.cut(text.split("\n"), where)), self.language)
