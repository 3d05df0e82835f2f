"""Byte-level BPE, RoBERTa's tokenizer: `vocab.json` + `merges.txt` (built as transformers' `RobertaTokenizer`
builds it) or a `tokenizer.json` with a BPE model (loaded as it is, so its own added tokens and options hold).

A tokenizer.json whose post-processor is a template (ModernBERT's `[CLS] A [SEP] B [SEP]`, read by transformers'
`PreTrainedTokenizerFast`) keeps its layout: as many separators between a pair's texts as the template has, and
it is saved as such a folder again; RoBERTa's (RobertaProcessing) is `<s> A </s></s> B </s>`.

`<mask>` takes the space before it (lstrip) where tokenizer_config.json's added_tokens_decoder or the tokenizer.json
says so (the Hub's roberta-base does); built from vocab.json + merges.txt alone it does not, as in transformers 5.
Words of a pre-split text (NER) are tokenized as inside running text, with the space before them (`Ġword`): what
transformers does with `is_split_into_words=True` and `add_prefix_space=True`, which it requires for RoBERTa.
QA offsets leave the space out (`trim_offsets`), so answer spans start at the word.
"""
import json
import os
import pathlib
import tempfile

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, processors

from jbert import errors, untrusted
from jbert.tokenizer import pipeline
from jbert.tokenizer import registry

BYTE_WORD_START = "\u0120"  # "Ġ": byte-level BPE's mark of a piece that starts with a space


def _with_prefix_space(tok: tokenizers.Tokenizer) -> tokenizers.Tokenizer:
  """A copy of `tok` whose ByteLevel steps add a space before each word (for words of a pre-split text)."""
  data = json.loads(tok.to_str())

  def visit(node):
    if isinstance(node, dict):
      if node.get("type") in ("ByteLevel", "RobertaProcessing") and "add_prefix_space" in node:
        node["add_prefix_space"] = True
      for value in node.values():
        visit(value)
    elif isinstance(node, list):
      for value in node:
        visit(value)

  visit(data)
  return tokenizers.Tokenizer.from_str(json.dumps(data))


def _from_vocab(vocab_file: str, config: dict) -> tokenizers.Tokenizer:
  merges_file = os.path.join(os.path.dirname(vocab_file), "merges.txt")
  vocab = untrusted.read_json(vocab_file)
  if not isinstance(vocab, dict) or not all(isinstance(i, int) for i in vocab.values()):
    raise ValueError(f"{vocab_file} is not a BPE vocabulary (a JSON object of piece -> id); pass RoBERTa's "
                     "vocab.json with its merges.txt.")
  lines = untrusted.read_text(merges_file).split("\n")
  merges = [tuple(line.split(" ")) for line in lines if line and not line.startswith("#version")]
  bad = next((" ".join(m) for m in merges if len(m) != 2), None)
  if bad is not None:
    raise ValueError(f"{merges_file}: the merge {bad!r} is not two pieces separated by one space; pass the "
                     "merges.txt written with this vocab.json.")
  tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, continuing_subword_prefix="",
                                        end_of_word_suffix="", fuse_unk=False))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=bool(config.get("add_prefix_space", False)))
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens(pipeline.added_tokens(config))
  return tok


def _roberta_processing(tok: tokenizers.Tokenizer, config: dict) -> processors.PostProcessor:
  """RobertaProcessing, which transformers' RobertaTokenizer puts on every pipeline it loads: besides adding
  `<s>`/`</s>` it trims the space off the offsets of `Ġword` pieces (trim_offsets), with or without special tokens."""
  cls, sep = (registry.special_token(config, *pipeline.ROLES[role]) for role in ("cls", "sep"))
  return processors.RobertaProcessing((sep, tok.token_to_id(sep) or 0), (cls, tok.token_to_id(cls) or 0),
                                      trim_offsets=bool(config.get("trim_offsets", True)),
                                      add_prefix_space=bool(config.get("add_prefix_space", False)))


def _template(tok: tokenizers.Tokenizer) -> tuple[processors.PostProcessor, int] | None:
  """(the tokenizer.json's TemplateProcessing, how many special tokens its pair template puts between the two
  texts), or None when it has no such template."""
  post = json.loads(tok.to_str()).get("post_processor") or {}
  if post.get("type") != "TemplateProcessing":
    return None
  pair = post.get("pair") or []
  kinds = [("B" if "Sequence" in item and item["Sequence"].get("id") == "B" else
            "A" if "Sequence" in item else "special") for item in pair]
  if kinds.count("A") != 1 or kinds.count("B") != 1 or kinds.index("A") > kinds.index("B"):
    raise ValueError(f"the tokenizer.json's pair template {errors.preview(post.get('pair'))} does not lay out A then "
                     "B; pass the model's own tokenizer files.")
  return tok.post_processor, kinds.index("B") - kinds.index("A") - 1


class ByteLevelBPETokenizer(pipeline.PipelineTokenizer):
  """RoBERTa's byte-level BPE from `vocab.json` (with `merges.txt` beside it) or a BPE `tokenizer.json`.

  Args:
    file: the vocab.json or tokenizer.json.
    config: the folder's tokenizer_config.json (special tokens, add_prefix_space, trim_offsets), maybe empty.
    do_lower_case: None, or what the caller expects; a tokenizer that disagrees is an error (byte-level BPE
      keeps case unless its own normaliser lower-cases).
  """

  def __init__(self, file: str, config: dict | None = None, do_lower_case: bool | None = None):
    config = config or {}
    file = os.fspath(file)
    if file.endswith(".json") and os.path.basename(file) != "vocab.json":
      tok = pipeline.read_pipeline(file)
      if json.loads(tok.to_str())["model"].get("type") != "BPE":
        raise ValueError(f"{file} holds no BPE model; pass RoBERTa's tokenizer.json or its vocab.json.")
    else:
      tok = _from_vocab(file, config)
    self._template = _template(tok)
    if self._template is None:
      # Its post-processor only trims offsets here (no call adds special tokens). A template trims none, so a
      # template tokenizer's offsets keep a piece's space as transformers gives them (ModernBERT's).
      tok.post_processor = _roberta_processing(tok, config)
    super().__init__(file, tok, config, BYTE_WORD_START, word_tok=_with_prefix_space(tok))
    if do_lower_case is not None and bool(do_lower_case) != self.do_lower_case:
      raise ValueError(f"do_lower_case={do_lower_case} but the byte-level BPE tokenizer {file} "
                       f"{'does' if self.do_lower_case else 'does not'} lower-case, which its files fix; pass "
                       "do_lower_case=None.")

  @property
  def pair_separator_ids(self) -> tuple[int, ...]:
    if self._template is None:
      return super().pair_separator_ids
    return (self.sep_id,) * self._template[1]

  def post_processor(self) -> processors.PostProcessor:
    return _roberta_processing(self._tok, self.config) if self._template is None else self._template[0]

  def save(self, out_dir) -> list[str]:
    """tokenizer.json, vocab.json, merges.txt and the configs: what RobertaTokenizer's save_pretrained writes; a
    template tokenizer's tokenizer.json and configs, as PreTrainedTokenizerFast (ModernBERT's) writes them."""
    if self._template is not None:
      return self.write_folder(out_dir, "PreTrainedTokenizerFast", {}, {})
    with tempfile.TemporaryDirectory() as tmp:
      written = self._tok.model.save(tmp)
      extra = {os.path.basename(f): pathlib.Path(f).read_bytes() for f in written}  # vocab.json, merges.txt
    options = {"add_prefix_space": False, "trim_offsets": True}
    options.update({k: self.config[k] for k in options if isinstance(self.config.get(k), bool)})
    return self.write_folder(out_dir, "RobertaTokenizer", options, extra)


def _claims(file, config: dict) -> bool:
  name = file.name
  if name == "vocab.json":
    return (file.parent / "merges.txt").exists()
  return name.endswith(".json") and name != "tokenizer_config.json" and registry.json_model_type(file) == "BPE"


SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")  # ids 0-4, as RoBERTa's


def train_vocab(texts, vocab_size: int, lowercase: bool, seed: int = 0) -> registry.Trained:
  """A RoBERTa tokenizer.json of `vocab_size` ids trained on `texts`: RoBERTa's special tokens at 0-4, the 256
  bytes, then merges of pairs seen at least twice (case-folded first with `lowercase`). The trainer breaks ties by
  the pieces, so the same texts give the same bytes; `seed` is unused (nothing is sampled)."""
  del seed
  from tokenizers import normalizers, trainers  # pylint: disable=g-import-not-at-top
  alphabet = pre_tokenizers.ByteLevel.alphabet()
  if vocab_size <= len(SPECIAL_TOKENS) + len(alphabet):
    raise ValueError(f"--train_vocab={vocab_size} leaves no room for merges beside byte-level BPE's "
                     f"{len(alphabet)} bytes and {len(SPECIAL_TOKENS)} special tokens; RoBERTa's is 50265.")
  tok = tokenizers.Tokenizer(models.BPE())
  if lowercase:
    tok.normalizer = normalizers.Lowercase()
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=list(SPECIAL_TOKENS),
                                initial_alphabet=alphabet, show_progress=False)
  tok.train_from_iterator(texts, trainer=trainer)
  tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
  merges = json.loads(tok.to_str())["model"]["merges"]
  return registry.Trained(tok.to_str().encode("utf-8"), tok.get_vocab_size(), len(merges))


KIND = registry.register(registry.Kind(
    name="bpe", classes=("RobertaTokenizer", "LongformerTokenizer", "BartTokenizer"),
    files=("tokenizer.json", "vocab.json"), claims=_claims,
    load=lambda file, config, do_lower_case: ByteLevelBPETokenizer(file, config, do_lower_case),
    companions={"vocab.json": ("merges.txt",)}, train=train_vocab, trained_file="tokenizer.json"))
