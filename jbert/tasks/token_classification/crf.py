"""Named-entity recognition with a linear-chain CRF over the tags: `--config.task.crf=true` on `conll2003` or `local`
NER (a variant of `token_classification`: the same data, windows, metrics, prediction inputs and files).

Model: `jbert.model.crf_head.BertForTokenClassificationCRF`, NER's BERT + Dense (the emissions) plus the CRF's
transitions, start and end scores in its parameters (`crf/...`), so checkpoints, sharding and `init_from` carry them.

Loss: the CRF's negative log-likelihood of each window's gold tags over the words it labels (the first sub-token of
each word, `labels != -100`, as NER's cross-entropy reads them), summed over the global batch and divided by its
labelled words: the reported `loss` is per word, like NER's cross-entropy, and at zero transitions without
constraints it IS that cross-entropy, so both heads start from the same loss and learning rate.

Constraints (`task.crf_scheme`, default `auto`: IOB2 for O/B-X/I-X tag sets, IOBES/BILOU where the labels are that,
IO for plain tags (PER, LOC: every transition allowed), none otherwise): a forbidden transition scores -1e4 in the
loss and is never decoded. A sentence longer than one window is split into windows (`features.py`),
each its own chain: the start constraint (no `I-X` first) applies where the chain starts at the sentence's first
word (position 1), so a window that starts inside an entity may begin with `I-X`; IOBES's end constraint is not
enforced (a window may end inside an entity), the learnt end scores stand in for it. Gold tags that break the
constraints (IOB1 data, where `I-X` may begin an entity) are refused before anything compiles, naming the sentence
and the fix.

Decoding: Viterbi on the device inside the predict step, over the words each window predicts (`predict_mask`), in
the trainer's evaluation (seqeval F1 of the decoded tags) and in `jbert.predict`. The windows of a long sentence
are decoded apart, so under IOB2 an `I-X` that begins a window's words after an O or another type of the window
before is written `B-X` (what seqeval reads it as; the scores are unchanged): every predicted sentence is valid.

Export: WORKDIR/export is NER's Hugging Face folder (`BertForTokenClassification`: transformers loads the encoder
and classifier, and gives the emissions as logits) plus `crf.safetensors` beside it: float32 `transitions`
[C, C] (row: the previous tag), `start_transitions` [C], `end_transitions` [C] (pytorch-crf's names), with the
label names and scheme in its metadata. config.json records the kind `ner_crf`, so `jbert.predict` decodes with
the CRF; a folder without the file is refused in one line.
"""
from __future__ import annotations

import json
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np

from jbert import errors
from jbert.model import crf as crf_lib
from jbert.model import tagging_schemes
from jbert.model.crf_head import BertForTokenClassificationCRF
from jbert.tasks.base import MODEL_INPUTS, Weighted
from jbert.tasks.registry import register
from jbert.tasks.token_classification import features as ner
from jbert.tasks.token_classification.task import TokenClassification

log = logging.getLogger("jbert")

CRF_FILE = "crf.safetensors"
SCHEMES = ("auto", *tagging_schemes.SCHEMES, "none")
_NAMES = ("transitions", "start_transitions", "end_transitions")


def resolve_scheme(label_names, scheme: str) -> str:
  """The scheme `task.crf_scheme` means for these labels: `auto` is IOB2 for any O/B-X/I-X tag set (IOB1 data are
  then refused by the gold check, with the fix), IOBES where the labels are that, IO for plain tags, else none."""
  if scheme != "auto":
    return scheme
  found = tagging_schemes.scheme_of(label_names)
  iob_shaped = all(n == "O" or (n[:2] in ("B-", "I-") and len(n) > 2) for n in label_names)
  return found or ("iob2" if iob_shaped and any(n != "O" for n in label_names) else "none")


@register
class CRFTokenClassification(TokenClassification):
  """NER with a CRF head: `task.crf=true` on the configs of kind ner (see the module docstring)."""

  kinds = ("ner_crf",)
  local_kind = None  # `local` with task.kind=ner and task.crf=true
  variant_of = "ner"
  title = "named-entity recognition with a CRF"
  predict_keys = (*MODEL_INPUTS, "predict_mask")  # the chain of the predict step: each window's predicted words
  packable = False
  unpackable_reason = "a CRF chain runs along each row, so the sentences of a packed row would be one chain"

  def __init__(self, dataset=None, *, scheme: str = "auto", label_names: tuple[str, ...] = (), **kwargs):
    if scheme not in SCHEMES:
      raise ValueError(f"task.crf_scheme={scheme!r}; use one of {', '.join(SCHEMES)}.")
    name, names = (dataset.name, dataset.label_names) if dataset is not None else ("predict", label_names)
    self.scheme = resolve_scheme(names, scheme)
    try:
      self.constraints = tagging_schemes.constraints_for(names, self.scheme)
    except ValueError as e:
      raise ValueError(f"task {name}: {e} (--config.task.crf_scheme=none)") from None
    # The chain's own constraints: transitions only; the start is enforced at sentence starts (`_emissions`).
    self.chain_constraints = None
    self.start_forbidden = None
    if self.constraints is not None:
      allowed, start, _ = self.constraints.arrays()
      self.chain_constraints = tagging_schemes.Constraints(allowed)
      self.start_forbidden = None if start.all() else tuple((~start).tolist())
    super().__init__(dataset, label_names=label_names, **kwargs)

  @classmethod
  def variant_keys(cls):
    return {
        "crf": False,             # NER: a linear-chain CRF over the tags (loss: its NLL per word; Viterbi decoding)
        "crf_scheme": "auto",     # the CRF's forbidden transitions: auto (from the label names), iob2, iobes,
                                  # io (plain tags such as PER: none forbidden), none
    }

  @classmethod
  def selects(cls, task_cfg) -> bool:
    return bool(task_cfg.get("crf"))

  @classmethod
  def options(cls, task_cfg) -> dict:
    return {"scheme": task_cfg.get("crf_scheme") or "auto"}

  # -- data --

  def _load(self, split, sentences=None):
    sentences = super()._load(split, sentences)
    if self.constraints is not None:
      arrays = self.constraints.arrays()
      for sentence in sentences:
        if sentence["tags"] is not None:
          self._check_gold(sentence, *arrays)
    return sentences

  def _check_gold(self, sentence, allowed, start, end) -> None:
    """Refuses gold tags the constraints forbid (IOB1's `I-X` beginning an entity), naming the sentence; `allowed`,
    `start`, `end`: the constraints' arrays."""
    tags = sentence["tags"]
    for i, tag in enumerate(tags):
      if i == 0 and not start[tag]:
        where = "first"
      elif i and not allowed[tags[i - 1], tag]:
        where = f"after {self.label_names[tags[i - 1]]!r}"
      elif i == len(tags) - 1 and not end[tag]:
        where = "last"
      else:
        continue
      fix = ("the tags look like IOB1 (where I-X may begin an entity): convert them to IOB2 (each entity's first "
             "word B-X)" if self.scheme == "iob2" else f"fix the tags to {self.scheme.upper()}")
      raise ValueError(f"task {self.name}: {sentence['where']} has tag {self.label_names[tag]!r} {where} (word "
                       f"{i + 1}), which {self.scheme.upper()} forbids; {fix}, or set --config.task.crf_scheme=none "
                       "to train the CRF without constraints.")

  # -- model --

  def model(self, bert_config):
    return BertForTokenClassificationCRF(bert_config, num_labels=self.num_labels)

  def load_init(self, path, bert_config, *, seed, fresh):
    """init_from's encoder and classifier; its transitions too when it is a CRF export with the same labels, else
    zeros (the CRF's initial value)."""
    params = dict(super().load_init(path, bert_config, seed=seed, fresh=fresh))
    params.pop("crf", None)
    found = None
    if isinstance(path, str) and os.path.isfile(os.path.join(path, CRF_FILE)):
      found, labels, _ = read_transitions(path)
      if labels != tuple(self.label_names):
        log.info("task %s: %s holds transitions for labels %s, not these; the CRF starts at zero.", self.name,
                 os.path.join(path, CRF_FILE), ", ".join(labels))
        found = None
    params["crf"] = found or zero_transitions(self.num_labels)
    return params

  def load_export(self, directory, bert_config):
    params = dict(super().load_export(directory, bert_config))
    params["crf"] = read_transitions(directory)[0]
    return params

  def export(self, bert_config, params, out_dir, tokenizer) -> None:
    """NER's Hugging Face folder of the encoder and classifier, and `crf.safetensors` beside it."""
    super().export(bert_config, {k: v for k, v in params.items() if k != "crf"}, out_dir, tokenizer)
    write_transitions(out_dir, params["crf"], self.label_names, self.scheme)

  # -- losses --

  def _emissions(self, logits, mask, forbidden):
    """The logits with `forbidden` added to the tags that may not start a sentence, at position 1 of the rows whose
    chain starts there (a sentence's first window: its first word is right after [CLS])."""
    if self.start_forbidden is None:
      return logits
    at_start = mask[:, 1, None] & jnp.asarray(self.start_forbidden)[None, :]  # [B, C]
    return logits.at[:, 1, :].add(jnp.where(at_start, forbidden, 0.0))

  def loss(self, outputs, batch):
    """The CRF's negative log-likelihood of the gold tags, and the accuracy of its Viterbi tags (what `predictions`
    decodes: the progress line's `acc`, as the softmax head's), per labelled word of the global batch."""
    labels = batch["labels"]
    mask = labels != ner.IGNORE_INDEX  # [B, T]
    emissions = self._emissions(outputs.logits, mask, crf_lib.NEG)
    log_likelihood = crf_lib.log_likelihood(emissions, labels, mask, outputs.potentials,
                                            self.chain_constraints)  # [B]
    words = jnp.sum(mask, dtype=jnp.float32)
    # A metric only: the decode (forbidden starts at -inf, as `predictions`) stays out of the gradient.
    decoded = jax.lax.stop_gradient(self._emissions(outputs.logits, mask, -jnp.inf))
    tags, _ = crf_lib.viterbi_decode(decoded, mask, jax.tree.map(jax.lax.stop_gradient, outputs.potentials),
                                     self.chain_constraints, fill_value=0)
    correct = jnp.sum((tags == labels) & mask, dtype=jnp.float32)
    return {"loss": Weighted(-jnp.sum(log_likelihood), words), "accuracy": Weighted(correct, words)}

  # -- evaluation --

  def predictions(self, outputs, batch):
    """Viterbi tags [B, T] over the sub-tokens that predict a word (`predict_mask`; 0 elsewhere)."""
    logits = outputs.logits
    mask = _fit(batch["predict_mask"], logits.shape[1]) != 0
    emissions = self._emissions(logits, mask, -jnp.inf)
    tags, _ = crf_lib.viterbi_decode(emissions, mask, outputs.potentials, self.chain_constraints, fill_value=0)
    return {"tags": tags}

  def records(self, eval_set, predictions):
    """NER's records; under IOB2, an `I-X` that starts a window's chain where the previous window's last word is not
    `B-X`/`I-X` is written `B-X` (what seqeval reads it as): every predicted sentence is valid IOB2."""
    records = super().records(eval_set, predictions)
    if self.scheme == "iob2":
      for record in records:
        record["tags"] = iob2_junctions(record["tags"])
    return records

  # -- prediction --

  @classmethod
  def for_prediction(cls, folder, *, kind, max_length=None, **options) -> "CRFTokenClassification":
    """The scheme the run trained with: a workdir's config, else the metadata of the folder's `crf.safetensors`
    (refused in one line when it is missing)."""
    del kind, options
    labels = cls.recorded_labels(folder)
    if folder.checkpoint_dir is not None:
      scheme = ((folder.run_config or {}).get("task") or {}).get("crf_scheme") or "auto"
    else:
      _, stored, scheme = read_transitions(_directory(folder), num_labels=len(labels))
      if stored != labels:
        raise errors.UserError(f"{os.path.join(_directory(folder), CRF_FILE)} is for labels {list(stored)}, but "
                               f"the model's config.json names {list(labels)}: they do not belong together; "
                               "export the model again with jbert.")
    return cls(label_names=tuple(labels), scheme=scheme, max_seq_length=cls.prediction_length(folder, max_length))

  def prediction_params(self, params, folder):
    """The head's parameters and the transitions: from a workdir's checkpoint, else the folder's crf.safetensors."""
    if folder.checkpoint_dir is not None:
      from jbert.checkpoint import reading  # pylint: disable=g-import-not-at-top  (Orbax)
      crf = reading.restore_params(folder.checkpoint_dir, folder.step)[1]["crf"]
    else:
      crf = read_transitions(_directory(folder), num_labels=self.num_labels)[0]
    return {**params, "crf": {k: np.asarray(crf[k], np.float32) for k in _NAMES}}


def iob2_junctions(tags: list[str]) -> list[str]:
  """`tags` with each `I-X` that does not follow `B-X`/`I-X` made `B-X`. Viterbi never decodes one inside a window's
  chain; at the junction of two windows of a long sentence, decoded apart, one can meet an O or another type."""
  out = list(tags)
  for i, tag in enumerate(out):
    if tag.startswith("I-") and (i == 0 or out[i - 1][2:] != tag[2:]):
      out[i] = "B-" + tag[2:]
  return out


def _directory(folder) -> str:
  return folder.weights if os.path.isdir(folder.weights) else os.path.dirname(folder.weights) or "."


def _fit(x, length: int):
  """[B, W] -> [B, length]: cut, or zero-padded (the Runner pads extra features to a power of two)."""
  width = x.shape[1]
  return x[:, :length] if width >= length else jnp.pad(x, ((0, 0), (0, length - width)))


def zero_transitions(num_labels: int) -> dict[str, np.ndarray]:
  c = num_labels
  return {"transitions": np.zeros((c, c), np.float32), "start_transitions": np.zeros(c, np.float32),
          "end_transitions": np.zeros(c, np.float32)}


def write_transitions(directory: str, crf, label_names, scheme: str) -> str:
  """`crf.safetensors` in `directory`: the CRF's three float32 arrays, the labels and scheme as metadata."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  path = os.path.join(directory, CRF_FILE)
  save_file({k: np.ascontiguousarray(np.asarray(jax.device_get(crf[k]), np.float32)) for k in _NAMES}, path,
            metadata={"format": "jbert-crf", "label_names": json.dumps(list(label_names)), "scheme": scheme})
  return path


def read_transitions(directory: str, num_labels: int | None = None) -> tuple[dict[str, np.ndarray], tuple, str]:
  """(the CRF's arrays, label names, scheme) of `directory`'s crf.safetensors; a missing or damaged file, or one
  for another number of labels, is one line naming it and the fix."""
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  path = os.path.join(directory, CRF_FILE)
  if not os.path.isfile(path):
    raise errors.UserError(
        f"{directory} records a model trained with a CRF (config.json's jbert.task is ner_crf), but has no "
        f"{CRF_FILE}, the CRF's transitions that jbert exports beside the weights: copy it from the run's "
        f"WORKDIR/export/, or predict from the run's workdir or export/ itself.")
  try:
    with safe_open(path, framework="numpy") as f:
      metadata = f.metadata() or {}
      arrays = {k: f.get_tensor(k) for k in _NAMES}
    labels = tuple(json.loads(metadata["label_names"]))
    scheme = metadata["scheme"]
  except Exception as e:  # pylint: disable=broad-except  (safetensors raises its own error types)
    raise errors.UserError(f"{path} is not a readable CRF file ({type(e).__name__}: {errors.shorten(str(e))}); "
                           "export the model again with jbert.") from None
  c = len(labels) if num_labels is None else num_labels
  shapes = {k: arrays[k].shape for k in _NAMES}
  if shapes != {"transitions": (c, c), "start_transitions": (c,), "end_transitions": (c,)} or len(labels) != c:
    raise errors.UserError(f"{path} holds transitions of shapes {shapes} for {len(labels)} labels, but the model "
                           f"has {c}: they do not belong together; export the model again with jbert.")
  if scheme not in SCHEMES:
    raise errors.UserError(f"{path} names the tagging scheme {errors.preview(scheme)}; export the model again with "
                           "jbert.")
  return {k: np.asarray(v, np.float32) for k, v in arrays.items()}, labels, scheme
