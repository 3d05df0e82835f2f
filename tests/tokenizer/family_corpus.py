"""Text and tokenizer folders the BERT family's tokenizer tests share, built offline: the shared novel (generated
English-like text where ../shared is absent) plus generated multilingual text (accents, CJK, Cyrillic, Greek,
Arabic, emoji), a byte-level BPE and an XLM-R SentencePiece model trained on its first part, and the rest held out.
"""
import json
import os
import pathlib
import random
import shutil

NOVEL = pathlib.Path(__file__).resolve().parents[3] / "shared" / "data" / "botchan.txt"

_MULTILINGUAL = [
    "Ça va très bien, merci ; l'élève a reçu un prix à l'école d'été.",
    "Der Bär fährt über die Straße, und die Mädchen grüßen höflich.",
    "El niño comió piñas y jalapeños en la montaña señorial.",
    "Привет, как дела? Москва — столица России, а Нева течёт в Петербурге.",
    "Ελληνικά: η γλώσσα του Ομήρου και του Σωκράτη.",
    "東京は日本の首都です。富士山はとても美しい山です。",
    "我爱北京天安门，长城是中国的象征。",
    "서울은 한국의 수도입니다. 감사합니다!",
    "مرحبا بالعالم، كيف حالك اليوم؟",
    "Emoji 😀🎉 are fun 👍🏽 and flags 🇫🇷 too ✨",
    "naïve café résumé coöperate façade jalapeño Zoë",
]


def novel_lines() -> list[str]:
  """The novel's non-empty lines, or generated sentences of English-like words where ../shared is absent."""
  if NOVEL.is_file():
    return [line.strip() for line in NOVEL.read_text(encoding="utf-8").splitlines() if line.strip()]
  rng = random.Random(0)
  words = ("the cat sat on a mat while my teacher said that he would never come back to this town again and "
           "everyone laughed at the strange old man who lived by the river").split()
  return [" ".join(rng.choice(words) for _ in range(rng.randint(5, 20))).capitalize() + "." for _ in range(3000)]


def multilingual_lines(count: int, seed: int) -> list[str]:
  """`count` lines mixing the multilingual sentences' words, so no line is only a copy of the training text."""
  rng = random.Random(seed)
  words = [w for line in _MULTILINGUAL for w in line.split()]
  return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(count)]


def training_lines() -> list[str]:
  lines = novel_lines()
  return lines[: len(lines) * 4 // 5] + _MULTILINGUAL * 20 + multilingual_lines(400, seed=0)


def held_out() -> list[str]:
  """Held-out-like texts: the novel's last fifth, new mixes of the multilingual words, and awkward spacing,
  special tokens written in the text, and empty strings."""
  lines = novel_lines()
  return (lines[len(lines) * 4 // 5:][:150] + multilingual_lines(40, seed=1) + _MULTILINGUAL + [
      "", " ", "  leading and trailing spaces  ", "tabs\tand\nnew lines\r\nhere", "multiple    inner   spaces",
      "The <mask> of France.", "<s> literal specials </s> and <pad> <unk>", "UPPER lower MiXeD 123 4,567.89",
      "a" * 300, "İstanbul ﬁ ligature Ⅻ ½ ｆｕｌｌｗｉｄｔｈ", "unknown glyphs \u0378 \ue000 \U0001F9FF"])


def train_bpe(folder: pathlib.Path, vocab_size: int = 1200) -> pathlib.Path:
  """RoBERTa's layout: vocab.json + merges.txt of a byte-level BPE trained with `tokenizers`, then the folder
  RobertaTokenizer's save_pretrained writes from them (the Hub's format); returns the latter."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import models, pre_tokenizers, trainers  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  raw = folder / "vocab_merges"
  raw.mkdir(parents=True)
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
  tok.train_from_iterator(training_lines(), trainer=trainer)
  tok.model.save(str(raw))
  hub = folder / "roberta"
  transformers.RobertaTokenizer.from_pretrained(str(raw)).save_pretrained(str(hub))
  return hub


def train_xlmr(folder: pathlib.Path, vocab_size: int = 1200) -> pathlib.Path:
  """XLM-R's layout: a unigram SentencePiece model with SentencePiece's default ids (<unk> <s> </s>, as fairseq
  trains it) saved as sentencepiece.bpe.model, and the folder transformers' XLMRobertaTokenizer saves from it
  (tokenizer.json), with the model beside it as on the Hub; returns the latter."""
  import sentencepiece  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  raw = folder / "spm_only"
  raw.mkdir(parents=True)
  text = folder / "train.txt"
  text.write_text("\n".join(training_lines()) + "\n", encoding="utf-8")
  sentencepiece.SentencePieceTrainer.train(input=str(text), model_prefix=str(folder / "sp"), vocab_size=vocab_size,
                                           model_type="unigram", character_coverage=0.9995, num_threads=1,
                                           minloglevel=2)
  shutil.copy(folder / "sp.model", raw / "sentencepiece.bpe.model")
  (raw / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "XLMRobertaTokenizer",
                                                         "model_max_length": 512}))
  hub = folder / "xlmr"
  transformers.AutoTokenizer.from_pretrained(str(raw)).save_pretrained(str(hub))
  shutil.copy(raw / "sentencepiece.bpe.model", hub / "sentencepiece.bpe.model")
  return hub


def quiet_transformers() -> None:
  os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
