"""Cross-encoders (re-rankers): sentence-pair classification with one logit, trained and exported as
sentence-transformers' `CrossEncoder` trains and saves them (`configs/finetune.py:cross_encoder`).

The model is `BertForSequenceClassification` with `num_labels=1` on `[CLS] a [SEP] b [SEP]`; what differs from
the regression task is the loss, the score and the exported folder:

  task.loss=bce   mean `BCEWithLogits(logit, label)` on labels in [0, 1] (0/1, or soft): sentence-transformers'
                  `BinaryCrossEntropyLoss` (its default `activation_fn=Identity`), i.e. `torch.nn.BCEWithLogitsLoss`
  task.loss=mse   mean `(sigmoid(logit) - label)^2` on scores in [0, 1]: sentence-transformers'
                  `MSELoss(activation_fn=torch.nn.Sigmoid())`

Either way the score of a pair is `sigmoid(logit)`, what `CrossEncoder.predict` returns for a one-label model.
Evaluation reports what a re-ranker's user reads: for 0/1 labels accuracy, precision, recall and F1 at score 0.5
and average precision (scikit-learn's); for other scores Pearson and Spearman; and the loss. `jbert.predict`
serves an export (and any folder sentence-transformers marked as a CrossEncoder) with {"score": s, "logit": x}
records, s through the activation the folder records.
"""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from jbert.tasks import sections
from jbert.tasks.classification import sources
from jbert.tasks.classification.metrics import classification_metrics, classifier_report
from jbert.tasks.classification import task as classification
from jbert.tasks.base import Weighted
from jbert.tasks.finetuning import Batching
from jbert.tasks.registry import register
from jbert.weights import st_folder

LOSSES = ("bce", "mse")


@register
class CrossEncoder(classification.SequenceClassification):
  """Scored (text_a, text_b) pairs with a one-logit classifier; `loss` is bce or mse (see the module docstring),
  `activation` (sigmoid, or identity for a folder that records it) turns logits into scores."""

  kinds = ("cross_encoder",)
  datasets = {}  # the user's pair files only
  config_names = ("cross_encoder",)
  local_kind = None
  title = "cross-encoder"

  def __init__(self, dataset: sources.Dataset | None = None, *, loss: str = "bce", activation: str = "sigmoid",
               **kwargs):
    check_loss(loss)
    super().__init__(dataset, kind="cross_encoder", **kwargs)
    self.loss_kind, self.activation = loss, activation
    if self.tokenizer is not None:
      for split, labels in [("train", self._train["label"])] + [
          (s.name, s.features["label"]) for s in self._eval_sets if s.labelled]:
        check_labels(labels, dataset.splits[split])

  @classmethod
  def config_section(cls, name):
    columns = sections.columns()
    return {**sections.files(), **{k: columns[k] for k in ("text_a", "text_b", "label")},
            "loss": "bce",                    # bce: BCE with logits on labels in [0, 1] (sentence-transformers'
                                              # BinaryCrossEntropyLoss); mse: MSE of sigmoid(logit) on scores in
                                              # [0, 1] (its MSELoss with activation_fn=Sigmoid)
            }

  @classmethod
  def from_config(cls, config, tokenizer=None) -> "CrossEncoder":
    """The user's pair files (text_a, text_b, label columns; labels in [0, 1])."""
    files = classification.local_files(config.task)
    dataset = sources.local_dataset(config.task.name, files, classification.local_columns(config.task, pairs=True))
    return cls(dataset, loss=config.task.loss, max_seq_length=config.data.max_seq_length,
               global_batch_size=config.batch_size, seed=config.seed, tokenizer=tokenizer,
               batching=Batching.from_config(config))

  # -- prediction --

  @classmethod
  def recognises(cls, folder):
    """A folder sentence-transformers marked as a CrossEncoder, or a workdir of a `cross_encoder` run."""
    marked = _activation(folder) is not None
    trained = ((folder.run_config or {}).get("task") or {}).get("name") == "cross_encoder"
    return "cross_encoder" if folder.info.num_labels == 1 and (marked or trained) else None

  @classmethod
  def for_prediction(cls, folder, *, kind, max_length=None, **options) -> "CrossEncoder":
    del kind, options
    activation = _activation(folder)
    return cls(max_seq_length=cls.prediction_length(folder, max_length),
               columns=classification.recorded_columns(folder), activation=activation or "sigmoid")

  # -- losses, records, evaluation, export --

  def loss(self, outputs, batch):
    """The loss of one-logit outputs [B, 1] and (bce) the predictions on the label's side of 0.5, per pair."""
    import optax  # pylint: disable=g-import-not-at-top
    x, y = outputs.logits[..., 0].astype(jnp.float32), batch["label"].astype(jnp.float32)  # [B] or [R, S]
    weights = self.slot_weights(batch, y)
    pairs = jnp.sum(weights)
    if self.loss_kind == "mse":
      error = jax.nn.sigmoid(x) - y
      return {"loss": Weighted(jnp.sum(error * error * weights), pairs)}
    correct = ((x > 0) == (y > 0.5)).astype(jnp.float32)
    return {"loss": Weighted(jnp.sum(optax.sigmoid_binary_cross_entropy(x, y) * weights), pairs),
            "accuracy": Weighted(jnp.sum(correct * weights), pairs)}

  def records(self, eval_set, predictions) -> list[dict]:
    """{"score": s, "logit": x} per pair."""
    logits = np.asarray(predictions["logits"])                                # [N, 1]
    return [{"score": float(s), "logit": float(x)} for s, x in zip(scores(logits, self.activation), logits[:, 0])]

  def _output_columns(self, records):
    return ["score", "logit"], [[f"{r['score']:.8f}", f"{r['logit']:.8f}"] for r in records]

  def evaluate(self, eval_set, predictions):
    return evaluate(self.loss_kind, predictions["logits"], eval_set.features["label"])

  def export(self, bert_config, params, out_dir, tokenizer) -> None:
    super().export(bert_config, params, out_dir, tokenizer)
    # sentence-transformers' CrossEncoder files beside the Hugging Face folder
    st_folder.write_cross_encoder_files(out_dir, self.max_seq_length)


def _activation(folder) -> str | None:
  """The activation sentence-transformers recorded in a model folder (its local copy for gs://), else None."""
  where = getattr(folder, "local", None) or folder.path
  return st_folder.cross_encoder_activation(where) if os.path.isdir(where) else None


def check_loss(loss: str) -> None:
  if loss not in LOSSES:
    raise ValueError(f"task.loss={loss!r}; a cross-encoder trains with one of {', '.join(LOSSES)} (bce: 0/1 or "
                     "soft labels; mse: scores in [0, 1]).")


def check_labels(labels: np.ndarray, path: str) -> None:
  """Labels must be probabilities: a BCE or sigmoid target outside [0, 1] cannot be reached."""
  bad = np.flatnonzero(~((labels >= 0) & (labels <= 1)))
  if len(bad):
    raise ValueError(f"task cross_encoder: row {int(bad[0])} of {path} has label {float(labels[bad[0]])}, outside "
                     "[0, 1]; a cross-encoder's labels are 0/1 or scores in [0, 1]: rescale the column (STS-B's "
                     "0-5 scores divided by 5).")


# -- scores and evaluation (host) --


def scores(logits, activation: str) -> np.ndarray:
  """float64 scores [N] of one-logit outputs [N, 1] through the recorded activation."""
  x = np.asarray(logits, np.float64)[:, 0]
  return 1.0 / (1.0 + np.exp(-x)) if activation == "sigmoid" else x


def evaluate(loss: str, logits, gold) -> dict[str, float]:
  """Metrics of one labelled split (see the module docstring)."""
  x, y = np.asarray(logits, np.float64)[:, 0], np.asarray(gold, np.float64)
  p = scores(logits, "sigmoid")
  if loss == "mse":
    value = np.mean((p - y) ** 2)
  else:  # BCE with logits, stably: max(x, 0) - x*y + log(1 + exp(-|x|)).
    value = np.mean(np.maximum(x, 0) - x * y + np.log1p(np.exp(-np.abs(x))))
  if np.all((y == 0) | (y == 1)):
    predicted, labels = (p > 0.5).astype(np.int64), y.astype(np.int64)
    report = classifier_report(predicted, labels, 2)
    metrics = {"accuracy": float(np.mean(predicted == labels)), "f1": report["f1"],
               "precision": report["precision"], "recall": report["recall"],
               "average_precision": average_precision(p, labels)}
  else:
    metrics = classification_metrics(("pearson", "spearman"), p, y)
  return {**metrics, "loss": float(value) if len(y) else 0.0}


def average_precision(scores_: np.ndarray, labels: np.ndarray) -> float:
  """scikit-learn's `average_precision_score`: sum over score thresholds of (R_n - R_{n-1}) * P_n, tied scores
  forming one threshold; 0 without positives."""
  scores_, labels = np.asarray(scores_, np.float64), np.asarray(labels) == 1
  positives = labels.sum()
  if not positives:
    return 0.0
  order = np.argsort(-scores_, kind="stable")
  s, hits = scores_[order], labels[order]
  last = np.r_[np.flatnonzero(np.diff(s)), len(s) - 1]  # The last row of each group of tied scores.
  tp = np.cumsum(hits)[last]
  precision, recall = tp / (last + 1), tp / positives
  return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))
