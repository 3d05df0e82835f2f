"""What a storage failure means to the user, in one line: a storage that cannot be reached (an outage, a dropped
connection), one that answers without object generations (gcp-storage-emulator), a bucket that does not exist.

Each storage client fails in its own vocabulary: gcsfs raises aiohttp's errors after its own retries (~30 s),
google-cloud-storage a RetryError after two minutes, tensorstore a ValueError whose text carries curl's reason,
requests its ConnectionError around urllib3's. `kind` reads an exception and everything it was raised from, and
`describe` says what happened in the user's terms; the commands report that instead of the client's words.

While jbert reports those failures itself, the libraries' own records of them (gcsfs's "out of retries", Orbax's
failed background threads, asyncio's unretrieved task exceptions, each with its traceback) stay off the console:
`library_tracebacks_off`. Handlers that write elsewhere (a log file) keep them, and JBERT_TRACEBACK=1 keeps them
everywhere.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from typing import Iterator

from jbert import errors

UNREACHABLE = "unreachable"
NO_GENERATIONS = "no_generations"
NO_BUCKET = "no_bucket"

# Exception classes (module.qualname, matched anywhere in the class's MRO, so nothing is imported to check) that
# mean the storage did not answer: the connection was refused, dropped or timed out after the client's retries.
_UNREACHABLE_TYPES = {
    "builtins.ConnectionError", "socket.gaierror",
    "aiohttp.client_exceptions.ClientConnectionError", "aiohttp.client_exceptions.ServerTimeoutError",
    "requests.exceptions.ConnectionError", "requests.exceptions.Timeout",
    "urllib3.exceptions.ProtocolError", "urllib3.exceptions.NewConnectionError", "urllib3.exceptions.MaxRetryError",
    "google.auth.exceptions.TransportError",
}
# tensorstore (and curl under it) say it in words.
_UNREACHABLE_TEXT = re.compile(
    r"Couldn't connect|Failed to connect|Connection refused|Connection reset|Server disconnected|Empty reply from "
    r"server|Could not resolve host|Timeout was reached|Cannot connect to host|Recv failure|Send failure",
    re.IGNORECASE)
_NO_GENERATIONS_TEXT = "Malformed StorageGeneration"
_BUCKET_IN_URL = re.compile(r"/b/([^/?]+)/o(?:\?|$)")  # an upload or a listing: not one object's URL


def _chain(error: BaseException) -> Iterator[BaseException]:
  """`error` and every exception it carries: causes, contexts, exception groups, and the exceptions that
  requests (args) and google-api-core (`cause`) keep as attributes."""
  seen, stack = set(), [error]
  while stack:
    e = stack.pop()
    if not isinstance(e, BaseException) or id(e) in seen:
      continue
    seen.add(id(e))
    yield e
    stack += [e.__cause__, e.__context__, getattr(e, "cause", None), *getattr(e, "exceptions", ()), *e.args]


def _type_names(error: BaseException) -> set[str]:
  return {f"{c.__module__}.{c.__qualname__}" for c in type(error).__mro__}


def _kind_of_one(error: BaseException) -> str | None:
  text = str(error)
  if _NO_GENERATIONS_TEXT in text:
    return NO_GENERATIONS
  if _type_names(error) & _UNREACHABLE_TYPES or _UNREACHABLE_TEXT.search(text):
    return UNREACHABLE
  return None


def kind(error: BaseException) -> str | None:
  """UNREACHABLE, NO_GENERATIONS, NO_BUCKET (only `bucket_missing` can tell that one) or None."""
  found = {_kind_of_one(e) for e in _chain(error)}
  for name in (NO_GENERATIONS, UNREACHABLE):  # a missing generation also breaks the retries that follow it
    if name in found:
      return name
  return NO_BUCKET if bucket_missing(error) else None


def unreachable(error: BaseException) -> bool:
  return kind(error) == UNREACHABLE


def _reason(error: BaseException, wanted: str) -> str:
  """The words of the innermost exception of kind `wanted`: the client's own reason, shortest form."""
  reason = None
  for e in _chain(error):
    if _kind_of_one(e) == wanted:
      text = " ".join(str(e).split(" [tensorstore_spec=")[0].split()) or type(e).__name__
      reason = text  # the chain runs outside in: the last one found is the innermost
  return errors.shorten(reason or type(error).__name__, 200)


def where() -> str:
  """The storage the clients talk to: the emulator's address, or Google Cloud Storage."""
  emulator = os.environ.get("STORAGE_EMULATOR_HOST", "").strip()
  return f"the storage at {emulator}" if emulator and emulator != "default" else "Google Cloud Storage"


def bucket_of(text: str) -> str | None:
  """The bucket a gs:// path or a JSON API URL names."""
  if text.startswith(("gs://", "gcs://")):
    return text.split("://", 1)[1].split("/", 1)[0] or None
  match = _BUCKET_IN_URL.search(text)
  return match.group(1) if match else None


def bucket_missing(error: BaseException) -> str | None:
  """The bucket named by an upload (or a listing) refused as not found: those are answered 404 only when the
  bucket does not exist (gcsfs raises FileNotFoundError with the request's URL alone)."""
  for e in _chain(error):
    if isinstance(e, FileNotFoundError):
      bucket = bucket_of(str(e.filename or (e.args[0] if e.args else "")))
      if bucket:
        return bucket
  return None


def describe(error: BaseException, path: str | None = None) -> str | None:
  """One sentence naming the storage failure `error` is, or None when it is none of these. `path` is the gs://
  path that was being written, for the bucket's name."""
  found = kind(error)
  if found == NO_GENERATIONS:
    return (f"{where()} answers without object generations (no x-goog-generation header), which the checkpoints' "
            "writer (tensorstore, under Orbax) needs for every array it writes; gcp-storage-emulator is such a "
            "storage: use fake-gcs-server (or Google Cloud Storage) instead")
  if found == UNREACHABLE:
    return f"{where()} cannot be reached ({_reason(error, UNREACHABLE)})"
  if found == NO_BUCKET:
    bucket = (bucket_of(path) if path else None) or bucket_missing(error)
    return (f"the bucket {bucket} does not exist (or this machine may not write it): create it (gcloud storage "
            f"buckets create gs://{bucket}) or check its name")
  return None


# ----------------------------------------------------------------------------------------------------------
# The libraries' own tracebacks of a failure jbert reports.
# ----------------------------------------------------------------------------------------------------------


def _writes_to_console(handler: logging.Handler) -> bool:
  handler = getattr(handler, "python_handler", handler)  # absl's handler writes through its PythonHandler
  stream = getattr(handler, "stream", None)
  return not isinstance(handler, logging.FileHandler) and stream is not None and stream in (
      sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__)


class _LibraryTracebacks(logging.Filter):
  """Drops, on a console handler, a library's record whose exception is a storage failure jbert reports."""

  def __init__(self, handler: logging.Handler):
    super().__init__()
    self.handler = handler
    self.dropped = 0

  def filter(self, record: logging.LogRecord) -> bool:
    if record.name == "jbert" or record.name.startswith("jbert.") or not record.exc_info:
      return True
    error = record.exc_info[1]
    if error is None or kind(error) not in (UNREACHABLE, NO_GENERATIONS) or not _writes_to_console(self.handler):
      return True
    self.dropped += 1
    return False


@contextlib.contextmanager
def library_tracebacks_off() -> Iterator[None]:
  """See the module docstring. Only the records that carry a storage failure go; every other record shows."""
  if errors.show_traceback():
    yield
    return
  installed = [(handler, _LibraryTracebacks(handler)) for handler in logging.getLogger().handlers]
  for handler, flt in installed:
    handler.addFilter(flt)
  try:
    yield
  finally:
    for handler, flt in installed:
      handler.removeFilter(flt)
