"""SentencePiece tokenizer with BERT's special tokens, and training of such a model.

Models from `train` hold `[PAD] [UNK] [CLS] [SEP] [MASK]` at ids 0..4 (as ALBERT's): `[PAD]` and `[UNK]` are
SentencePiece's pad and unknown pieces, `[CLS] [SEP] [MASK]` control symbols. Control symbols never come out
of encoding text, so unlike WordPiece a literal "[MASK]" in the text is ordinary characters. Lower-casing is
part of the model (`lowercase=True` trains with the case-folding rule `nmt_nfkc_cf`).
"""
import os
from collections.abc import Sequence

from etils import epath
import numpy as np
import sentencepiece

from jbert import untrusted
from jbert.tokenizer import base
from jbert.tokenizer import registry

WORD_START = "\u2581"  # "▁", SentencePiece's marker for a piece that starts a word.


class SentencePieceTokenizer(base.Tokenizer):
  """A SentencePiece `.model` behind the jbert tokenizer interface.

  Args:
    model_file: path of a `.model`. It needs `[CLS] [SEP] [MASK]` pieces, and a pad piece (`[PAD]`, or the
      model's pad id such as ALBERT's `<pad>`).
    do_lower_case: None, or what the caller expects of the model; a model that disagrees is an error, as
      SentencePiece fixes lower-casing at training time.
  """

  parses_special_tokens = False  # control symbols: a literal "[MASK]" in the text is ordinary characters

  def __init__(self, model_file: str, do_lower_case: bool | None = None):
    self.model_file = os.fspath(model_file)
    # The bytes, not the path: SentencePiece would read a link to /dev/zero until memory ran out.
    self._sp = sentencepiece.SentencePieceProcessor(model_proto=untrusted.read_bytes(self.model_file))
    sp = self._sp
    size = sp.get_piece_size()
    self._pieces = [sp.id_to_piece(i) for i in range(size)]
    vocab = {piece: i for i, piece in enumerate(self._pieces)}
    self.unk_id = sp.unk_id()
    pad_id = vocab.get("[PAD]", sp.pad_id())
    found = {"[PAD]": pad_id if pad_id >= 0 else None, "[UNK]": self.unk_id}
    found.update({t: vocab.get(t) for t in ("[CLS]", "[SEP]", "[MASK]")})
    missing = [t for t, i in found.items() if i is None]
    if missing:
      raise ValueError(f"SentencePiece model {self.model_file} lacks the special pieces {missing}; train it "
                       "with `python -m jbert.tokenizer train`, which adds all of them.")
    self.pad_id, self.cls_id, self.sep_id, self.mask_id = (
        found[t] for t in ("[PAD]", "[CLS]", "[SEP]", "[MASK]"))

    self.do_lower_case = sp.normalize("A").lstrip(WORD_START) == "a"
    if do_lower_case is not None and bool(do_lower_case) != self.do_lower_case:
      raise ValueError(f"do_lower_case={do_lower_case} but SentencePiece model {self.model_file} "
                       f"{'does' if self.do_lower_case else 'does not'} lower-case: its normalisation is "
                       "fixed at training (`train --lowercase`). Pass do_lower_case=None.")

    self.special_mask = np.zeros(size, dtype=bool)
    self.special_mask[list(self.special_ids)] = True
    # Control, unknown and byte pieces belong to no word, so they neither start nor continue one.
    wordless = np.array([sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i) for i in range(size)])
    starts = np.array([p.startswith(WORD_START) for p in self._pieces], dtype=bool)
    self.continuation_mask = ~starts & ~wordless & ~self.special_mask
    self._vocab = vocab

  def __repr__(self):
    return (f"SentencePieceTokenizer({self.model_file!r}, do_lower_case={self.do_lower_case}, "
            f"vocab_size={self.vocab_size})")

  @property
  def vocab_size(self) -> int:
    return len(self._pieces)

  @property
  def backend(self) -> sentencepiece.SentencePieceProcessor:
    return self._sp

  def save(self, out_dir: str | os.PathLike) -> list[str]:
    """A copy of the `.model` file in `out_dir` (local or gs://), under its own name."""
    out = epath.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = out / os.path.basename(self.model_file)
    target.write_bytes(self._sp.serialized_model_proto())
    return [os.fspath(target)]

  def tokenize(self, text: str) -> list[str]:
    return self._sp.encode(text, out_type=str)

  def ids(self, text: str) -> list[int]:
    return self._sp.encode(text)

  def batch_ids(self, texts: Sequence[str]) -> list[list[int]]:
    return self._sp.encode(list(texts))

  def ids_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Ids and character spans; a `▁` piece's span includes the space it stands for."""
    mapping = self._sp.encode_as_offset_mapping(text)
    return mapping["ids"], mapping["offsets"]

  def convert_tokens_to_ids(self, tokens: Sequence[str]) -> list[int]:
    vocab, unk = self._vocab, self.unk_id
    return [vocab.get(t, unk) for t in tokens]

  def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
    pieces = self._pieces
    return [pieces[i] for i in ids]

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    """Detokenized text; special tokens other than `[UNK]` appear by name unless skipped."""
    ids = [int(i) for i in ids]
    if skip_special_tokens:
      return self._sp.decode([i for i in ids if not self.special_mask[i] or i == self.unk_id])
    # SentencePiece drops control symbols while decoding, so decode the runs between them.
    parts, run = [], []
    for i in ids:
      if self.special_mask[i] and i != self.unk_id:
        parts += [self._sp.decode(run), self._pieces[i]]
        run = []
      else:
        run.append(i)
    parts.append(self._sp.decode(run))
    return " ".join(p for p in parts if p)


def train(input_files: Sequence[str], out_prefix: str, vocab_size: int, model_type: str = "unigram",
          lowercase: bool = False, character_coverage: float = 0.9995, input_sentence_size: int = 0,
          num_threads: int | None = None) -> SentencePieceTokenizer:
  """Trains a SentencePiece model with BERT's special tokens at ids 0..4; writes PREFIX.model, PREFIX.vocab.

  Args:
    input_files: text files, one sentence (or paragraph) per line.
    out_prefix: output path without extension; its directory is created.
    vocab_size: number of pieces, the five special tokens included.
    model_type: "unigram" or "bpe".
    lowercase: case-fold the text (normalisation rule `nmt_nfkc_cf` instead of `nmt_nfkc`).
    character_coverage: fraction of characters the pieces cover; the rest map to [UNK].
    input_sentence_size: train on this many randomly chosen lines; 0 uses all.
    num_threads: trainer threads; None uses all CPU cores.

  Returns:
    The trained model, loaded.
  """
  if model_type not in ("unigram", "bpe"):
    raise ValueError(f"model_type={model_type!r} is not supported; use 'unigram' or 'bpe'.")
  if not input_files:
    raise ValueError("No input files to train SentencePiece on; pass at least one text file.")
  out_dir = os.path.dirname(os.fspath(out_prefix))
  if out_dir:
    os.makedirs(out_dir, exist_ok=True)
  sentencepiece.SentencePieceTrainer.train(
      input=list(input_files), model_prefix=os.fspath(out_prefix), vocab_size=vocab_size,
      model_type=model_type, character_coverage=character_coverage,
      input_sentence_size=input_sentence_size, shuffle_input_sentence=True,
      num_threads=num_threads or os.cpu_count() or 1,
      normalization_rule_name="nmt_nfkc_cf" if lowercase else "nmt_nfkc",
      pad_id=0, pad_piece="[PAD]", unk_id=1, unk_piece="[UNK]", bos_id=-1, eos_id=-1,
      control_symbols=["[CLS]", "[SEP]", "[MASK]"], minloglevel=1)
  return SentencePieceTokenizer(f"{out_prefix}.model")


def _claims(file, config: dict) -> bool:
  """jbert's own SentencePiece models (trained by `train`: BERT's [CLS] among their pieces)."""
  if file.suffix != ".model":
    return False
  try:
    sp = sentencepiece.SentencePieceProcessor(model_proto=registry.read_bytes(file))
  except (RuntimeError, OSError):
    return False
  return sp.piece_to_id("[CLS]") != sp.unk_id()


KIND = registry.register(registry.Kind(
    name="bert_sentencepiece", classes=(), files=("*.model",), claims=_claims,
    load=lambda file, config, do_lower_case: SentencePieceTokenizer(file, do_lower_case=do_lower_case)))
