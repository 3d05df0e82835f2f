"""Loading and saving BERT weights in every format users already have.

`load_pretrained` reads a Hugging Face directory, an original TF1 checkpoint, a jbert model directory or a jbert
training workdir; every format is first brought to transformers' state-dict names and then mapped by
`hf_names.hf_to_params`, so one mapping (and its shape checks) serves them all.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jbert import errors
from jbert.model import BertConfig, BertForPreTraining, BertModel, init_params, registry, stack_layers
from jbert.model.config import RUNTIME_FIELDS
from jbert.weights import hf_io, hf_names, jbert_dir, sizes, tf1

log = logging.getLogger("jbert")

# Fields a caller may change at load time: none of them changes a weight's shape. `hidden_act` is here because
# the original TF code's "gelu" is the tanh approximation: pass hidden_act="gelu_new" to reproduce it exactly.
# config.json's section of what only jbert reads (transformers keeps unknown keys as attributes and ignores them).
JBERT_KEY = "jbert"
OVERRIDABLE = RUNTIME_FIELDS + ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout",
                                "hidden_act")


@dataclasses.dataclass(frozen=True)
class ModelInfo:
  """What a checkpoint says about itself, read without its weights.

  Attributes:
    config: its BertConfig (runtime fields at their defaults unless the checkpoint is jbert's).
    head: the recorded head (config.json `architectures`), or None when the checkpoint does not say.
    num_labels: the recorded number of labels of a head that takes a chosen one.
    label_names: names in label-id order (`id2label`), when recorded.
    kind: "hf", "tf1", "jbert" (a model directory) or "workdir" (a jbert training run).
    task: the kind of task that trained it (`jbert.tasks`), recorded by jbert as config.json's `jbert.task`; None
      for other checkpoints.
  """
  config: BertConfig
  head: registry.Head | None
  num_labels: int | None
  label_names: tuple[str, ...] | None
  kind: str
  task: str | None = None


def describe(path: str | os.PathLike) -> ModelInfo:
  """The config, head and labels of any checkpoint `load_pretrained` reads, without reading its weights.

  The sizes the config sets are bounded by what the weight files can hold (`sizes.check`), so a config.json that
  does not belong to its weights is refused before anyone builds what it describes. A labelled head whose
  config.json records no labels (transformers 5 writes none for its default of 2) gets their number from the
  classifier's shape in the safetensors header, as transformers reads it."""
  from jbert.weights import remote  # pylint: disable=g-import-not-at-top  (Orbax only when needed)
  path = remote.local_model(path)  # a gs:// model other than a training workdir: its local copy
  kind, config_dict = _read_config_only(path)
  info = info_from_config(config_dict, kind, _config_file(path, kind))
  stored = _stored(path, kind)
  if stored is not None:
    sizes.check(info.config, stored, _config_file(path, kind), info.num_labels)
    names = info.config.family.heads.get(info.head.architecture) if info.head is not None else None
    rows = stored.rows(f"{names.linear.get('classifier', 'classifier') if names else 'classifier'}.weight")
    if info.head is not None and info.head.labelled and info.num_labels is None and rows:
      info = dataclasses.replace(info, num_labels=rows)
  return info


def info_from_config(config_dict: dict[str, Any], kind: str, where: str = "the model config") -> ModelInfo:
  """`describe`'s answer for a config dict already read (config.json, or a workdir's recorded `bert_config`);
  `where` names it in errors."""
  head = registry.by_architecture(config_dict.get("architectures"))
  label_names = _label_names(config_dict.get("id2label"), where)
  num_labels = config_dict.get("num_labels") or (len(label_names) if label_names else None)
  if num_labels is not None and (type(num_labels) is not int or num_labels < 1):
    raise ValueError(f"{where}: num_labels={errors.preview(num_labels)} is not a positive int; use the config "
                     "written with the weights.")
  if head is not None and not head.labelled:
    num_labels, label_names = None, None
  record = config_dict.get(JBERT_KEY)
  task = record.get("task") if isinstance(record, dict) else None
  return ModelInfo(BertConfig.from_dict(config_dict), head, num_labels, label_names, kind,
                   task if isinstance(task, str) else None)


def _label_names(id2label: Any, where: str) -> tuple[str, ...] | None:
  """Label names in id order from a config's `id2label` ({"0": "neg", ...}); ids 0..n-1, each once."""
  if not id2label:
    return None
  try:
    ids = sorted(int(k) for k in id2label)
    if not isinstance(id2label, dict) or ids != list(range(len(ids))):
      raise ValueError
  except (TypeError, ValueError):
    raise ValueError(f"{where}: id2label={errors.preview(id2label)} does not map the ids 0, 1, ... to label names; "
                     "use the config written with the weights.") from None
  return tuple(id2label[k] for k in sorted(id2label, key=int))


def model_config_dict(config: BertConfig, model_cls: type, num_labels: int | None = None,
                      label_names=None, *, full: bool = False, task: str | None = None) -> dict[str, Any]:
  """config.json contents: BertConfig fields, the architecture, for labelled heads id2label/label2id and, for a
  model a jbert task trained, the task's kind (`{"jbert": {"task": kind}}`, which transformers ignores)."""
  head = registry.head(model_cls)
  architecture = config.family.architecture(head.architecture, config.model_type)
  d = {**config.to_dict(full=full), "architectures": [architecture]}
  if head.labelled and num_labels is not None:
    names = list(label_names) if label_names else [f"LABEL_{i}" for i in range(num_labels)]
    if len(names) != num_labels:
      raise ValueError(f"{len(names)} label names {names} for a head with num_labels={num_labels}.")
    d["num_labels"] = int(num_labels)
    d["id2label"] = {str(i): n for i, n in enumerate(names)}
    d["label2id"] = {n: i for i, n in enumerate(names)}
  if task is not None:
    d[JBERT_KEY] = {"task": task}
  return d


@dataclasses.dataclass
class _Source:
  config: dict[str, Any]  # config.json / bert_config.json contents.
  state: dict[str, np.ndarray]  # transformers state-dict names.
  stored_as: dict[str, str] = dataclasses.field(default_factory=dict)  # Name in the file, where it differs.
  architecture: str | None = None  # Class the checkpoint was saved from, when recorded.
  file: str = ""  # Where the weights were read, for messages: a weight file, a TF1 prefix, a checkpoint folder.
  config_file: str = "the model config"  # Where the config was read, for messages.


def _stored_state(source: _Source) -> sizes.Stored:
  where = hf_io.weights_file(source.file) if os.path.isdir(source.file) and hf_io.is_hf_dir(source.file) else (
      source.file)
  return sizes.Stored(where, 0, {k: np.shape(v) for k, v in source.state.items()})


def _bounded(config_dict: dict[str, Any], params: Any, where: str, config_file: str) -> BertConfig:
  """The config of a jbert tree `params`, checked against the values the tree holds before it is mapped (which
  walks every layer the config names)."""
  config = BertConfig.from_dict(config_dict)
  leaves = jax.tree_util.tree_leaves_with_path(params)
  sizes.check(config, sizes.Stored(where, 0, {jax.tree_util.keystr(p): np.shape(v) for p, v in leaves}), config_file)
  return config


def _config_file(path: str, kind: str) -> str:
  """The file (or checkpoint item) a checkpoint's config is read from, for messages."""
  if kind == "tf1":
    return tf1.find_checkpoint(path)[1]
  if kind == "workdir":
    return f"the bert_config recorded in {path}"
  return os.path.join(path, "config.json")


def _stored(path: str, kind: str) -> sizes.Stored | None:
  """What the weight files of a checkpoint of `kind` hold, read without the weights (None for a training workdir,
  whose config jbert recorded itself; its parameters are checked once read)."""
  if kind == "hf":
    return hf_io.stored(path)
  if kind == "jbert":
    return jbert_dir.stored(path)
  if kind == "tf1":
    return tf1.stored(tf1.find_checkpoint(path)[0])
  return None


class Loaded(NamedTuple):
  """What `load_pretrained_report` read: the config, the params, and the parameter paths (`classifier/kernel`)
  that were initialised rather than loaded, so callers can tell an untrained head without reading the log."""
  config: BertConfig
  params: Any
  initialised: tuple[str, ...]


def load_pretrained(path: str | os.PathLike, model_cls: type = BertForPreTraining, *,
                    num_labels: int | None = None, rng_seed: int = 0, **overrides) -> tuple[BertConfig, Any]:
  """(config, unboxed params of `model_cls(config, ...)`) from a checkpoint directory or TF1 prefix.

  See `load_pretrained_report`, which also says which weights were initialised.
  """
  loaded = load_pretrained_report(path, model_cls, num_labels=num_labels, rng_seed=rng_seed, **overrides)
  return loaded.config, loaded.params


def load_pretrained_report(path: str | os.PathLike, model_cls: type = BertForPreTraining, *,
                           num_labels: int | None = None, rng_seed: int = 0, **overrides) -> Loaded:
  """`Loaded(config, unboxed params of `model_cls(config, ...)`, initialised paths)` from a checkpoint directory
  or TF1 prefix.

  `overrides` replace the BertConfig fields in `OVERRIDABLE` (dtype, param_dtype, scan_layers, ...). Weights the
  class does not use are dropped, and a task head (or pooler) the checkpoint lacks, or holds in another shape,
  is initialised from `rng_seed`; both are logged as warnings on the 'jbert' logger. `num_labels=None` takes the
  checkpoint's recorded number (config.json `num_labels`/`id2label`, or the classifier's size). Any other
  missing weight is a ValueError naming it.
  """
  from jbert.weights import remote  # pylint: disable=g-import-not-at-top  (Orbax only when needed)
  path = remote.local_model(path)  # a gs:// model other than a training workdir: its local copy
  unknown = sorted(set(overrides) - set(OVERRIDABLE))
  if unknown:
    raise TypeError(f"load_pretrained got {', '.join(unknown)}: only {', '.join(OVERRIDABLE)} can be overridden "
                    "at load time (the others are fixed by the checkpoint), plus num_labels and rng_seed.")
  head = registry.head(model_cls)
  source = _read_any(path)
  config = dataclasses.replace(BertConfig.from_dict(source.config), **overrides)
  recorded = info_from_config(source.config, "any", source.config_file).num_labels
  # Before anything is built from the config (the weight mapping walks every layer it names).
  sizes.check(config, _stored_state(source), source.config_file, recorded if head.labelled else None)
  _refuse_non_finite(source)
  if num_labels is None and head.labelled:
    num_labels = recorded
  state = _drop_mismatched_heads(source.state, head, num_labels, config)
  params, unused, missing = hf_names.hf_to_params(state, config, model_cls, num_labels=num_labels)
  if unused:
    names = sorted(source.stored_as.get(n, n) for n in unused)
    log.warning("load_pretrained(%s): %d weights that %s does not use were dropped: %s", path, len(names),
                model_cls.__name__, errors.listing(names, 100))
  if missing:
    params = _initialise_heads(params, missing, config, head, num_labels, rng_seed, path)
  dtype = jnp.dtype(config.param_dtype)
  params = jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, params)
  return Loaded(config, stack_layers(params) if config.scan_layers else params, tuple(missing))


def save_pretrained(config: BertConfig, params: Any, out_dir: str | os.PathLike, model_cls: type | None = None,
                    *, format: str = "hf", label_names=None,  # pylint: disable=redefined-builtin
                    tokenizer=None, task: str | None = None) -> str:
  """Writes a Hugging Face directory (format="hf") or a jbert model directory (format="jbert").

  `model_cls` defaults to the class whose parameter tree `params` is. Scanned params are unstacked for the
  Hugging Face format and kept as they are (with the full config) for the jbert format. A labelled head's
  config.json gets `id2label`/`label2id` from `label_names` (LABEL_i without them), so transformers reports the
  names; a `tokenizer` (`jbert.tokenizer.Tokenizer`) writes its files beside the weights; `task` records the kind
  of task that trained it (`model_config_dict`). Returns `out_dir`.
  """
  out_dir = os.fspath(out_dir)
  params = nn.meta.unbox(params)
  model_cls = model_cls or infer_model_cls(params)
  head = registry.head(model_cls)
  num_labels = None
  if head.labelled:
    num_labels = int(np.shape(params["classifier"]["kernel"])[-1])
  if format == "jbert":
    jbert_dir.write(out_dir, model_config_dict(config, model_cls, num_labels, label_names, full=True, task=task),
                    params)
  elif format == "hf":
    hf_io.write(out_dir, model_config_dict(config, model_cls, num_labels, label_names, task=task),
                hf_names.params_to_hf(jax.tree.map(np.asarray, params), config, model_cls))
  else:
    raise ValueError(f"save_pretrained(format={format!r}): use 'hf' (transformers) or 'jbert'.")
  if tokenizer is not None:
    tokenizer.save(out_dir)
  return out_dir


def infer_model_cls(params: Any) -> type:
  """The class whose parameter tree `params` is; a tree that two classes share asks for `model_cls`."""
  top = set(params)
  if "bert" not in top:
    return BertModel
  pooler = "pooler" in params["bert"]
  candidates = []
  for head in registry.heads():
    names = {"bert"} | {w.path[0] for w in head.linear_weights} | ({"mlm"} if head.has_mlm else set())
    if head.cls is not BertModel and names == top and head.pooler == pooler:
      candidates.append(head)
  if len(candidates) > 1:  # Multiple choice and 1-label regression share a tree.
    outputs = np.shape(params["classifier"]["kernel"])[-1] if "classifier" in params else None
    candidates = [h for h in candidates if h.num_labels is None] if outputs != 1 else candidates
  if len(candidates) == 1:
    return candidates[0].cls
  raise ValueError(f"Cannot tell which BERT class params with top-level keys {sorted(top)} belong to (e.g. "
                   "multiple choice vs. 1-label regression); pass model_cls=jbert.BertFor... explicitly.")


# ----------------------------------------------------------------------------------------------------------


def _read_any(path: str) -> _Source:
  """Config and transformers-named weights of any supported format."""
  _refuse_special_files(path)
  if jbert_dir.is_jbert_dir(path):
    config_dict, params = jbert_dir.read(path)
    head = registry.by_architecture(config_dict.get("architectures")) or registry.head(BertForPreTraining)
    where, config_file = os.path.join(path, jbert_dir.PARAMS), os.path.join(path, jbert_dir.CONFIG)
    config = _bounded(config_dict, params, where, config_file)
    return _Source(config_dict, hf_names.params_to_hf(params, config, head.cls), file=where,
                   config_file=config_file)
  if os.path.isdir(path) and hf_io.is_hf_dir(path):
    return _Source(hf_io.read_config(path), hf_io.read_state_dict(path), file=path,
                   config_file=os.path.join(path, hf_io.CONFIG))
  found = tf1.find_checkpoint(path)
  if found is not None:
    prefix, config_file = found
    state, tf_names, optimizer = tf1.read_state_dict(prefix)
    if optimizer:
      log.info("load_pretrained(%s): skipped %d optimiser variables (adam_m, adam_v, global_step, ...).", path,
               len(optimizer))
    return _Source(BertConfig.from_json_file(config_file).to_dict(), state, tf_names, file=prefix,
                   config_file=config_file)
  # Orbax managers only when needed.
  from jbert.checkpoint import reading  # pylint: disable=g-import-not-at-top
  if reading.find_checkpoint_dir(path) is not None:  # local or gs://
    config_dict, params = reading.restore_params(path)
    where = os.fspath(reading.find_checkpoint_dir(path))
    config = _bounded(config_dict, params, where, _config_file(path, "workdir"))
    head = registry.by_architecture(config_dict.get("architectures"))  # Recorded since fine-tuning landed.
    cls = head.cls if head else infer_model_cls(params)
    return _Source(config_dict, hf_names.params_to_hf(params, config, cls), file=where,
                   config_file=_config_file(path, "workdir"))
  from jbert.weights import remote  # pylint: disable=g-import-not-at-top
  what = "does not exist" if not remote.exists(path) else "is not a BERT checkpoint jbert can read"
  raise FileNotFoundError(
      f"{path} {what}. Looked for: a Hugging Face dir (config.json with {' or '.join(hf_io.WEIGHT_FILES)}), "
      f"a TF1 checkpoint (a dir or prefix with *.index and {tf1.CONFIG} beside it), a jbert model dir "
      "(config.json + params/) or a jbert training workdir (checkpoints/<step>/state).")


def _refuse_non_finite(source: _Source) -> None:
  """A damaged file can still parse: NaN or inf weights would give confident, meaningless outputs (every label
  the same, NaN scores), so they stop the load, naming the first bad tensor as the file names it."""
  for name, value in source.state.items():
    value = np.asarray(value)
    if value.dtype.kind != "f" or np.isfinite(value).all():
      continue
    bad = ~np.isfinite(value)
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    stored = source.stored_as.get(name, name)
    file = hf_io.weights_file(source.file, stored) if os.path.isdir(source.file) and hf_io.is_hf_dir(
        source.file) else source.file
    raise ValueError(f"{file}: weight {stored} holds {int(bad.sum())} non-finite values (first "
                     f"{value[first]} at {list(first)}); the file is damaged or the run that wrote it diverged. "
                     "Download, convert or export the model again.")


def _refuse_special_files(path: str) -> None:
  """A config or weight file that is there but no regular file (a FIFO, a link to /dev/zero) is named: the
  format checks below test `isfile` and would otherwise report "no checkpoint", or a reader would block."""
  if os.path.isdir(path):
    hf_io.refuse_special_files(path, (hf_io.CONFIG, *hf_io.WEIGHT_FILES, tf1.CONFIG))


def _read_config_only(path: str) -> tuple[str, dict[str, Any]]:
  """(kind, config dict) of any format `_read_any` reads, without touching the weights."""
  _refuse_special_files(path)
  if jbert_dir.is_jbert_dir(path):
    return "jbert", jbert_dir.read_config(path)
  if os.path.isdir(path) and hf_io.is_hf_dir(path):
    return "hf", hf_io.read_config(path)
  found = tf1.find_checkpoint(path)
  if found is not None:
    return "tf1", BertConfig.from_json_file(found[1]).to_dict()
  # Orbax managers only when needed.
  from jbert.checkpoint import reading  # pylint: disable=g-import-not-at-top
  if reading.find_checkpoint_dir(path) is not None:  # local or gs://
    return "workdir", reading.read_model_config(path)
  return "missing", _read_any(path).config  # Raises the error that lists what was looked for.


def _drop_mismatched_heads(state: dict[str, np.ndarray], head: registry.Head, num_labels: int | None,
                           config: BertConfig):
  """Drops task-head weights whose output size differs from what the head builds, so they are re-initialised."""
  names = config.family.head_names(head.architecture)
  outputs = {f"{names.linear.get('/'.join(w.path), w.hf)}.": w.size(config, num_labels)
             for w in head.linear_weights}
  keep = {}
  for name, value in state.items():
    want = next((n for prefix, n in outputs.items() if name.startswith(prefix)), None)
    if want is not None and np.shape(value)[0] != want:
      log.warning("load_pretrained: %s has %d outputs but %s has %d; it is re-initialised.", name,
                  np.shape(value)[0], head.architecture, want)
      continue
    keep[name] = value
  return keep


def _initialise_heads(params, missing, config, head, num_labels, rng_seed, path):
  """Fills `missing` head (and pooler) paths from a seeded init; a missing encoder weight is an error."""
  backbone = [m for m in missing if m.startswith(("bert/", "embeddings/", "embeddings_project/", "encoder/"))
              and "/pooler/" not in f"/{m}" and "/pooler_norm/" not in f"/{m}"]
  if backbone:
    raise ValueError(f"{path} lacks weights that {head.architecture} needs: {errors.listing(backbone)}. Check that "
                     "the checkpoint is complete and that its config.json describes it.")
  model = head.cls(dataclasses.replace(config, scan_layers=False), **head.model_kwargs(num_labels))
  paths = [tuple(m.split("/")) for m in missing]

  @jax.jit
  def init_missing(rng):  # Only the missing leaves are outputs: XLA drops every other initialiser.
    fresh = nn.meta.unbox(init_params(model, rng))
    return [_get(fresh, p) for p in paths]

  for p, value in zip(paths, init_missing(jax.random.key(rng_seed))):
    _set(params, p, np.asarray(value))
  log.warning("load_pretrained(%s): %s weights not in the checkpoint were initialised (rng_seed=%d): %s", path,
              head.architecture, rng_seed, ", ".join(missing))
  return params


def _get(tree, path):
  for key in path:
    tree = tree[key]
  return tree


def _set(tree, path, value):
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value
