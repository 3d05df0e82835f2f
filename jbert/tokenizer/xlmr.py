"""XLM-RoBERTa's (and CamemBERT's) SentencePiece tokenizer: `sentencepiece.bpe.model` with fairseq's ids, or the
`tokenizer.json` transformers converts it to (a Unigram model, loaded as it is).

fairseq numbers the pieces its own way: `<s>`=0 `<pad>`=1 `</s>`=2 `<unk>`=3, then every SentencePiece piece after
its three specials at its SentencePiece id + 1, and `<mask>` last (CamemBERT: `<s>NOTUSED <pad> </s>NOTUSED <unk>
<unk>NOTUSED`, then the pieces from SentencePiece id 1 at id + 4, and `<mask>`). The model is run as transformers
runs it (its conversion: the Unigram pieces and scores, the model's precompiled normalisation, whitespace split,
`▁` before every word), so ids equal `XLMRobertaTokenizer`'s; a pre-split word (NER) gets its own `▁` that way too.
"""
import os

import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers

from jbert import untrusted
from jbert.tokenizer import pipeline
from jbert.tokenizer import registry

WORD_START = "\u2581"  # "▁"
MODEL_FILE = "sentencepiece.bpe.model"  # the name the Hub's XLM-R and CamemBERT folders give the model
# tokenizer_class -> (the ids before the SentencePiece pieces, the first SentencePiece id kept)
LAYOUTS = {"XLMRobertaTokenizer": ((("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)), 3),
           "CamembertTokenizer": ((("<s>NOTUSED", 0.0), ("<pad>", 0.0), ("</s>NOTUSED", 0.0), ("<unk>", 0.0),
                                   ("<unk>NOTUSED", -100.0)), 1)}


def read_model(model_file: str):
  """The ModelProto of a SentencePiece `.model` (from its bytes: a link to a device is refused by name)."""
  from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top  (protobuf's module)
  proto = sentencepiece_model_pb2.ModelProto()
  try:
    proto.ParseFromString(registry.read_bytes(model_file))
  except Exception as e:  # protobuf's DecodeError has no public base class to name
    raise ValueError(f"{model_file} is not a SentencePiece model ({e}); pass the model's own "
                     f"{MODEL_FILE}.") from e
  if not proto.pieces:
    raise ValueError(f"{model_file} holds no pieces: it is not a SentencePiece model; pass the model's own "
                     f"{MODEL_FILE}.")
  return proto


def _class_of(config: dict) -> str:
  name = config.get("tokenizer_class")
  name = name.removesuffix("Fast") if isinstance(name, str) else None
  return name if name in LAYOUTS else "XLMRobertaTokenizer"


def _from_model(model_file: str, config: dict) -> tokenizers.Tokenizer:
  proto = read_model(model_file)
  head, first = LAYOUTS[_class_of(config)]
  types = [p.type for p in proto.pieces[:3]]
  unknown, control = 2, 3  # ModelProto.SentencePiece.Type
  if proto.trainer_spec.model_type != 1 or types != [unknown, control, control]:
    raise ValueError(f"{model_file} is not a SentencePiece model in XLM-R's layout (a unigram model whose first "
                     "three pieces are <unk> <s> </s>, SentencePiece's defaults); train it with `python -m jbert.data "
                     "prepare --vocab_kind=sentencepiece`, or pass the model's tokenizer.json.")
  vocab = [*head, *((p.piece, p.score) for p in proto.pieces[first:]), ("<mask>", 0.0)]
  tok = tokenizers.Tokenizer(models.Unigram(vocab, unk_id=3, byte_fallback=False))
  if proto.normalizer_spec.precompiled_charsmap:
    tok.normalizer = normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap)
  scheme = "always" if config.get("add_prefix_space", True) else "never"
  tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                               pre_tokenizers.Metaspace(replacement=WORD_START, prepend_scheme=scheme)])
  tok.decoder = decoders.Metaspace(replacement=WORD_START, prepend_scheme=scheme)
  camembert = _class_of(config) == "CamembertTokenizer"  # its class strips the space before <mask>
  tok.add_special_tokens(pipeline.added_tokens(config, mask_lstrip=camembert,
                                               extra=tuple(p for p, _ in head if p.endswith("NOTUSED"))))
  return tok


class XLMRobertaTokenizer(pipeline.PipelineTokenizer):
  """XLM-R's SentencePiece from `sentencepiece.bpe.model` (fairseq's ids) or a Unigram `tokenizer.json`.

  Args:
    file: the .model or tokenizer.json.
    config: the folder's tokenizer_config.json (tokenizer_class: XLM-R's or CamemBERT's ids, special tokens),
      maybe empty.
    do_lower_case: None, or what the caller expects; a model that disagrees is an error (SentencePiece fixes its
      normalisation at training).
  """

  def __init__(self, file: str, config: dict | None = None, do_lower_case: bool | None = None):
    config = config or {}
    file = os.fspath(file)
    self.model_file = file if file.endswith(".model") else None
    if self.model_file:
      tok = _from_model(file, config)
    else:
      tok = pipeline.read_pipeline(file)
    super().__init__(file, tok, config, WORD_START)
    self.tokenizer_class = _class_of(config)
    if do_lower_case is not None and bool(do_lower_case) != self.do_lower_case:
      raise ValueError(f"do_lower_case={do_lower_case} but the SentencePiece model {file} "
                       f"{'does' if self.do_lower_case else 'does not'} lower-case: its normalisation is fixed at "
                       "training. Pass do_lower_case=None.")

  def save(self, out_dir) -> list[str]:
    """tokenizer.json and the configs, and the sentencepiece.bpe.model it came from (fairseq and older
    transformers read that one)."""
    extra = {MODEL_FILE: untrusted.read_bytes(self.model_file)} if self.model_file else {}
    return self.write_folder(out_dir, self.tokenizer_class, {"add_prefix_space": True}, extra)


def _claims(file, config: dict) -> bool:
  name = file.name
  if name.endswith(".model"):
    if name == MODEL_FILE or registry.for_class(config.get("tokenizer_class")) is KIND:
      return True
    try:  # jbert's own SentencePiece models hold BERT's [CLS]; any other is read in fairseq's layout
      return "[CLS]" not in {p.piece for p in read_model(file).pieces}
    except (ValueError, OSError):
      return False
  return name.endswith(".json") and name != "tokenizer_config.json" and registry.json_model_type(file) == "Unigram"


# SentencePiece's EM splits the sentences among its threads and adds their sums in thread order: a fixed count
# gives the same model on any machine (a count taken from the CPU would not).
TRAIN_THREADS = 4


def train_vocab(texts, vocab_size: int, lowercase: bool, seed: int = 0) -> registry.Trained:
  """An XLM-R sentencepiece.bpe.model giving `vocab_size` ids with fairseq's numbering (the SentencePiece pieces
  plus `<pad>` and `<mask>`): a unigram model in SentencePiece's default layout (`<unk> <s> </s>`), NFKC
  (case-folded with `lowercase`), 99.95% character coverage, as fairseq trains XLM-R's. Seeded, with a fixed
  thread count, so the same texts give the same bytes."""
  import io  # pylint: disable=g-import-not-at-top
  import sentencepiece  # pylint: disable=g-import-not-at-top
  if vocab_size <= 8:
    raise ValueError(f"--train_vocab={vocab_size} leaves no room beside XLM-R's 5 special tokens; XLM-R's is 250002.")
  sentencepiece.set_random_generator_seed(seed)
  model = io.BytesIO()
  try:
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=(t for t in texts if t.strip()), model_writer=model, vocab_size=vocab_size - 2,
        model_type="unigram", character_coverage=0.9995, hard_vocab_limit=False, num_threads=TRAIN_THREADS,
        input_sentence_size=0, shuffle_input_sentence=False,
        normalization_rule_name="nmt_nfkc_cf" if lowercase else "nmt_nfkc", minloglevel=2)
  except RuntimeError as e:  # SentencePiece's own words, e.g. too little text for its seed pieces
    raise ValueError(f"SentencePiece could not train on the sampled text ({str(e).strip()}); prepare more text, "
                     "or copy a vocabulary in with --vocab=PATH.") from e
  data = model.getvalue()
  from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top
  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString(data)
  words = sum(len(p.piece.lstrip(WORD_START)) > 1 for p in proto.pieces[3:])
  return registry.Trained(data, len(proto.pieces) + 2, words)


KIND = registry.register(registry.Kind(
    name="sentencepiece", classes=tuple(LAYOUTS), files=("tokenizer.json", MODEL_FILE, "*.model"), claims=_claims,
    load=lambda file, config, do_lower_case: XLMRobertaTokenizer(file, config, do_lower_case),
    train=train_vocab, trained_file=MODEL_FILE))
