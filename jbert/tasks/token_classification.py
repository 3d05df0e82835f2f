"""Named-entity recognition (CoNLL-2003, or your own CoNLL/JSONL files) with a per-token classifier.

The loss is transformers' `BertForTokenClassification` loss: cross-entropy over the sub-tokens that carry a
word's label (`labels != -100`), averaged over all of them in the global batch. Predictions are read on the
same sub-tokens, mapped back to words (long sentences through the windows of `jbert.data.finetune.ner`) and
scored per entity as seqeval does, overall and per entity type.
"""
from __future__ import annotations

import logging
import os

import jax
import jax.numpy as jnp
import numpy as np

from jbert.data.finetune import ner
from jbert.data.finetune import tasks as finetune_tasks
from jbert.data.finetune.examples import as_text
from jbert.model import BertForTokenClassification, registry
from jbert.tasks import feeding
from jbert.tasks.base import MODEL_INPUTS, EvalSet, Task, mean_cross_entropy_sums

log = logging.getLogger("jbert")


def label_names_from(text: str | None) -> tuple[str, ...]:
  """`task.label_names` ("O,B-PER,I-PER,...") as a tuple; empty when unset."""
  names = tuple(n.strip() for n in (text or "").split(",") if n.strip())
  if len(set(names)) != len(names):
    raise ValueError(f"task.label_names={text!r} names a label twice; list each once.")
  return names


class TokenClassification(Task):
  """A `jbert.data.finetune.Task` of kind ner (TFDS conll2003), or local files when `task.train_file` is set
  (`data_task` None: `local` with `task.kind=ner`)."""

  head = registry.head(BertForTokenClassification)
  exports = True

  def __init__(self, data_task: finetune_tasks.Task | None, config, extra_test_tasks=()):
    del extra_test_tasks  # Only GLUE pairs a task with another's test set.
    cfg = config.task
    names = label_names_from(cfg.label_names)
    self._train_sentences = None  # read in advance when the label set comes from them
    if data_task is None or data_task.tfds_name is None or cfg.train_file:
      data_task = self._files_task(data_task.name if data_task is not None else "local", cfg,
                                   names or (data_task.label_names if data_task is not None else ()))
    elif names and names != tuple(data_task.label_names):
      raise ValueError(f"task.label_names={cfg.label_names!r}: {data_task.name} from TFDS has its tags fixed "
                       f"({', '.join(data_task.label_names)}); label names apply to local files "
                       "(--config.task.train_file=...).")
    if data_task.kind != "ner":
      raise ValueError(f"task {data_task.name!r} is {data_task.kind}, not named-entity recognition.")
    if len(data_task.label_names) < 2:
      raise ValueError(f"task {data_task.name}: labels {list(data_task.label_names)}; NER needs at least two "
                       "(e.g. O and one entity tag). Set --config.task.label_names=O,B-X,I-X,...")
    self.data_task, self.name = data_task, data_task.name
    self.num_labels, self.label_names = data_task.num_labels, tuple(data_task.label_names)
    self.max_seq_length = config.data.max_seq_length
    self.data_dir = cfg.tfds_data_dir
    self._train = None
    self._eval: dict[str, tuple[dict[str, np.ndarray], list[dict]]] = {}  # split -> (features, sentences)

  # -- data --

  def _files_task(self, name: str, cfg, names: tuple[str, ...]) -> finetune_tasks.Task:
    if not cfg.train_file:
      raise ValueError(f"task {name} (NER) reads local files: --config.task.train_file=FILE (CoNLL columns, or "
                       "JSONL with tokens and tags), and optionally eval_file and test_file.")
    files = finetune_tasks.split_files(name, {"train": cfg.train_file, "validation": cfg.eval_file,
                                              "test": cfg.test_file})
    if not names:
      self._train_sentences = ner.read_ner_file(files["train"])
      try:
        names = ner.infer_label_names(self._train_sentences)
      except ValueError as e:
        raise ValueError(f"task {name}: {e} Set --config.task.label_names=O,B-X,I-X,...") from None
      log.info("task %s: labels %s (the training file's tags)", name, ", ".join(names))
    return finetune_tasks.ner_files_task(name, files, names)

  def _load(self, split: str) -> list[dict]:
    """Sentences of a split as dicts: `tokens` (str), `tags` (ids, or None when the split has none), `where`."""
    task = self.data_task
    if task.tfds_name is None:
      if split == "train" and self._train_sentences is not None:
        sentences, self._train_sentences = self._train_sentences, None
      else:
        sentences = ner.read_ner_file(task.splits[split])
      try:
        return ner.encode_tags(sentences, self.label_names)
      except ValueError as e:
        raise ValueError(f"task {self.name}: {e} Fix the tag, or list every tag in --config.task.label_names "
                         "(comma-separated; by default the training file's tags).") from None
    source = task.load(split, data_dir=self.data_dir)
    return [{"tokens": [as_text(w) for w in ex[task.text_keys[0]]],
             "tags": np.asarray(ex[task.label_key]).reshape(-1).tolist(),
             "where": f"example {i} of {task.tfds_name} {task.splits[split]}"} for i, ex in enumerate(source)]

  def _features(self, sentences: list[dict]) -> dict[str, np.ndarray]:
    return ner.ner_features(sentences, self.tokenizer, self.max_seq_length, tokens_key="tokens", tags_key="tags",
                            num_labels=self.num_labels)

  def prepare(self, tokenizer) -> None:
    """Reads and featurises every split once, so that a bad file fails before anything compiles (and the
    training split's size sets the epochs)."""
    self.tokenizer = tokenizer
    if self._train is not None:
      return
    for split in self.data_task.splits:
      sentences = self._load(split)
      if split == "train":
        if not sentences or any(s["tags"] is None for s in sentences):
          raise ValueError(f"task {self.name}: the training split ({self.data_task.splits['train']}) has no "
                           "tagged sentences.")
        self._train = self._features(sentences)
      else:
        self._eval[split] = (self._features(sentences), sentences)

  def num_train_examples(self):
    return len(self._train["input_ids"]) if self._train is not None else 0

  def batch_spec(self, batch_size, max_seq_length):
    return {k: jax.ShapeDtypeStruct((batch_size, max_seq_length), jnp.int32) for k in (*MODEL_INPUTS, "labels")}

  def train_stream(self, config, tokenizer, layout):
    self.prepare(tokenizer)
    return feeding.FeatureStream(self._train, (*MODEL_INPUTS, "labels"), global_batch_size=config.batch_size,
                                 seed=config.seed, num_shards=layout.num_shards, shards=layout.shards)

  def eval_sets(self, config, tokenizer, *, layout):
    self.prepare(tokenizer)
    sets = []
    for split, (features, sentences) in self._eval.items():
      tagged = bool(sentences) and all(s["tags"] is not None for s in sentences)
      sets.append(EvalSet(split, features, split in self.data_task.eval_splits and tagged, examples=sentences))
    return sets

  # -- losses --

  def loss_totals(self, batch):
    return {"tokens": jnp.sum((batch["labels"] != ner.IGNORE_INDEX).astype(jnp.float32))}

  def loss_sums(self, outputs, batch):
    weights = (batch["labels"] != ner.IGNORE_INDEX).astype(jnp.float32)  # [B, T]
    nll, correct = mean_cross_entropy_sums(outputs.logits, batch["labels"], weights)
    return {"nll": nll, "correct": correct, "tokens": jnp.sum(weights)}

  def loss(self, sums, totals):
    # A batch without a labelled word (all sentences empty) contributes nothing rather than 0/0.
    return sums["nll"] / jnp.maximum(totals["tokens"], 1.0)

  def train_metrics(self, sums):
    tokens = jnp.maximum(sums["tokens"], 1.0)
    return {"loss": sums["nll"] / tokens, "accuracy": sums["correct"] / tokens}

  # -- evaluation --

  def predictions(self, outputs, batch):
    return {"tags": jnp.argmax(outputs.logits, -1).astype(jnp.int32)}

  def _tag_names(self, eval_set, predictions) -> tuple[list[list[str]], list[list[str]] | None]:
    predicted = ner.word_predictions(predictions["tags"], eval_set.features)
    names = self.label_names
    gold = None
    if all(s["tags"] is not None for s in eval_set.examples):
      gold = [[names[t] for t in s["tags"]] for s in eval_set.examples]
    return [[names[t] for t in p] for p in predicted], gold

  def evaluate(self, eval_set, predictions):
    """Entity-level precision/recall/F1 and word accuracy, then `<TYPE>/<precision|recall|f1|support>`."""
    predicted, gold = self._tag_names(eval_set, predictions)
    scores = ner.entity_scores(gold, predicted)
    metrics = {k: float(scores[k]) for k in ("precision", "recall", "f1", "accuracy")}
    for type_, s in scores["per_type"].items():
      metrics.update({f"{type_}/{k}": float(v) for k, v in s.items()})
    return metrics

  def write_outputs(self, eval_set, predictions, out_dir):
    """`predictions/<split>.conll`: `word gold predicted` per line (`word predicted` without gold tags), a blank
    line after each sentence: what conlleval reads."""
    predicted, gold = self._tag_names(eval_set, predictions)
    path = os.path.join(out_dir, "predictions", f"{eval_set.name}.conll")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
      for i, sentence in enumerate(eval_set.examples):
        columns = [sentence["tokens"], *([gold[i]] if gold is not None else []), predicted[i]]
        f.writelines(" ".join(c) + "\n" for c in zip(*columns))
        f.write("\n")
    return [path]
