"""Named-entity recognition (CoNLL-2003, or your own CoNLL/JSONL files) with a per-token classifier.

The loss is transformers' `BertForTokenClassification` loss: cross-entropy over the sub-tokens that carry a
word's label (`labels != -100`), averaged over all of them in the global batch. Predictions are read on the
same sub-tokens, mapped back to words (long sentences through the windows of `features.py`) and
scored per entity as seqeval does, overall and per entity type; plain tags (PER, LOC) as IO tags, an entity per
maximal run of one type. A tag set mixing prefixed and plain tags is refused before anything is read further.

Prediction inputs (`read_inputs`): .txt (one sentence per line, words split at whitespace), .conll (CoNLL
columns, the first one), or .jsonl/.csv/.tsv with `column` (default `tokens`, else `text`): a list of words or a
text. A .txt or .tsv that is CoNLL columns (`ner.columns_or_sentences`) is read as columns, as training reads it.
Python inputs: lists of words, texts, or dicts with `tokens`/`text`.
"""
from __future__ import annotations

import logging
import os

import jax
import jax.numpy as jnp
import numpy as np

from jbert import errors
from jbert.data import files as files_lib
from jbert.model import BertForTokenClassification, registry
from jbert.runtime import atomic
from jbert.runtime import mirror
from jbert.tasks import inputs, sections
from jbert.tasks.base import MODEL_INPUTS, EvalSet, Weighted, mean_cross_entropy_sums
from jbert.tasks.finetuning import Batching, PredictingTask
from jbert.tasks.registry import register
from jbert.tasks.sources import Dataset, as_text, split_files
from jbert.tasks.token_classification import features as ner
from jbert.tasks.token_classification import sources
from jbert.tasks.token_classification.metrics import entity_scores

log = logging.getLogger("jbert")


CONLL_SUFFIXES = (".conll",)


def label_names_from(text: str | None) -> tuple[str, ...]:
  """`task.label_names` ("O,B-PER,I-PER,...") as a tuple; empty when unset."""
  names = tuple(n.strip() for n in (text or "").split(",") if n.strip())
  if len(set(names)) != len(names):
    raise ValueError(f"task.label_names={text!r} names a label twice; list each once.")
  return names


@register
class TokenClassification(PredictingTask):
  """A dataset of kind ner: TFDS conll2003, or CoNLL/JSONL files (`task.train_file`, or `local` with
  `task.kind=ner`); built without a tokenizer it only predicts (`jbert.predict`) or compiles."""

  kinds = ("ner",)
  datasets = sources.DATASETS
  local_kind = "ner"
  title = "named-entity recognition"
  head = registry.head(BertForTokenClassification)
  label_keys = ("labels",)
  token_keys = ("labels",)  # -100 past each row's tokens: a bucketed batch cuts only ignored labels
  token_outputs = ("tags",)
  packable = True  # packed: labels [R, T] in the row, IGNORE_INDEX past its sentences
  token_fill = {"labels": ner.IGNORE_INDEX}

  def __init__(self, dataset: Dataset | None = None, *, max_seq_length: int, global_batch_size: int = 32,
               seed: int = 0, tokenizer=None, data_dir: str | None = None, train_sentences: list[dict] | None = None,
               label_names: tuple[str, ...] = (), batching: Batching | None = None):
    """`dataset`: what it trains and evaluates on; without one (prediction) a tagger of `label_names`."""
    if dataset is not None and dataset.kind != "ner":
      raise ValueError(f"task {dataset.name!r} is {dataset.kind}, not named-entity recognition.")
    name, label_names = (dataset.name, dataset.label_names) if dataset is not None else ("predict", label_names)
    if len(label_names) < 2:
      raise ValueError(f"task {name}: labels {list(label_names)}; NER needs at least two "
                       "(e.g. O and one entity tag). Set --config.task.label_names=O,B-X,I-X,...")
    super().__init__(name, max_seq_length=max_seq_length, global_batch_size=global_batch_size, seed=seed,
                     batching=batching)
    self.dataset = dataset
    self.num_labels, self.label_names = len(label_names), tuple(label_names)
    self.tokenizer, self.data_dir = tokenizer, data_dir
    if tokenizer is None or dataset is None:
      return
    # Every split is read and featurised now, so that a bad file fails before anything compiles.
    for split in dataset.splits:
      sentences = self._load(split, train_sentences if split == "train" else None)
      if split == "train":
        if not sentences or any(s["tags"] is None for s in sentences):
          raise ValueError(f"task {self.name}: the training split ({dataset.splits['train']}) has no tagged "
                           "sentences.")
        self._train = self.featurise(sentences)
      else:
        tagged = bool(sentences) and all(s["tags"] is not None for s in sentences)
        self._eval_sets.append(EvalSet(split, self.featurise(sentences), split in dataset.eval_splits and tagged,
                                       examples=sentences))

  @classmethod
  def config_section(cls, name):
    return {**sections.files(), **sections.columns()}  # `local` picks NER with task.kind=ner

  @classmethod
  def ignores(cls, task_cfg):
    why = {k: "NER reads words and tags, not columns (task.label_names names the tags)"
           for k in ("text_a", "text_b", "label", "regression")}
    return {**why, **sections.files_ignored(cls.datasets, task_cfg)}

  @classmethod
  def from_config(cls, config, tokenizer=None) -> "TokenClassification":
    """TFDS conll2003, or local files when `task.train_file` is set (`local`, or conll2003's own files); the tag
    set is `task.label_names`, else the dataset's, else the training file's tags."""
    cfg = config.task
    dataset = cls.datasets.get(cfg.name)
    names = label_names_from(cfg.label_names)
    train_sentences, origin = None, "task.label_names" if names else "its tag set"
    if dataset is None or dataset.tfds_name is None or cfg.train_file:
      name = dataset.name if dataset is not None else "local"
      names = names or (dataset.label_names if dataset is not None else ())
      if not cfg.train_file:
        raise ValueError(f"task {name} (NER) reads local files: --config.task.train_file=FILE (CoNLL columns, or "
                         "JSONL with tokens and tags), and optionally eval_file and test_file.")
      files = split_files(name, {"train": cfg.train_file, "validation": cfg.eval_file, "test": cfg.test_file})
      if not names:
        train_sentences = ner.read_ner_file(files["train"])
        try:
          names = ner.infer_label_names(train_sentences)
        except ValueError as e:
          raise ValueError(f"task {name}: {e} Set --config.task.label_names=O,B-X,I-X,...") from None
        log.info("task %s: labels %s (the training file's tags)", name, ", ".join(names))
        origin = f"{files['train']}"
      dataset = sources.ner_files_dataset(name, files, names)
    elif names and names != tuple(dataset.label_names):
      raise ValueError(f"task.label_names={cfg.label_names!r}: {dataset.name} from TFDS has its tags fixed "
                       f"({', '.join(dataset.label_names)}); label names apply to local files "
                       "(--config.task.train_file=...).")
    try:
      ner.tag_scheme(dataset.label_names)
    except ValueError as e:
      raise ValueError(f"task {dataset.name}: {origin}: {e}") from None
    return cls(dataset, max_seq_length=config.data.max_seq_length, global_batch_size=config.batch_size,
               seed=config.seed, tokenizer=tokenizer, data_dir=cfg.tfds_data_dir, train_sentences=train_sentences,
               batching=Batching.from_config(config), **cls.options(cfg))

  @classmethod
  def options(cls, task_cfg) -> dict:  # pylint: disable=unused-argument
    """A subclass's own constructor settings from the config's `task` section (the CRF's scheme)."""
    return {}

  # -- prediction --

  @classmethod
  def for_prediction(cls, folder, *, kind, max_length=None, **options) -> "TokenClassification":
    del kind, options
    return cls(label_names=tuple(cls.recorded_labels(folder)), max_seq_length=cls.prediction_length(folder, max_length))

  def read_inputs(self, path, *, column=None, pair_column=None, pairs=False):
    suffix = inputs.open_input(path)
    inputs.only_pairs_for_classification(pair_column, pairs)
    if _as_columns(path, suffix, column, self.label_names):
      return [{"tokens": s["tokens"], "tags": None, "where": s["where"]} for s in ner.read_ner_file(path)]
    if files_lib.input_format(path) == "text":
      return [{"tokens": line.split(), "tags": None, "where": f"{path}, line {i + 1}"}
              for i, line in enumerate(files_lib.iter_records(path))]
    return [_sentence(row, where, column, path) for where, row in files_lib.iter_rows(path)]

  def inputs_from(self, records):
    return [_sentence(r if isinstance(r, dict) else {"tokens": r}, f"input {i}", None) for i, r in enumerate(records)]

  # -- data --

  def _load(self, split: str, sentences: list[dict] | None = None) -> list[dict]:
    """Sentences of a split as dicts: `tokens` (str), `tags` (ids, or None when the split has none), `where`."""
    dataset = self.dataset
    if dataset.tfds_name is None:
      if sentences is None:
        sentences = ner.read_ner_file(dataset.splits[split])
      try:
        return ner.encode_tags(sentences, self.label_names)
      except ValueError as e:
        raise ValueError(f"task {self.name}: {e} Fix the tag, or list every tag in --config.task.label_names "
                         "(comma-separated; by default the training file's tags).") from None
    source = dataset.load(split, data_dir=mirror.local_tfds_dir(self.data_dir, dataset.tfds_name))
    return [{"tokens": [as_text(w) for w in ex[dataset.text_keys[0]]],
             "tags": np.asarray(ex[dataset.label_key]).reshape(-1).tolist(),
             "where": f"example {i} of {dataset.tfds_name} {dataset.splits[split]}"} for i, ex in enumerate(source)]

  def featurise(self, sentences: list[dict]) -> dict[str, np.ndarray]:
    """Windows of sentences (`tokens`, and `tags` ids or None), every word in one of them."""
    return ner.ner_features(sentences, self.tokenizer, self.max_seq_length, tokens_key="tokens", tags_key="tags",
                            num_labels=self.num_labels)

  def batch_spec(self, batch_size, max_seq_length):
    return {k: jax.ShapeDtypeStruct((batch_size, max_seq_length), jnp.int32) for k in (*MODEL_INPUTS, "labels")}

  # -- losses --

  def loss(self, outputs, batch):
    """Cross-entropy and accuracy per labelled sub-token (a batch without one, all sentences empty, gives 0)."""
    weights = (batch["labels"] != ner.IGNORE_INDEX).astype(jnp.float32)  # [B, T]
    nll, correct = mean_cross_entropy_sums(outputs.logits, batch["labels"], weights)
    tokens = jnp.sum(weights)
    return {"loss": Weighted(nll, tokens), "accuracy": Weighted(correct, tokens)}

  # -- evaluation --

  def predictions(self, outputs, batch):
    return {"tags": jnp.argmax(outputs.logits, -1).astype(jnp.int32)}

  def records(self, eval_set, predictions) -> list[dict]:
    """One record per sentence: {"tokens": words, "tags": predicted tag names}, the windows' sub-token
    predictions mapped back to words; what `jbert.predict` returns and the prediction files hold."""
    predicted = ner.word_predictions(predictions["tags"], eval_set.features)
    return [{"tokens": list(s["tokens"]), "tags": [self.label_names[t] for t in words]}
            for s, words in zip(eval_set.examples, predicted)]

  def _tag_names(self, eval_set, predictions) -> tuple[list[list[str]], list[list[str]] | None]:
    predicted = [r["tags"] for r in self.records(eval_set, predictions)]
    gold = None
    if all(s["tags"] is not None for s in eval_set.examples):
      gold = [[self.label_names[t] for t in s["tags"]] for s in eval_set.examples]
    return predicted, gold

  def evaluate(self, eval_set, predictions):
    """Entity-level precision/recall/F1 and word accuracy, then `<TYPE>/<precision|recall|f1|support>`."""
    predicted, gold = self._tag_names(eval_set, predictions)
    scores = entity_scores(gold, predicted)
    metrics = {k: float(scores[k]) for k in ("precision", "recall", "f1", "accuracy")}
    for type_, s in scores["per_type"].items():
      metrics.update({f"{type_}/{k}": float(v) for k, v in s.items()})
    return metrics

  def write_outputs(self, eval_set, predictions, out_dir):
    """`predictions/<split>.conll`: `word gold predicted` per line (`word predicted` without gold tags), a blank
    line after each sentence: what conlleval reads."""
    predicted, gold = self._tag_names(eval_set, predictions)
    path = os.path.join(out_dir, "predictions", f"{eval_set.name}.conll")
    with atomic.open_for_write(path, encoding="utf-8") as f:
      for i, sentence in enumerate(eval_set.examples):
        columns = [sentence["tokens"], *([gold[i]] if gold is not None else []), predicted[i]]
        f.writelines(" ".join(c) + "\n" for c in zip(*columns))
        f.write("\n")
    return [path]


def _as_columns(path: str, suffix: str, column: str | None, label_names) -> bool:
  """Whether a prediction input is CoNLL columns: .conll, or a .txt/.tsv whose lines are (training reads every file
  but JSON lines as columns, so the same file means the same sentences to both)."""
  if suffix in CONLL_SUFFIXES:
    return True
  if column or suffix in ner.JSONL_SUFFIXES or files_lib.input_format(path) not in ("text", "tsv"):
    return False
  return ner.columns_or_sentences(path, label_names) == "columns"


def _sentence(row: dict, where: str, column: str | None, path: str | None = None) -> dict:
  """A prediction input's words: `column` (default `tokens`, else `text`), a list of words or a text."""
  name = column or ("tokens" if "tokens" in row else "text")
  if name not in row:
    raise ValueError(f"{where}: no field {errors.preview(name)} {inputs.fields_note(row, path)} Give the words as "
                     "`tokens` (a list) or `text` (split at whitespace), or pass --column.")
  value = row[name]
  if isinstance(value, str):
    tokens = value.split()
  elif isinstance(value, (list, tuple)) and all(isinstance(t, str) for t in value):
    tokens = list(value)
  else:
    raise ValueError(f"{where}: field {name!r} must be a list of words or a text, got {type(value).__name__}.")
  return {"tokens": tokens, "tags": None, "where": where}
