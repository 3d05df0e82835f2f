"""A tokenizer on a Hugging Face `tokenizers` pipeline with RoBERTa's input layout, shared by the byte-level BPE
(RoBERTa) and XLM-R SentencePiece kinds: `<s> A </s>`, `<s> A </s></s> B </s>`, one token type, and truncation
as transformers' (Rust) tokenizers cut, since those are the reference these families' ids are checked against.
"""
import json
import os
from collections.abc import Sequence

from etils import epath
import numpy as np
import tokenizers

from jbert import errors, untrusted
from jbert.tokenizer import backed, base
from jbert.tokenizer import registry

# Role -> (tokenizer_config.json key, default text) of RoBERTa's special tokens.
ROLES = {"cls": ("cls_token", "<s>"), "sep": ("sep_token", "</s>"), "pad": ("pad_token", "<pad>"),
         "unk": ("unk_token", "<unk>"), "mask": ("mask_token", "<mask>"), "bos": ("bos_token", "<s>"),
         "eos": ("eos_token", "</s>")}


def added_tokens(config: dict, mask_lstrip: bool = False, extra: tuple[str, ...] = ()):
  """The special tokens (and `extra` ones) as `tokenizers.AddedToken`s, with the flags tokenizer_config.json's
  added_tokens_decoder gives them (transformers 4 wrote `<mask>` with lstrip there, as the Hub's tokenizer.json has
  it); without one, the class's defaults in transformers 5: `mask_lstrip` for `<mask>`, no stripping elsewhere (so
  RoBERTa's " <mask>" keeps its space as a piece of its own)."""
  stated = {entry.get("content"): entry for entry in (config.get("added_tokens_decoder") or {}).values()
            if isinstance(entry, dict)}
  tokens = []
  texts = [registry.special_token(config, *ROLES[role]) for role in ("cls", "sep", "pad", "unk", "mask")]
  for text in [*texts, *extra]:
    flags = stated.get(text, {"lstrip": mask_lstrip and text == texts[-1]})
    tokens.append(tokenizers.AddedToken(
        text, special=True, normalized=bool(flags.get("normalized", False)), lstrip=bool(flags.get("lstrip", False)),
        rstrip=bool(flags.get("rstrip", False)), single_word=bool(flags.get("single_word", False))))
  return tokens


def truncate_longest_first(ids_a: list[int], ids_b: list[int] | None, max_tokens: int):
  """transformers' (Rust `tokenizers`) longest-first truncation: the shorter segment keeps what it can, and when
  both are over half the budget each keeps half, the odd token going to the longer one (to B on a tie)."""
  if ids_b is None:
    return ids_a[:max_tokens], None
  n1, n2 = len(ids_a), len(ids_b)
  if n1 + n2 <= max_tokens:
    return list(ids_a), list(ids_b)
  swap = n1 > n2
  if swap:
    n1, n2 = n2, n1
  n2 = n1 if n1 > max_tokens else max(n1, max_tokens - n1)
  if n1 + n2 > max_tokens:
    n1 = max_tokens // 2
    n2 = n1 + max_tokens % 2
  if swap:
    n1, n2 = n2, n1
  return ids_a[:n1], ids_b[:n2]


def read_pipeline(file: str) -> tokenizers.Tokenizer:
  """A tokenizer.json as `tokenizers` reads it; one the library cannot read is one line naming the file."""
  text = untrusted.read_text(file)
  try:
    return tokenizers.Tokenizer.from_str(text)
  except Exception as e:  # the Rust library raises bare Exceptions
    raise ValueError(f"{file} is not a tokenizer.json the tokenizers library can read ({errors.preview(str(e))}); "
                     "pass the model's own tokenizer files.") from e


class PipelineTokenizer(backed.TokenizersBacked):
  """jbert's interface over a `tokenizers.Tokenizer` whose special tokens are added tokens of its own vocabulary.

  Args:
    source: the file it was read from (for messages and `repr`).
    tok: the pipeline: normaliser, pre-tokeniser, model, the special tokens as added tokens; a post-processor
      may trim offsets (it never adds tokens here: every call passes add_special_tokens=False).
    word_tok: the pipeline for words of a pre-split text (`batch_word_ids`), where it differs from `tok`.
    config: the folder's tokenizer_config.json (special tokens, model_max_length), maybe empty.
    word_start: the mark of a piece that begins a word (`Ġ`, `▁`); other ordinary pieces continue one.
  """

  second_type_id = 0

  def __init__(self, source: str, tok: tokenizers.Tokenizer, config: dict, word_start: str,
               word_tok: tokenizers.Tokenizer | None = None):
    self.source = os.fspath(source)
    self._tok, self._word_tok = tok, word_tok or tok
    self.config = dict(config)
    self._pieces = [tok.id_to_token(i) for i in range(tok.get_vocab_size(with_added_tokens=True))]
    self._vocab = {piece: i for i, piece in enumerate(self._pieces) if piece is not None}
    self._pieces = [p if p is not None else f"<unreachable{i}>" for i, p in enumerate(self._pieces)]
    self.special_tokens = {role: registry.special_token(config, key, default) for role, (key, default) in ROLES.items()}
    # bos/eos are no part of the layout (ModernBERT's tokenizer names none).
    used = ("cls", "sep", "pad", "unk", "mask")
    missing = sorted({self.special_tokens[r] for r in used if self.special_tokens[r] not in self._vocab})
    if missing:
      raise ValueError(f"Tokenizer {self.source} lacks the special tokens {missing} that its tokenizer_config.json "
                       "(or RoBERTa's defaults) names; pass the model's own tokenizer folder.")
    self.cls_id, self.sep_id, self.pad_id, self.unk_id, self.mask_id = (
        self._vocab[self.special_tokens[r]] for r in ("cls", "sep", "pad", "unk", "mask"))
    self.model_max_length = registry.model_max_length(config)
    self.do_lower_case = tok.normalizer is not None and tok.normalizer.normalize_str("A") == "a"

    size = len(self._pieces)
    added = {int(i) for i in tok.get_added_tokens_decoder()}
    self.special_mask = np.zeros(size, dtype=bool)
    self.special_mask[[*self.special_ids, *[i for i in added if i < size]]] = True
    starts = np.array([p.startswith(word_start) for p in self._pieces], dtype=bool)
    self.continuation_mask = ~starts & ~self.special_mask

  def __repr__(self):
    return (f"{type(self).__name__}({self.source!r}, do_lower_case={self.do_lower_case}, "
            f"vocab_size={self.vocab_size})")

  @property
  def pair_separator_ids(self) -> tuple[int, ...]:
    return (self.sep_id, self.sep_id)

  def truncate(self, ids_a, ids_b, max_tokens):
    return truncate_longest_first(ids_a, ids_b, max_tokens)

  def batch_word_ids(self, words: Sequence[str]) -> list[list[int]]:
    encodings = self._word_tok.encode_batch([[w] for w in words], is_pretokenized=True, add_special_tokens=False)
    return [e.ids for e in encodings]

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  def post_processor(self) -> tokenizers.processors.PostProcessor:
    """The post-processor transformers' class puts on the saved tokenizer.json (what a pair's ids look like)."""
    cls, sep = self.special_tokens["cls"], self.special_tokens["sep"]
    return tokenizers.processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} {sep} $B {sep}",
        special_tokens=[(cls, self.cls_id), (sep, self.sep_id)])

  def write_folder(self, out_dir: str | os.PathLike, tokenizer_class: str, extra_config: dict,
                   extra_files: dict[str, bytes]) -> list[str]:
    """tokenizer.json, tokenizer_config.json, special_tokens_map.json and `extra_files` in `out_dir` (local or
    gs://): a folder transformers' `AutoTokenizer` loads as `tokenizer_class` with the same ids."""
    out = epath.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    saved = tokenizers.Tokenizer.from_str(self._tok.to_str())
    saved.post_processor = self.post_processor()
    specials = {ROLES[role][0]: text for role, text in self.special_tokens.items() if text in self._vocab}
    config = {**{k: v for k, v in self.config.items() if k not in ("tokenizer_class", "auto_map")},
              **specials, **extra_config, "tokenizer_class": tokenizer_class}
    if self.model_max_length is not None:
      config["model_max_length"] = self.model_max_length
    files = {"tokenizer.json": saved.to_str(pretty=True).encode("utf-8"),
             "tokenizer_config.json": (json.dumps(config, indent=2, sort_keys=True) + "\n").encode("utf-8"),
             "special_tokens_map.json": (json.dumps(specials, indent=2) + "\n").encode("utf-8"), **extra_files}
    for name, data in files.items():
      (out / name).write_bytes(data)
    return [os.fspath(out / name) for name in files]
