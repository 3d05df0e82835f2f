"""Defaults of the pretraining input pipeline (`config.data`); every key is documented where it is set.

Training configs take this section whole and override a few keys:

  config.data = jbert.data.config.default_pretrain_config()
  config.data.source = "tfds"
"""
import ml_collections


def _optional(field_type):
  """A None default that `--config.data.KEY=VALUE` can still override with a value of `field_type`."""
  return ml_collections.FieldReference(None, field_type=field_type)


def default_pretrain_config() -> ml_collections.ConfigDict:
  """The pipeline's defaults: BERT's phase-1 recipe on the generated offline corpus."""
  config = ml_collections.ConfigDict({
      # -- where documents come from --
      "source": "synthetic",                  # prepared | tfds | files | text | synthetic (generated offline)
      "prepared": _optional(str),             # DIR (local or gs://) of `python -m jbert.data prepare`: sentence-
                                              # split documents in ArrayRecord shards, its held-out split and
                                              # (optionally) its vocabulary
      "tfds_name": "wikipedia/20230601.en",   # any TFDS dataset with a text feature, read by random access
      "tfds_split": "train",                  # TFDS split (slicing such as "train[:90%]" allowed)
      "tfds_eval_split": _optional(str),      # None: hold out the last `eval_documents` of tfds_split
      "tfds_text_key": "text",                # feature holding a document's text
      "tfds_data_dir": _optional(str),        # None: TFDS's default (~/tensorflow_datasets or $TFDS_DATA_DIR)
      "files": _optional(str),                # comma-separated globs (local, gs://, any fsspec URL; .gz/.zst
                                              # read too), BERT format: a sentence per line, a blank line
                                              # between documents; indexed whole at start-up (pods: prepared)
      "text_files": _optional(str),           # comma-separated globs of plain text (paths as for `files`):
                                              # documents separated by blank lines, split by `sentencex`
      "eval_files": _optional(str),           # globs in the format of `files`/`text_files`; None: hold out
      "eval_documents": 2000,                 # held-out documents when no eval split is given (at most a
                                              # tenth of the corpus); they never appear in training (prepared
                                              # corpora fix theirs when prepared)
      "language": "en",                       # sentencex language code for text_files and tfds
      "synthetic_dir": _optional(str),        # generated corpus + vocab; None: ~/.cache/jbert/synthetic-v1
      "vocab": _optional(str),                # vocab.txt (WordPiece) or *.model (SentencePiece); None:
                                              # init_from's, else the prepared corpus's own, else (synthetic)
                                              # the generated one
      # -- instances, as google-research/bert create_pretraining_data.py --
      "max_seq_length": 128,                  # tokens per sequence, [CLS] and [SEP]s included
      "short_seq_prob": 0.1,                  # chance a document's target length is drawn from [2, max]
      "nsp": True,                            # next-sentence prediction; False: MLM only, whole sentences
                                              # packed to length, next_sentence_labels all 0
      "max_line_chars": 20_000,               # longer lines/paragraphs are cut (counted), never a crash
      # -- dynamic masking, redrawn every epoch --
      "max_predictions_per_seq": 20,          # cap on masked positions; the padded length of the mlm arrays.
                                              # Unless set, ceil(masked_lm_prob * max_seq_length): 20 at 128,
                                              # 39 at MosaicBERT's 0.3 (a cap below the rate is refused)
      "masked_lm_prob": 0.15,                 # fraction of non-special tokens selected for prediction
      "mask_token_prob": 0.8,                 # of the selected: replaced by [MASK]
      "random_token_prob": 0.1,               # of the selected: replaced by a random non-special token;
                                              # the rest (0.1) keep their token
      "whole_word_masking": False,            # select whole words (a piece and its ## continuations)
      # -- order, sharding, throughput --
      "docs_per_group": 256,                  # documents tokenised together; NSP's random next segment and
                                              # the instance shuffle draw from the same group
      "num_shards": 0,                        # data shards (0: one per process); fix it to keep the global
                                              # batches, and exact resume, across process counts
      "worker_count": 0,                      # grain worker processes per shard iterator (0: in-process)
      "worker_buffer_size": 2,                # batches each worker prepares ahead
      "prefetch_groups": 2,                   # document groups prepared ahead by a background thread
  })
  # A reference, so `--config.data.masked_lm_prob=0.3` or a longer sequence moves the cap with it.
  config.max_predictions_per_seq = (-(-(config.get_ref("masked_lm_prob") * config.get_ref("max_seq_length")) // 1)
                                    ).to_int()
  return config
