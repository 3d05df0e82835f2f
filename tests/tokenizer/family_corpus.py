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
  syllables = ["the", "ka", "lo", "mi", "nu", "ser", "tan", "vo", "rel", "pi", "qu", "zo", "da", "ing", "er", "st"]
  words = ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(800)]
  return [" ".join(rng.choice(words).capitalize() if rng.random() < 0.1 else rng.choice(words)
                   for _ in range(rng.randint(5, 20))) + rng.choice(".,;!?") for _ in range(3000)]


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
  return (lines[len(lines) * 4 // 5:][:80] + multilingual_lines(40, seed=1) + _MULTILINGUAL + [
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


def train_modernbert(folder: pathlib.Path, vocab_size: int = 1200) -> pathlib.Path:
  """answerdotai/ModernBERT-base's tokenizer files, on a vocabulary trained on the shared corpus: NFC, byte-level
  pre-tokenizer without a prefix space, its BERT-style template, and tokenizer_config.json naming the tokens."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  # pylint: disable-next=g-import-not-at-top
  from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers
  specials = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
  tok = tokenizers.Tokenizer(models.BPE())
  tok.normalizer = normalizers.NFC()
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|padding|>", "<|endoftext|>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
  tok.train_from_iterator(training_lines(), trainer=trainer)
  tok.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False, lstrip=t == "[MASK]")
                          for t in specials])
  ids = {t: tok.token_to_id(t) for t in specials}
  tok.post_processor = processors.TemplateProcessing(
      single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
      special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])])
  folder.mkdir(parents=True, exist_ok=True)
  tok.save(str(folder / "tokenizer.json"))
  (folder / "tokenizer_config.json").write_text(json.dumps({
      "tokenizer_class": "PreTrainedTokenizerFast", "cls_token": "[CLS]", "sep_token": "[SEP]",
      "pad_token": "[PAD]", "unk_token": "[UNK]", "mask_token": "[MASK]", "model_max_length": 8192,
      "clean_up_tokenization_spaces": True, "model_input_names": ["input_ids", "attention_mask"]}))
  return folder


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
                                           hard_vocab_limit=False, minloglevel=2)
  shutil.copy(folder / "sp.model", raw / "sentencepiece.bpe.model")
  (raw / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "XLMRobertaTokenizer",
                                                         "model_max_length": 512}))
  hub = folder / "xlmr"
  transformers.AutoTokenizer.from_pretrained(str(raw)).save_pretrained(str(hub))
  shutil.copy(raw / "sentencepiece.bpe.model", hub / "sentencepiece.bpe.model")
  return hub


def quiet_transformers() -> None:
  os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def assert_matches_transformers(ours, folder, texts: list[str], tokenizer_class: str = "AutoTokenizer",
                                split_words: bool = True) -> int:
  """Every id path of `ours` equals transformers' AutoTokenizer of `folder` on `texts`: pieces, ids (one by one and
  batched), special ids, single texts and pairs with their token types, longest-first truncation at odd and even
  budgets, only_second truncation (SQuAD's windows), offsets (QA), pre-split words (NER, add_prefix_space) and
  decoding. `tokenizer_class`: the transformers class that reads `folder` (AutoTokenizer needs its
  tokenizer_config.json); `split_words=False` leaves pre-split words out (transformers tokenizes those of a
  template tokenizer, ModernBERT's, without the space before them whatever add_prefix_space says, unlike jbert).
  Returns the number of comparisons made."""
  quiet_transformers()
  import transformers  # pylint: disable=g-import-not-at-top
  reader = getattr(transformers, tokenizer_class)
  theirs = reader.from_pretrained(str(folder))
  words_theirs = reader.from_pretrained(str(folder), add_prefix_space=True)
  assert (ours.cls_id, ours.sep_id, ours.pad_id, ours.unk_id, ours.mask_id) == (
      theirs.cls_token_id, theirs.sep_token_id, theirs.pad_token_id, theirs.unk_token_id, theirs.mask_token_id)
  assert ours.vocab_size == len(theirs)
  compared = 0
  batched = ours.batch_ids(texts)
  for text, ids in zip(texts, batched):
    assert ours.tokenize(text) == theirs.tokenize(text), text
    assert ours.ids(text) == ids == theirs(text, add_special_tokens=False)["input_ids"], text
    mine = ours.encode(text)
    assert mine["input_ids"] == theirs(text)["input_ids"], text
    assert mine["token_type_ids"] == [0] * len(mine["input_ids"]) and set(mine["attention_mask"]) == {1}
    got, offsets = ours.ids_with_offsets(text)
    expected = theirs(text, add_special_tokens=False, return_offsets_mapping=True)
    assert got == ids and offsets == [tuple(o) for o in expected["offset_mapping"]], text
    assert ours.decode(ids) == theirs.decode(ids), text
    assert ours.decode(mine["input_ids"], skip_special_tokens=True) == theirs.decode(mine["input_ids"],
                                                                                      skip_special_tokens=True)
    words = text.split() if split_words else []
    if words:
      pieces = ours.batch_word_ids(words)
      expected = words_theirs(words, is_split_into_words=True, add_special_tokens=False)
      assert [i for p in pieces for i in p] == expected["input_ids"], text
      assert [w for w, p in enumerate(pieces) for _ in p] == expected.word_ids(), text
    compared += 1
  for a, b in zip(texts[::2], texts[7::2] + texts[1:7:2]):
    if not b:  # an empty second text is no pair in jbert (BERT's run_classifier), unlike in transformers
      continue
    mine = ours.encode(a, b)
    assert mine["input_ids"] == theirs(a, b)["input_ids"], (a, b)
    assert mine["token_type_ids"] == [0] * len(mine["input_ids"])
    for max_length in (6, 9, 16, 17, 40):  # odd and even budgets, both texts cut or one
      mine = ours.encode(a, b, max_length=max_length)
      assert mine["input_ids"] == theirs(a, b, truncation="longest_first", max_length=max_length)["input_ids"], (
          a, b, max_length)
      ids_a, ids_b = ours.ids(a), ours.ids(b)
      if len(ids_a) + 5 <= max_length and b:  # run_qa's only_second: the question whole, the context cut
        budget = max_length - len(ids_a) - ours.num_special_tokens(pair=True)
        mine = ours.build_inputs(ids_a, ids_b[:budget])["input_ids"]
        assert mine == theirs(a, b, truncation="only_second", max_length=max_length)["input_ids"], (a, b)
      compared += 1
  return compared
