"""Bi-encoders (Sentence-BERT): sentence embeddings trained with sentence-transformers' objectives.

One task class per objective, all on `SentenceEncoder` (BERT + pooling + optional Dense + optional Normalize):

  sts_cosine   scored pairs (text_a, text_b, label): CosineSimilarityLoss, the score mapped from
               `task.score_range=LOW,HIGH` to [0, 1]
  nli_softmax  labelled pairs: SoftmaxLoss, a classifier over (u, v, |u - v|) trained with the encoder and not
               exported (as sentence-transformers saves no loss module)
  mnrl         (anchor, positive[, negative]) rows: MultipleNegativesRankingLoss (scale 20, cosine), the negative
               from `task.text_c`; `task.symmetric=True` for the symmetric form
  triplet      (anchor, positive, negative) rows: TripletLoss, euclidean distance, `task.margin` (5)

A batch row holds the K texts of one example ([B, K, T] inputs, each text a sequence of its own), so
`batch_size` counts pairs or triplets. Evaluation files (`task.eval_file`) are scored by `task.eval_kind`:
`scored` pairs give Spearman and Pearson of cos(u, v) (sts_cosine's default); `classes` the classifier's accuracy
(nli_softmax's); `retrieval` (mnrl's) ranks, for each anchor, a corpus of every distinct positive (and negative)
text of the file, its own positive the relevant one: MRR@10, nDCG@10, recall@1/10; `triplet` the share of rows
with |a - p| < |a - n|. WORKDIR/export is a sentence-transformers folder.
"""
from __future__ import annotations

import abc
import logging

import jax
import jax.numpy as jnp
import numpy as np

from jbert.data import local, packing, streams
from jbert.weights import st_folder
from jbert.model import BertModel, SentenceEncoder, registry, validation
from jbert.tasks.sentence_embedding import losses
from jbert.tasks.sentence_embedding import metrics
from jbert.tasks.sentence_embedding import features as sentence_pairs
from jbert.tasks.sentence_embedding import sources
from jbert.tasks.sentence_embedding.encoder import Encoder, config_section, encoder_from_config
from jbert.tasks.base import MODEL_INPUTS, PACKED_INPUTS, EvalSet, Weighted, mean_cross_entropy_sums, rows_of
from jbert.tasks.finetuning import Batching, FinetuneTask
from jbert.tasks.registry import register
from jbert.tasks.sources import split_files

log = logging.getLogger("jbert")

EVAL_KINDS = ("scored", "classes", "retrieval", "triplet")
# Per objective: the text columns of a training row (text_c optional for mnrl) and the default eval kind.
_TEXTS = {"sts_cosine": ("text_a", "text_b"), "nli_softmax": ("text_a", "text_b"),
          "mnrl": ("text_a", "text_b", "text_c"), "triplet": ("text_a", "text_b", "text_c")}
_EVAL = {"sts_cosine": "scored", "nli_softmax": "classes", "mnrl": "retrieval", "triplet": "triplet"}


class SentenceEmbedding(FinetuneTask):
  """The bi-encoder objectives' shared featurisation, model, evaluation and export; subclasses set `objective`
  and the loss."""

  head = registry.head(SentenceEncoder)
  datasets = sources.DATASETS  # one per objective, named by its kind (the registry picks the class by it)
  objective = ""
  label_keys = ("label",)
  # Packed: every text a sequence of its own, pooled per segment, gathered back to [N, K, D] by `text_slots`;
  # evaluation stays length-bucketed.
  packable, reads_cls, gathers_texts = True, True, True

  def __init__(self, *, encoder: Encoder, max_seq_length: int, global_batch_size: int = 32, seed: int = 0,
               tokenizer=None, files: dict[str, str] | None = None, columns: dict[str, str] | None = None,
               eval_kind: str = "", score_range: tuple[float, float] = (0.0, 1.0),
               label_names: tuple[str, ...] | None = None, init_from: str | None = None,
               export_max_seq_length: int | None = None, batching: Batching | None = None, **loss_settings):
    super().__init__(self.objective, max_seq_length=max_seq_length, global_batch_size=global_batch_size, seed=seed,
                     batching=batching)
    self.encoder, self.tokenizer, self.init_from = encoder, tokenizer, init_from
    if export_max_seq_length is not None and export_max_seq_length < 1:
      raise ValueError(f"task.export_max_seq_length={export_max_seq_length} must be a length >= 1 (None: "
                       "init_from's, or data.max_seq_length).")
    self.export_length = self._export_length(export_max_seq_length)
    self.columns, self.score_range, self.loss_settings = dict(columns or {}), score_range, loss_settings
    self.label_names = label_names
    self.num_labels = len(label_names) if label_names else None
    self.eval_kind = eval_kind or _EVAL[self.objective]
    if self.eval_kind not in EVAL_KINDS:
      raise ValueError(f"task.eval_kind={eval_kind!r}: use one of {', '.join(EVAL_KINDS)} (or '' for the "
                       "objective's own).")
    self.num_texts = len(self.train_keys())
    if tokenizer is None or not files:
      return
    self._train = self._read(files["train"], self.train_keys(), self._train_label(), "train")
    if not len(self._train["input_ids"]):
      raise ValueError(f"task {self.name}: the training file {files['train']} has no rows.")
    self.check_training_rows(files["train"])
    if "validation" in files:
      keys, label = self._eval_columns()
      features = self._read(files["validation"], keys, label, "validation")
      self._eval_sets.append(EvalSet("validation", features, True, self._texts))

  @classmethod
  def config_section(cls, name):
    return config_section(name)

  @classmethod
  def from_config(cls, config, tokenizer=None) -> "SentenceEmbedding":
    cfg = config.task
    dataset = cls.datasets[cfg.name]
    if config.get("keep_best"):
      raise ValueError(f"keep_best={config.keep_best!r}: bi-encoder tasks export the last step's encoder; set "
                       "--config.keep_best=None.")
    files = split_files(dataset.name, {"train": cfg.train_file, "validation": cfg.eval_file}) if (
        tokenizer is not None) else None
    columns = {k: cfg[k] for k in ("text_a", "text_b", "text_c", "label") if cfg.get(k)}
    try:
      low, high = (float(x) for x in cfg.score_range.split(","))
    except ValueError:
      raise ValueError(f"task.score_range={cfg.score_range!r}: give LOW,HIGH, e.g. 0,5.") from None
    if not high > low:
      raise ValueError(f"task.score_range={cfg.score_range!r}: HIGH must exceed LOW.")
    names = tuple(n.strip() for n in cfg.get("label_names", "").split(",") if n.strip()) or None
    settings = {k: cfg[k] for k in ("scale", "symmetric", "margin") if k in cfg}
    return cls(encoder=encoder_from_config(cfg, config.init_from), max_seq_length=config.data.max_seq_length,
               global_batch_size=config.batch_size, seed=config.seed, tokenizer=tokenizer, files=files,
               columns=columns, eval_kind=cfg.eval_kind, score_range=(low, high), label_names=names,
               init_from=config.init_from, export_max_seq_length=cfg.get("export_max_seq_length"),
               batching=Batching.from_config(config), **settings)

  def _export_length(self, setting: int | None) -> tuple[int, str]:
    """(the export's max_seq_length, where it comes from): the setting; else init_from's sentence-transformers
    length, which a shorter training length must not cut (its positions beyond were trained before); else the
    training length."""
    if setting is not None:
      return setting, "task.export_max_seq_length"
    source = self.encoder.init_max_length
    if source is not None and source >= self.max_seq_length:
      return source, f"init_from's sentence_bert_config.json; training truncated at data.max_seq_length=" \
                     f"{self.max_seq_length}"
    return self.max_seq_length, "data.max_seq_length"

  # -- data --

  def train_keys(self) -> tuple[str, ...]:
    keys = _TEXTS[self.objective]
    return keys if "text_c" in self.columns or self.objective == "triplet" else keys[:2]

  def _train_label(self) -> str | None:
    return "label" if self.objective in ("sts_cosine", "nli_softmax") else None

  def _eval_columns(self) -> tuple[tuple[str, ...], str | None]:
    if self.eval_kind in ("scored", "classes"):
      return ("text_a", "text_b"), "label"
    if self.eval_kind == "triplet":
      return ("text_a", "text_b", "text_c"), None
    return self.train_keys()[:3], None

  def _read(self, path: str, keys: tuple[str, ...], label: str | None, split: str) -> dict[str, np.ndarray]:
    """Featurised rows of `path`; `self._texts` keeps their texts (retrieval deduplicates the corpus by text)."""
    want = [*keys, *([label] if label else [])]
    missing = [k for k in want if k not in self.columns]
    if missing:
      raise ValueError(f"task {self.name}: the {split} rows need --config.task.{missing[0]}=COLUMN "
                       f"({', '.join(want)} name the columns of {path}).")
    # A class label trains nli_softmax and scores eval_kind=classes; every other label is a score.
    classes = self.label_names if label and (
        self.eval_kind == "classes" if split != "train" else self.objective == "nli_softmax") else None
    try:
      examples = local.read_examples(path, {k: self.columns[k] for k in want}, classes)
    except KeyError as e:
      raise ValueError(f"task {self.name}: {e.args[0]}") from None  # It names the file, columns and setting.
    if label and classes is None:
      low, high = self.score_range
      for ex in examples:
        if split == "train" and not low <= ex["label"] <= high:
          raise ValueError(f"task {self.name}: row {ex['idx']} of {path} has score {ex['label']}, outside "
                           f"task.score_range={low:g},{high:g}; set --config.task.score_range=LOW,HIGH to the "
                           "scores' range.")
        ex["label"] = (ex["label"] - low) / (high - low)
    self._texts = [tuple(str(ex[k] or "") for k in keys) for ex in examples]
    return self.featurise(examples, keys, label, np.int32 if classes else np.float32)

  def check_training_rows(self, path: str) -> None:
    """What an objective says about its featurised training rows (`self._train`) before training."""

  def featurise(self, examples, keys=None, label=None, label_dtype=np.float32):
    return sentence_pairs.sentence_features(examples, self.tokenizer, self.max_seq_length,
                                            text_keys=keys or self.train_keys(), label_key=label,
                                            label_dtype=label_dtype)

  @property
  def sequences_per_row(self) -> int:
    return self.num_texts

  def buckets(self):
    return streams.buckets(self.max_seq_length) if self.bucketing else None  # evaluation's, packed or not

  def eval_slots(self):
    return None

  def train_spec(self, rows, length):
    """Packed: rows of `length` tokens, S slots each, and per example `text_slots` [B, K] and the label [B]."""
    if self.packed_slots() is None:
      return self.batch_spec(rows, length)
    spec = {k: jax.ShapeDtypeStruct((rows, length), jnp.int32) for k in (*MODEL_INPUTS, *PACKED_INPUTS[:2])}
    spec.update({k: jax.ShapeDtypeStruct((rows, self.packed_slots()), jnp.int32) for k in packing.EXAMPLE_SLOT_KEYS})
    spec["text_slots"] = jax.ShapeDtypeStruct((self.global_batch_size, self.num_texts), jnp.int32)
    spec["label"] = self.batch_spec(self.global_batch_size, length)["label"]
    return spec

  def extra_inputs(self, batch):
    extra = super().extra_inputs(batch)
    return {**extra, "text_slots": batch["text_slots"]} if extra else extra

  def batch_spec(self, batch_size, max_seq_length):
    spec = {k: jax.ShapeDtypeStruct((batch_size, self.num_texts, max_seq_length), jnp.int32) for k in MODEL_INPUTS}
    label_dtype = jnp.int32 if self.objective == "nli_softmax" else jnp.float32
    spec["label"] = jax.ShapeDtypeStruct((batch_size,), label_dtype)
    return spec

  # -- model --

  def model(self, bert_config) -> SentenceEncoder:
    if self.export_length[0] > bert_config.max_length:  # RoBERTa's first position_offset rows serve padding
      raise ValueError(f"the export's max_seq_length {self.export_length[0]} ({self.export_length[1]}) exceeds the "
                       f"model's {validation.position_limit(bert_config)}; set --config.task.export_max_seq_length "
                       "to at most that.")
    return SentenceEncoder(bert_config, pooling=self.encoder.pooling, projection=self.encoder.projection(bert_config),
                           normalize=self.encoder.normalize,
                           num_labels=self.num_labels if self.objective == "nli_softmax" else None)

  def load_init(self, path, bert_config, *, seed, fresh):
    """init_from's BertModel (a sentence-transformers folder's Transformer module) under `bert`; its Dense weights
    when the projection is the same; the rest (a new projection, the classifier) from the seeded `fresh()`."""
    del seed
    from jbert import weights  # pylint: disable=g-import-not-at-top
    runtime = {k: getattr(bert_config, k) for k in weights.OVERRIDABLE}
    source = path
    if st_folder.is_sentence_transformer(path):
      source = st_folder.read_sentence_transformer(path)[1]
    _, bert = weights.load_pretrained(source, BertModel, **runtime)
    params = {**fresh(), "bert": {k: v for k, v in bert.items() if k != "pooler"}}
    projection = self.encoder.projection(bert_config)
    if projection is not None and self.encoder.init_dense is not None:
      if self.encoder.init_dense[0] == projection:
        params["dense"] = st_folder.read_dense(*self.encoder.init_dense)
      else:
        log.info("task %s: a new Dense projection %s (init_from's is %s).", self.name, projection,
                 self.encoder.init_dense[0])
    return params

  def export(self, bert_config, params, out_dir, tokenizer) -> None:
    """A sentence-transformers folder: the BertModel (config.json, model.safetensors, tokenizer) at the root and
    its Pooling, Dense and Normalize modules; the SoftmaxLoss classifier stays behind."""
    from jbert import weights  # pylint: disable=g-import-not-at-top
    bert = {**params["bert"], "pooler": self._pooler(bert_config)}
    weights.save_pretrained(bert_config, bert, out_dir, BertModel, tokenizer=tokenizer, task=self.kind)
    length, source = self.export_length
    st_folder.write_modules(out_dir, embedding_dimension=bert_config.hidden_size, pooling=self.encoder.pooling,
                            normalize=self.encoder.normalize, max_length=length,
                            projection=self.encoder.projection(bert_config), dense_params=params.get("dense"))
    log.info("task %s: the export's max_seq_length is %d (%s).", self.name, length, source)

  def _pooler(self, bert_config):
    """BERT's pooler, which no sentence-transformers module reads but a BertModel folder holds: init_from's,
    untouched by training as in sentence-transformers, else freshly initialised as transformers would."""
    from jbert import weights  # pylint: disable=g-import-not-at-top
    runtime = {k: getattr(bert_config, k) for k in weights.OVERRIDABLE}
    source = self.init_from
    if source and st_folder.is_sentence_transformer(source):
      source = st_folder.read_sentence_transformer(source)[1]
    if source:
      return weights.load_pretrained(source, BertModel, **runtime)[1]["pooler"]
    h, rng = bert_config.hidden_size, np.random.default_rng(self.seed)
    return {"kernel": rng.normal(0.0, bert_config.initializer_range, (h, h)).astype(np.float32),
            "bias": np.zeros((h,), np.float32)}

  # -- losses --

  def loss(self, outputs, batch):
    """The objective's loss (and accuracy, where it has one) per row."""
    rows = rows_of(batch)
    loss, correct = self.row_losses(outputs, batch)
    entries = {"loss": Weighted(loss, rows)}
    if correct is not None:
      entries["accuracy"] = Weighted(correct, rows)
    return entries

  @abc.abstractmethod
  def row_losses(self, outputs, batch) -> tuple[jax.Array, jax.Array | None]:
    """(Σ_rows loss, Σ_rows correct or None) of the objective."""

  # -- evaluation --

  def predictions(self, outputs, batch):
    out = {"embeddings": outputs.embeddings}  # [B, K, D]
    if outputs.logits is not None:
      out["logits"] = outputs.logits  # [B, C]
    return out

  def records(self, eval_set, predictions) -> list[dict]:
    """{"cosine": cos(text_a, text_b)} per row."""
    e = np.asarray(predictions["embeddings"])
    return [{"cosine": float(x)} for x in np.sum(metrics.unit(e[:, 0]) * metrics.unit(e[:, 1]), -1)]

  def evaluate(self, eval_set, predictions):
    e = np.asarray(predictions["embeddings"])  # [N, K, D]
    if self.eval_kind == "scored":
      return metrics.similarity_metrics(e[:, 0], e[:, 1], eval_set.features["label"])
    if self.eval_kind == "classes":
      if "logits" not in predictions:
        raise ValueError(f"task.eval_kind=classes needs the nli_softmax classifier; task {self.name} has none.")
      return {"accuracy": float(np.mean(np.argmax(predictions["logits"], -1) == eval_set.features["label"]))}
    if self.eval_kind == "triplet":
      return {"accuracy": metrics.triplet_accuracy(e[:, 0], e[:, 1], e[:, 2])}
    corpus: dict[str, int] = {}  # distinct document text -> corpus row
    rows = []
    for i, texts in enumerate(eval_set.examples):
      for j, text in enumerate(texts[1:], 1):
        if text not in corpus:
          corpus[text] = len(rows)
          rows.append(e[i, j])
    relevant = [[corpus[texts[1]]] for texts in eval_set.examples]
    return metrics.retrieval_metrics(e[:, 0], np.stack(rows), relevant)


@register
class StsCosine(SentenceEmbedding):
  objective = "sts_cosine"
  kinds = (objective,)

  def row_losses(self, outputs, batch):
    return losses.cosine_mse(outputs.embeddings, batch["label"]), None


@register
class NliSoftmax(SentenceEmbedding):
  objective = "nli_softmax"
  kinds = (objective,)

  def __init__(self, **kwargs):
    if not kwargs.get("label_names") or len(kwargs["label_names"]) < 2:
      raise ValueError("task nli_softmax needs at least two classes: --config.task.label_names=A,B[,C] (in id "
                       "order).")
    super().__init__(**kwargs)

  def row_losses(self, outputs, batch):
    labels = batch["label"]
    return mean_cross_entropy_sums(outputs.logits, labels, jnp.ones(labels.shape, jnp.float32))


@register
class MultipleNegativesRanking(SentenceEmbedding):
  objective = "mnrl"
  kinds = (objective,)

  @classmethod
  def from_config(cls, config, tokenizer=None) -> "MultipleNegativesRanking":
    cls.check_batch(config.batch_size, config.optim.grad_accum_steps, bool(config.task.get("text_c")))
    return super().from_config(config, tokenizer)

  @classmethod
  def check_batch(cls, batch_size: int, grad_accum_steps: int, hard_negatives: bool) -> None:
    """Refuses micro-batches of one (anchor, positive) row: the anchor's only candidate is its positive, so the
    loss is 0 (accuracy 1) with zero gradients, and the run would export the model it started from."""
    rows = batch_size // max(grad_accum_steps, 1)
    if rows >= 2 or hard_negatives:
      return
    what = f"batch_size={batch_size}" + (
        f" with optim.grad_accum_steps={grad_accum_steps} ({rows} row per micro-batch)" if grad_accum_steps > 1
        else "")
    raise ValueError(f"task {cls.objective}: {what} gives each anchor no in-batch negatives (its only candidate is "
                     f"its own positive), so the loss is 0 and nothing is learnt; use --config.batch_size="
                     f"{2 * max(grad_accum_steps, 1)} or more (larger batches give more negatives), or give hard "
                     "negatives with --config.task.text_c=COLUMN.")

  def check_training_rows(self, path: str) -> None:
    """One warning when rows share a document (a positive or hard negative, the same tokens): two of them in one
    batch rank each other's copy of their own positive as a negative. sentence-transformers' loss does the same;
    its NO_DUPLICATES batch sampler avoids it, and deduplicating the file does here."""
    docs = self._train["input_ids"][:, 1:]  # [N, K-1, T]
    owners: dict[bytes, set[int]] = {}
    for row, texts in enumerate(docs):
      for ids in texts:
        owners.setdefault(ids.tobytes(), set()).add(row)
    shared = [rows for rows in owners.values() if len(rows) > 1]
    if shared:
      log.warning("task %s: %d of the %d training rows of %s share a positive or negative text with another row (%d "
                  "distinct texts); when such rows meet in a batch, each ranks the other's copy of its own positive "
                  "as a negative, as sentence-transformers' MultipleNegativesRankingLoss does. Deduplicate them for "
                  "clean in-batch negatives.", self.name, len(set().union(*shared)), len(docs), path, len(shared))

  def row_losses(self, outputs, batch):
    return losses.mnrl(outputs.embeddings, scale=float(self.loss_settings.get("scale", 20.0)),
                       symmetric=bool(self.loss_settings.get("symmetric", False)))


@register
class Triplet(SentenceEmbedding):
  objective = "triplet"
  kinds = (objective,)

  def row_losses(self, outputs, batch):
    return losses.triplet(outputs.embeddings, margin=float(self.loss_settings.get("margin", 5.0)))

