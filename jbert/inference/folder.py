"""A model folder resolved once: what it is, where its weights and tokenizer are, and what run wrote it.

Loading used to follow the path several times (`weights.describe`, `find_checkpoint_dir` and a Checkpointer for
the config, again for the vocabulary, again for the run's settings); `resolve` looks once, opening a training
checkpoint read-only once, and callers (`loading.load_model`, `Predictor`) take what they need from the answer.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any

from jbert import errors, untrusted, weights
from jbert.tokenizer import find_tokenizer
from jbert.weights import remote, st_folder


@dataclasses.dataclass(frozen=True)
class ModelFolder:
  """What `resolve` found.

  Attributes:
    path: the path as given.
    weights: what `load_pretrained` reads (for a sentence-transformers folder, its Transformer module's folder).
    info: `jbert.weights.ModelInfo`: config, recorded head, number and names of labels, kind ("hf", "tf1",
      "jbert", "workdir").
    sentence_transformer: a sentence-transformers folder's settings
      (`jbert.weights.st_folder.SentenceTransformerSettings`).
    tokenizer: the tokenizer file found for it (beside the weights, in WORKDIR/tokenizer/, or a run's
      `data.vocab`), or None.
    checkpoint_dir, step: a training run's checkpoint folder and the step read, else None.
    run_config: the training config of the run that wrote it (a workdir's checkpoint, or an export's
      results.json), and `run_config_from`, where that was read; None when unknown.
    local: where its files are read on this machine: the path, or a gs:// model's local copy (None: the path).
  """
  path: str
  weights: str
  info: Any
  sentence_transformer: Any = None
  tokenizer: str | None = None
  checkpoint_dir: str | None = None
  step: int | None = None
  run_config: dict[str, Any] | None = None
  run_config_from: str | None = None
  local: str | None = None


def require_exists(path: str | os.PathLike) -> None:
  """A model path that does not exist is named as such, before any check that depends on what it holds."""
  path = os.fspath(path)
  if not remote.exists(path):
    raise FileNotFoundError(f"Model path {path} does not exist; pass a model folder (Hugging Face, "
                            "sentence-transformers, jbert) or a TF1 checkpoint prefix.")


def resolve(path: str | os.PathLike) -> ModelFolder:
  """Resolves the model at `path` (any folder `loading.load_model` reads) without reading its weights.

  Raises FileNotFoundError / ValueError as `load_pretrained` would for a path that holds no model.
  """
  from jbert.checkpoint import manager as checkpoint, reading  # pylint: disable=g-import-not-at-top  (Orbax)
  given = os.fspath(path)
  require_exists(given)
  path = remote.local_model(given)  # a gs:// model other than a training workdir: its local copy
  st_settings, weights_path = None, path
  if st_folder.is_sentence_transformer(path):
    st_settings, weights_path = st_folder.read_sentence_transformer(path)
  directory = reading.find_checkpoint_dir(weights_path) if remote.is_dir(weights_path) else None
  step = run_config = run_config_from = None
  if directory is not None and not weights.jbert_dir.is_jbert_dir(weights_path) and not weights.hf_io.is_hf_dir(
      weights_path):
    ckpt = reading.open_for_reading(directory)
    try:
      step = ckpt.latest_step()
      if step is None:
        raise FileNotFoundError(f"{directory} holds no checkpoint step.")
      info = weights.info_from_config(ckpt.read_json(step, "bert_config"), "workdir")
      try:
        run_config, run_config_from = ckpt.read_json(step, "config"), f"{directory}/{step}"
      except checkpoint.CheckpointError:
        pass
    finally:
      ckpt.close()
  else:
    directory = None
    info = weights.describe(weights_path)
    run_config, run_config_from = recorded_config(path)
  folder = weights_path if remote.is_dir(weights_path) else os.path.dirname(weights_path) or "."
  tokenizer = None
  for candidate in dict.fromkeys((folder, path if remote.is_dir(path) else folder)):
    tokenizer = find_tokenizer(candidate)
    if tokenizer is not None:
      break
  if tokenizer is None and run_config:
    vocab = (run_config.get("data") or {}).get("vocab")
    tokenizer = vocab if vocab and remote.exists(vocab) else None
  return ModelFolder(path=given, weights=weights_path, info=info, sentence_transformer=st_settings,
                     tokenizer=tokenizer, checkpoint_dir=None if directory is None else os.fspath(directory),
                     step=step, run_config=run_config, run_config_from=run_config_from, local=path)


def recorded_config(path: str) -> tuple[dict[str, Any] | None, str | None]:
  """(training config, where it was read) of the fine-tuning run that wrote `path`: a workdir's latest
  checkpoint, or for its exported model (WORKDIR/export) the run's results.json; (None, None) otherwise."""
  from jbert.checkpoint import manager as checkpoint, reading  # pylint: disable=g-import-not-at-top  (Orbax)
  if not os.path.isdir(path):
    return None, None
  directory = reading.find_checkpoint_dir(path)
  if directory is not None:
    ckpt = reading.open_for_reading(directory)
    try:
      step = ckpt.latest_step()
      return (ckpt.read_json(step, "config"), f"{directory}/{step}") if step is not None else (None, None)
    except checkpoint.CheckpointError as e:
      raise ValueError(f"{e} Predict from the run's export/ folder instead.") from None
    finally:
      ckpt.close()
  results = os.path.join(os.path.dirname(os.path.abspath(path)), "results.json")
  try:
    summary = untrusted.read_json(results)
  except errors.UserError:
    if os.path.lexists(results):  # There, but no file a run writes: said, not taken for "no record".
      raise
    return None, None
  except OSError:
    return None, None
  export = summary.get("export") if isinstance(summary, dict) else None
  same = isinstance(export, str) and os.path.basename(os.path.normpath(export)) == os.path.basename(
      os.path.abspath(path))
  return (summary["config"], results) if same and isinstance(summary.get("config"), dict) else (None, None)
