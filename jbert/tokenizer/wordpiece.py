"""BERT's WordPiece tokenizer on Hugging Face `tokenizers`, matching google-research/bert `tokenization.py`.

The Rust pipeline (BertNormalizer, BertPreTokenizer, WordPiece) reproduces BERT's BasicTokenizer and
WordpieceTokenizer: text cleaning and control-character removal, CJK split, punctuation split, lower-casing
and accent stripping for uncased vocabularies, words over 100 characters -> [UNK], greedy longest-match-first.
Two places where the Rust code departs from the Python original are patched here:

* Python's `str.lower()` turns a word-final capital sigma into `ς`; Rust lower-cases character by character to
  `σ`. A `Replace` normalizer applies Unicode's Final_Sigma rule first (uncased vocabularies only).
* Rust's CJK ranges begin extension E at U+2B920 where BERT's begin at U+2B820; a `Split` pre-tokenizer
  isolates U+2B820..U+2B91F as BERT does.

As in transformers (not the original BERT), the special tokens `[PAD] [UNK] [CLS] [SEP] [MASK]` written
verbatim in the text are kept as one token each, and are not lower-cased or split.
"""
import json
import os
from collections.abc import Iterable, Sequence

from etils import epath
import numpy as np
import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers

from jbert import errors, untrusted
from jbert.tokenizer import backed, base
from jbert.tokenizer import registry

# Characters Python's lower() skips around a sigma (Case_Ignorable) plus those BERT's text cleaning deletes
# before lower-casing (category C except tab, newline and carriage return, which become spaces).
_SIGMA_SKIP = r"[\p{Case_Ignorable}\p{C}&&[^\t\n\r]]"
_FINAL_SIGMA = rf"[\p{{Cased}}&&\P{{Case_Ignorable}}]{_SIGMA_SKIP}*+\KΣ(?!{_SIGMA_SKIP}*+\p{{Cased}})"
_CJK_MISSING_IN_RUST = "[\U0002B820-\U0002B91F]"


def read_vocab(vocab_file: str) -> list[str]:
  """Pieces of a BERT `vocab.txt`, one per line, the line number being the id."""
  lines = untrusted.read_text(vocab_file).split("\n")  # A regular file, read up to its size.
  if lines and not lines[-1]:
    lines.pop()
  return [line.removesuffix("\r") for line in lines]


def check_unique(pieces: Sequence[str], vocab_file: str) -> None:
  """A ValueError naming the repeated pieces: BERT's load_vocab keeps a repeat's last line, so the ids of its
  earlier lines are never produced and a model trained on the file wastes their rows silently."""
  lines: dict[str, list[int]] = {}
  for number, piece in enumerate(pieces, 1):
    lines.setdefault(piece, []).append(number)
  repeated = [(piece, numbers) for piece, numbers in lines.items() if len(numbers) > 1]
  if repeated:
    shown = ", ".join(f"{piece!r} (lines {', '.join(map(str, numbers))})" for piece, numbers in repeated[:5])
    more = f" and {len(repeated) - 5} more" if len(repeated) > 5 else ""
    raise ValueError(f"vocabulary {vocab_file} repeats {len(repeated)} token(s): {shown}{more}; each token must be "
                     "on one line only: remove the repeats (a token's id is its line number, from 0).")


def read_tokenizer_json(path: str) -> tuple[list[str], bool | None]:
  """Pieces (by id) and lower-casing (None: not stated) of a Hugging Face `tokenizer.json` with a WordPiece
  model, such as transformers' `BertTokenizerFast` writes."""
  data = untrusted.read_json(path)
  model = (data.get("model") if isinstance(data, dict) else None) or {}
  if model.get("type") != "WordPiece":
    raise ValueError(f"{path} holds a {errors.preview(model.get('type'))} model, not WordPiece; pass a vocab.txt or a "
                     "SentencePiece .model.")
  by_id = {int(i): piece for piece, i in model["vocab"].items()}
  by_id.update({int(t["id"]): t["content"] for t in data.get("added_tokens") or [] if int(t["id"]) not in by_id})
  # A vocab.txt that repeats a piece leaves the earlier id out of the json's map (the last line wins, as in
  # BERT): no text ever maps to it, so a unique stand-in name keeps the ids dense and the embedding rows aligned.
  pieces = [by_id.get(i, f"[unreachable{i}]") for i in range(max(by_id, default=-1) + 1)]
  normalizers_ = [data.get("normalizer") or {}]
  normalizers_ += normalizers_[0].get("normalizers") or []  # a Sequence's members
  bert = [n for n in normalizers_ if n.get("type") == "BertNormalizer"]
  lowercase = bool(bert[0].get("lowercase")) if bert else None
  if any(n.get("type") == "Lowercase" for n in normalizers_):  # Some converters spell it as its own step.
    lowercase = True
  strip = bert[0].get("strip_accents") if bert else None
  if strip is not None and lowercase is not None and bool(strip) != lowercase:
    raise ValueError(f"{path}: strip_accents={strip} with lowercase={lowercase} is not BERT's normalisation, "
                     "which strips accents exactly when it lower-cases.")
  return pieces, lowercase


def is_uncased(pieces: Sequence[str]) -> bool:
  """True when no piece but bracketed ones such as `[CLS]` or `[unused0]` has an upper-case letter."""
  return not any(p != p.lower() for p in pieces if not (p.startswith("[") and p.endswith("]")))


class WordPieceTokenizer(backed.TokenizersBacked):
  """BERT WordPiece over a `vocab.txt`.

  Args:
    vocab_file: path of a BERT `vocab.txt` holding `[PAD] [UNK] [CLS] [SEP] [MASK]`, or of a Hugging Face
      `tokenizer.json` with a WordPiece model.
    do_lower_case: lower-case and strip accents (uncased BERT). None takes it from the tokenizer.json, else
      detects it from the vocabulary: a vocabulary without upper-case pieces is uncased.
    max_input_chars_per_word: longer words become `[UNK]`, as in BERT.
  """

  tokenizer_class = "BertTokenizer"  # what `save` writes: DistilBERT's and ELECTRA's folders keep their own

  def __init__(self, vocab_file: str, do_lower_case: bool | None = None, max_input_chars_per_word: int = 100):
    self.vocab_file = os.fspath(vocab_file)
    if self.vocab_file.endswith(".json"):
      self._pieces, stated_lower_case = read_tokenizer_json(self.vocab_file)
      do_lower_case = stated_lower_case if do_lower_case is None else do_lower_case
    else:
      self._pieces = read_vocab(self.vocab_file)
    # Where a piece repeats, the last line wins, as in BERT's load_vocab (published models load; training refuses
    # such a file through `check_unique`).
    self._vocab = {piece: i for i, piece in enumerate(self._pieces)}
    missing = [t for t in base.SPECIAL_TOKENS if t not in self._vocab]
    if missing:
      raise ValueError(f"Vocabulary {self.vocab_file} lacks the special tokens {missing}; BERT needs all of "
                       f"{list(base.SPECIAL_TOKENS)}. Add them as lines of the file.")
    self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
        self._vocab[t] for t in base.SPECIAL_TOKENS)
    self.do_lower_case = is_uncased(self._pieces) if do_lower_case is None else bool(do_lower_case)

    self.continuation_mask = np.array([p.startswith("##") for p in self._pieces], dtype=bool)
    self.special_mask = np.zeros(len(self._pieces), dtype=bool)
    self.special_mask[list(self.special_ids)] = True

    tok = tokenizers.Tokenizer(models.WordPiece(
        self._vocab, unk_token="[UNK]", max_input_chars_per_word=max_input_chars_per_word))
    bert_normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=self.do_lower_case,
        lowercase=self.do_lower_case)
    if self.do_lower_case:
      tok.normalizer = normalizers.Sequence(
          [normalizers.Replace(tokenizers.Regex(_FINAL_SIGMA), "ς"), bert_normalizer])
    else:
      tok.normalizer = bert_normalizer
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.BertPreTokenizer(),
        pre_tokenizers.Split(tokenizers.Regex(_CJK_MISSING_IN_RUST), behavior="isolated"),
    ])
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.add_special_tokens(
        [tokenizers.AddedToken(t, special=True, normalized=False) for t in base.SPECIAL_TOKENS])
    self._tok = tok

  def check_unique(self) -> None:
    """Raises a ValueError naming the pieces the vocabulary repeats (for training, which would waste their ids)."""
    check_unique(self._pieces, self.vocab_file)

  def __repr__(self):
    return (f"WordPieceTokenizer({self.vocab_file!r}, do_lower_case={self.do_lower_case}, "
            f"vocab_size={self.vocab_size})")

  def save(self, out_dir: str | os.PathLike) -> list[str]:
    """`vocab.txt`, `tokenizer_config.json` and `special_tokens_map.json` in `out_dir` (local or gs://): the
    files transformers' `AutoTokenizer.from_pretrained(out_dir)` reads as a `BertTokenizer` with the same ids."""
    out = epath.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    specials = dict(zip(("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"), base.SPECIAL_TOKENS))
    # strip_accents None follows do_lower_case, as in BERT; model_max_length where the folder read stated it.
    config = dict(tokenizer_class=self.tokenizer_class, do_lower_case=self.do_lower_case, strip_accents=None,
                  tokenize_chinese_chars=True, **specials)
    if self.model_max_length is not None:
      config["model_max_length"] = self.model_max_length
    files = {"vocab.txt": "".join(p + "\n" for p in self._pieces),
             "tokenizer_config.json": json.dumps(config, indent=2) + "\n",
             "special_tokens_map.json": json.dumps(specials, indent=2) + "\n"}
    for name, text in files.items():
      (out / name).write_text(text, encoding="utf-8")
    return [os.fspath(out / name) for name in files]

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    if skip_special_tokens:
      ids = [i for i in ids if not self.special_mask[i]]
    return " ".join(self.convert_ids_to_tokens(ids)).replace(" ##", "").strip()


def _claims(file, config: dict) -> bool:
  if file.suffix == ".txt":
    return True
  return file.name.endswith(".json") and file.name != "tokenizer_config.json" and (
      registry.json_model_type(file) == "WordPiece")


def _load(file: str, config: dict, do_lower_case: bool | None) -> WordPieceTokenizer:
  stated = config.get("do_lower_case")  # transformers lets tokenizer_config.json override the json's normaliser
  if do_lower_case is None and isinstance(stated, bool):
    do_lower_case = stated
  tok = WordPieceTokenizer(file, do_lower_case=do_lower_case)
  tok.model_max_length = registry.model_max_length(config)
  stated_class = registry.for_class(config.get("tokenizer_class")) is KIND and config["tokenizer_class"]
  tok.tokenizer_class = stated_class.removesuffix("Fast") if stated_class else tok.tokenizer_class
  return tok


_WORD_START = "\u2581"


def train_vocab(texts: Iterable[str], vocab_size: int, lowercase: bool, seed: int = 0) -> registry.Trained:
  """A WordPiece vocab.txt of `vocab_size` pieces trained on `texts`, BERT's special tokens first; the same texts
  give the same bytes.

  WordPiece's pieces are learnt as BPE merges over BERT's words (its normaliser and pre-tokeniser) that are seen at
  least twice, each word marked where it starts (`▁`); a piece that starts a word becomes itself, one inside a word
  `##piece`, and every character is kept both ways so that no word of them reads as [UNK]. (tokenizers' own
  WordPieceTrainer numbers its `##` alphabet in hash order, which changes from process to process, and with it which
  merge wins a tie: the same corpus gave other vocabularies. Its BpeTrainer breaks ties by the pieces.) `seed` is
  unused: nothing is sampled.
  """
  del seed
  from tokenizers import trainers  # pylint: disable=g-import-not-at-top
  normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=lowercase,
                                          lowercase=lowercase)
  splitter = pre_tokenizers.BertPreTokenizer()
  marked = (" ".join(_WORD_START + w for w, _ in splitter.pre_tokenize_str(normalizer.normalize_str(t))) for t in texts)
  bpe = tokenizers.Tokenizer(models.BPE())
  bpe.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  wanted = vocab_size - len(base.SPECIAL_TOKENS)
  bpe.train_from_iterator(marked, trainer=trainers.BpeTrainer(vocab_size=max(wanted, 1), min_frequency=2,
                                                                show_progress=False))
  learned = sorted(bpe.get_vocab().items(), key=lambda item: item[1])
  converted = [p[1:] if p.startswith(_WORD_START) else "##" + p for p, _ in learned if p != _WORD_START]
  chars = sorted({p.removeprefix("##") for p in converted if len(p.removeprefix("##")) == 1})
  pieces = list(dict.fromkeys([*converted, *chars, *("##" + c for c in chars)]))
  single = {c for c in chars} | {"##" + c for c in chars}
  while len(pieces) > wanted:  # the characters' other halves made room: the last merges give way
    last = next(i for i in range(len(pieces) - 1, -1, -1) if pieces[i] not in single)
    del pieces[last]
  pieces = [*base.SPECIAL_TOKENS, *pieces]
  words = sum(len(p) > 1 and not p.startswith("##") for p in pieces[len(base.SPECIAL_TOKENS):])
  return registry.Trained(("\n".join(pieces) + "\n").encode("utf-8"), len(pieces), words)


# DistilBERT's and ELECTRA's tokenizers are BERT's WordPiece under other class names.
KIND = registry.register(registry.Kind(
    name="wordpiece", classes=("BertTokenizer", "DistilBertTokenizer", "ElectraTokenizer"),
    files=("vocab.txt", "tokenizer.json"), claims=_claims, load=_load, train=train_vocab, trained_file="vocab.txt"))
