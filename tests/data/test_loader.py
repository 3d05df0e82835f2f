"""The grain pipeline: batch contract, determinism, epochs, shard disjointness, checkpoint/resume, eval."""
import json

import numpy as np
import pytest
import tensorflow_datasets as tfds

from jbert.data import config as data_config
from jbert.data import loader
from jbert.tokenizer import load_tokenizer

KEYS = {"input_ids", "token_type_ids", "attention_mask", "masked_lm_positions", "masked_lm_ids",
        "masked_lm_weights", "next_sentence_labels"}


@pytest.fixture(scope="module")
def synthetic_cfg(tmp_path_factory):
  cfg = data_config.default_pretrain_config()
  cfg.synthetic_dir = str(tmp_path_factory.mktemp("synthetic"))
  cfg.max_seq_length, cfg.max_predictions_per_seq, cfg.docs_per_group = 48, 8, 64
  cfg.prefetch_groups = 0
  return cfg


@pytest.fixture(scope="module")
def tagged(tmp_path_factory):
  """60 BERT-format documents whose words belong to one document each: word id -> document is known."""
  root = tmp_path_factory.mktemp("tagged")
  words = [[[f"d{d}s{s}w{w}" for w in range(4)] for s in range(3)] for d in range(60)]
  (root / "corpus.txt").write_text("\n\n".join("\n".join(" ".join(s) for s in doc) for doc in words) + "\n")
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(w for doc in words for s in doc for w in s)]
  (root / "vocab.txt").write_text("\n".join(vocab) + "\n")
  cfg = data_config.default_pretrain_config()
  cfg.source, cfg.files, cfg.vocab = "files", str(root / "corpus.txt"), str(root / "vocab.txt")
  cfg.max_seq_length, cfg.max_predictions_per_seq, cfg.docs_per_group = 32, 5, 8
  cfg.eval_documents, cfg.nsp, cfg.prefetch_groups = 6, False, 0
  doc_of = np.full(len(vocab), -1)
  doc_of[5:] = np.repeat(np.arange(60), 12)
  return cfg, load_tokenizer(cfg.vocab), doc_of


def take(it, n):
  return [next(it) for _ in range(n)]


def unmasked(batch) -> np.ndarray:
  """Input ids before masking (random replacements may come from any document)."""
  ids = batch["input_ids"].copy()
  rows, cols = np.nonzero(batch["masked_lm_weights"])
  ids[rows, batch["masked_lm_positions"][rows, cols]] = batch["masked_lm_ids"][rows, cols]
  return ids


def documents_in(batches, doc_of) -> set[int]:
  return {int(doc_of[t]) for b in batches for t in unmasked(b)[b["attention_mask"] == 1] if doc_of[t] >= 0}


def same(a, b) -> bool:
  return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_batch_contract(synthetic_cfg):
  tok = loader.build_tokenizer(synthetic_cfg)
  it = loader.make_pretrain_iterator(synthetic_cfg, tok, global_batch_size=16, seed=0, process_count=2)
  batch = next(it)
  assert set(batch) == KEYS
  assert all(v.dtype == np.int32 for v in batch.values())
  assert batch["input_ids"].shape == batch["token_type_ids"].shape == batch["attention_mask"].shape == (8, 48)
  assert batch["masked_lm_positions"].shape == batch["masked_lm_weights"].shape == (8, 8)
  assert batch["next_sentence_labels"].shape == (8,)
  ids, n = batch["input_ids"], batch["attention_mask"].sum(axis=1)
  assert np.all(ids[:, 0] == tok.cls_id) and np.all(ids[np.arange(8), n - 1] == tok.sep_id)
  assert np.all((ids == tok.sep_id).sum(axis=1) == 2)
  assert np.all(ids[batch["attention_mask"] == 0] == tok.pad_id)
  first_sep = np.argmax(ids == tok.sep_id, axis=1)
  for r in range(8):  # token types: 0 up to the first [SEP], 1 through the second, 0 on padding
    positions = np.arange(48)
    np.testing.assert_array_equal(batch["token_type_ids"][r], (positions > first_sep[r]) & (positions < n[r]))
  assert set(np.unique(batch["next_sentence_labels"])) <= {0, 1}


def test_same_seed_same_stream_other_seed_other_stream(synthetic_cfg):
  tok = loader.build_tokenizer(synthetic_cfg)
  make = lambda seed: take(loader.make_pretrain_iterator(synthetic_cfg, tok, global_batch_size=8, seed=seed),
                           4)
  a, b, c = make(0), make(0), make(1)
  assert all(same(x, y) for x, y in zip(a, b))
  assert not same(a[0], c[0])


def test_epochs_redraw_instances_and_masks(tagged):
  cfg, tok, doc_of = tagged
  cfg = cfg.copy_and_resolve_references()
  cfg.docs_per_group = 100  # one group per epoch: both epochs hold exactly the same documents
  src, start, stop = loader.make_source(cfg, "train")
  maker = loader.GroupMaker(cfg, tok, src, np.arange(start, stop), seed=0, shard=0)
  e0, e1 = maker(0), maker(1)
  assert documents_in([e0], doc_of) == documents_in([e1], doc_of) == set(range(54))
  assert not np.array_equal(e0["masked_lm_positions"], e1["masked_lm_positions"])
  assert same(maker(1), e1)


def test_shards_split_documents_disjointly(tagged):
  cfg, tok, doc_of = tagged
  src, start, stop = loader.make_source(cfg, "train")
  assert (start, stop) == (0, 54)  # the last eval_documents=6 are held out
  seen = []
  for shard in range(2):
    maker = loader.GroupMaker(cfg, tok, src, np.arange(start, stop)[shard::2], seed=0, shard=shard)
    epoch = [maker(g) for g in range(maker.groups_per_epoch)]
    seen.append(documents_in(epoch, doc_of))
  assert seen[0] & seen[1] == set()
  assert seen[0] | seen[1] == set(range(54))
  batch = next(loader.make_pretrain_iterator(cfg, tok, global_batch_size=8, seed=0, process_index=1,
                                             process_count=2))
  assert documents_in([batch], doc_of) <= seen[1]


def test_held_out_eval_is_fixed_and_separate(tagged):
  cfg, tok, doc_of = tagged
  a = loader.make_eval_batches(cfg, tok, global_batch_size=4, num_batches=3)
  b = loader.make_eval_batches(cfg, tok, global_batch_size=4, num_batches=3)
  assert len(a) == 3 and all(same(x, y) for x, y in zip(a, b))
  assert documents_in(a, doc_of) <= set(range(54, 60))


@pytest.mark.parametrize("workers", [0, 2])
def test_state_restores_into_a_new_iterator(synthetic_cfg, workers):
  cfg = synthetic_cfg.copy_and_resolve_references()
  cfg.worker_count = workers
  tok = loader.build_tokenizer(cfg)
  make = lambda: loader.make_pretrain_iterator(cfg, tok, global_batch_size=24, seed=3)
  it = make()
  take(it, 5)
  state = json.loads(json.dumps(it.get_state()))  # what the trainer writes and reads back
  expected = take(it, 2)
  resumed = make()
  resumed.set_state(state)
  got = take(resumed, 2)
  assert all(same(x, y) for x, y in zip(expected, got))
  for i in (it, resumed):
    i.close()


def test_whole_word_masking_through_config(synthetic_cfg):
  cfg = synthetic_cfg.copy_and_resolve_references()
  cfg.whole_word_masking = True
  tok = loader.build_tokenizer(cfg)
  batch = next(loader.make_pretrain_iterator(cfg, tok, global_batch_size=64, seed=0))
  w = batch["masked_lm_weights"] == 1
  rows, cols = np.nonzero(w)
  positions = batch["masked_lm_positions"][rows, cols]
  masked = np.zeros(batch["input_ids"].shape, bool)
  masked[rows, positions] = True
  original = batch["input_ids"].copy()
  original[rows, positions] = batch["masked_lm_ids"][rows, cols]
  # A `##` piece (not cut loose by truncation: it follows a word piece) belongs to the word before it.
  continues = tok.continuation_mask[original][:, 1:] & ~tok.special_mask[original][:, :-1]
  assert (masked[:, 1:] & continues).any()
  np.testing.assert_array_equal(masked[:, 1:][continues], masked[:, :-1][continues])


@pytest.mark.parametrize("change, message", [
    (dict(source="nope"), "data.source='nope'"),
    (dict(source="files", files=None), "source='files' needs data.files"),
    (dict(max_predictions_per_seq=100), "max_predictions_per_seq=100 exceeds max_seq_length=32"),
])
def test_bad_config(tagged, change, message):
  cfg, tok, _ = tagged
  cfg = cfg.copy_and_resolve_references()
  for k, v in change.items():
    cfg[k] = v
  with pytest.raises(ValueError, match=message):
    loader.make_pretrain_iterator(cfg, tok, global_batch_size=8, seed=0)


def test_bad_batch_and_shards(tagged):
  cfg, tok, _ = tagged
  with pytest.raises(ValueError, match="global_batch_size=9 must be a positive multiple of the 2 data"):
    loader.make_pretrain_iterator(cfg, tok, global_batch_size=9, seed=0, process_count=2)
  with pytest.raises(ValueError, match="has no train documents"):
    loader.make_pretrain_iterator(cfg, tok, global_batch_size=64, seed=0, process_index=60, process_count=64)


def test_vocab_required_outside_synthetic(tagged):
  cfg = tagged[0].copy_and_resolve_references()
  cfg.vocab = None
  with pytest.raises(ValueError, match="data.vocab is None with source='files'"):
    loader.build_tokenizer(cfg)


def test_tfds_source_end_to_end(tagged):
  _, tok, doc_of = tagged
  texts = [" ".join(f"d{d}s{s}w{w}" for w in range(4)) + "." for d in range(60) for s in range(3)]
  documents = [{"text": " ".join(texts[3 * d:3 * d + 3]).encode(), "title": str(d)} for d in range(60)]
  cfg = data_config.default_pretrain_config()
  cfg.source, cfg.tfds_name, cfg.eval_documents = "tfds", "wikipedia/20230601.en", 6
  cfg.max_seq_length, cfg.max_predictions_per_seq, cfg.prefetch_groups = 32, 5, 0
  with tfds.testing.mock_data(as_data_source_fn=lambda self, split, **kwargs: documents):
    train = take(loader.make_pretrain_iterator(cfg, tok, global_batch_size=16, seed=0), 4)
    held_out = loader.make_eval_batches(cfg, tok, global_batch_size=16, num_batches=2)
  assert train[0]["input_ids"].shape == (16, 32)
  assert documents_in(train, doc_of) <= set(range(54)) and len(documents_in(train, doc_of)) > 20
  assert documents_in(held_out, doc_of) == set(range(54, 60))


def _text_cfg(path, vocab, **changes):
  cfg = data_config.default_pretrain_config()
  cfg.source, cfg.text_files, cfg.vocab = "text", str(path), str(vocab)
  cfg.max_seq_length, cfg.max_predictions_per_seq, cfg.prefetch_groups = 32, 5, 0
  for key, value in changes.items():
    cfg[key] = value
  return cfg


@pytest.fixture(scope="module")
def novel(tmp_path_factory):
  """A plain-text 'novel' without blank lines: one document of 40 sentences whose words name their sentence."""
  root = tmp_path_factory.mktemp("novel")
  sentences = [f"s{i}a s{i}b s{i}c." for i in range(40)]
  (root / "novel.txt").write_text("\n".join(sentences) + "\n")
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *(f"s{i}{w}" for i in range(40) for w in "abc")]
  (root / "vocab.txt").write_text("\n".join(vocab) + "\n")
  sentence_of = np.full(len(vocab), -1)
  sentence_of[6:] = np.repeat(np.arange(40), 3)
  return root, sentence_of


def test_a_single_document_holds_out_its_last_tenth_of_sentences(novel):
  root, sentence_of = novel
  cfg = _text_cfg(root / "novel.txt", root / "vocab.txt")
  loader.check_data(cfg, eval_enabled=True)
  tok = load_tokenizer(cfg.vocab)
  seen = lambda batches: {int(sentence_of[t]) for b in batches for t in unmasked(b)[b["attention_mask"] == 1]
                          if sentence_of[t] >= 0}
  train = take(loader.make_pretrain_iterator(cfg, tok, global_batch_size=8, seed=0), 12)
  held_out = loader.make_eval_batches(cfg, tok, global_batch_size=4, num_batches=2)
  assert seen(train) == set(range(36))  # every training sentence, and none of the held-out four
  assert seen(held_out) == {36, 37, 38, 39}


def test_a_one_sentence_corpus_cannot_hold_anything_out(tmp_path, novel):
  root, _ = novel
  (tmp_path / "one.txt").write_text("s0a s0b s0c.\n")
  cfg = _text_cfg(tmp_path / "one.txt", root / "vocab.txt")
  with pytest.raises(ValueError, match=r"one.txt: too little text to hold any out for evaluation.*eval_files"):
    loader.check_data(cfg, eval_enabled=True)
  loader.check_data(cfg, eval_enabled=False)


@pytest.mark.parametrize("change, error, message", [
    (dict(text_files="{root}/nothing*.txt"), FileNotFoundError, r"no file matches the glob '.*nothing\*\.txt'"),
    (dict(source="files", files=None), ValueError, "source='files' needs data.files"),
    (dict(max_predictions_per_seq=40), ValueError, "max_predictions_per_seq=40 exceeds max_seq_length=32"),
    (dict(eval_documents=0), ValueError, "No held-out documents for evaluation: data.eval_documents=0"),
])
def test_check_data_refuses_bad_settings(novel, change, error, message):
  root, _ = novel
  cfg = _text_cfg(root / "novel.txt", root / "vocab.txt",
                  **{k: v.format(root=root) if isinstance(v, str) else v for k, v in change.items()})
  with pytest.raises(error, match=message):
    loader.check_data(cfg, eval_enabled=True)


def test_check_data_counts_documents_per_shard(tagged):
  cfg = tagged[0]
  loader.check_data(cfg, eval_enabled=True, num_shards=6)  # 54 training and 6 held-out documents
  with pytest.raises(ValueError, match=r"The eval split of .*corpus.txt holds 6 document\(s\), fewer than the 8 "
                                       r"data shards"):
    loader.check_data(cfg, eval_enabled=True, num_shards=8)
  loader.check_data(cfg, eval_enabled=False, num_shards=8)


def test_check_data_opens_tfds_without_downloading(tmp_path, monkeypatch):
  monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path))
  cfg = data_config.default_pretrain_config()
  cfg.source = "tfds"
  with pytest.raises(FileNotFoundError, match=r"TFDS dataset 'wikipedia/20230601.en' split 'train' has no "
                                              r"prepared random-access \(array_record\) files in TFDS's data dir"):
    loader.check_data(cfg, eval_enabled=False)
  assert not list(tmp_path.rglob("*.array_record*"))


@pytest.mark.parametrize("source", ["text", "files"])
def test_a_corpus_of_nul_bytes_is_an_error_naming_the_file(tmp_path, novel, source):
  (tmp_path / "zeros.bin").write_bytes(b"\x00" * 5000)
  cfg = _text_cfg(tmp_path / "zeros.bin", novel[0] / "vocab.txt", source=source, eval_documents=0)
  cfg.files = cfg.text_files
  tok = load_tokenizer(cfg.vocab)
  with pytest.raises(ValueError) as error:  # when the source is made, before any workdir file
    loader.make_pretrain_iterator(cfg, tok, global_batch_size=8, seed=0)
  assert str(error.value) == (f"{tmp_path / 'zeros.bin'} is not UTF-8 text: 5000 of the first 5000 characters are NUL, "
                              "control characters or bytes that are not UTF-8 (a binary file, or text in another "
                              "encoding); convert it to UTF-8 (e.g. `iconv -f latin1 -t utf-8`) or leave it out of the "
                              "data files.")


def test_empty_documents_among_text_are_skipped_without_error(tmp_path, novel):
  # Three documents, one per group, two of them NUL bytes: never more than 4 empty groups in a row.
  (tmp_path / "mixed.txt").write_bytes(b"\x00\x00\n\ns1a s1b s1c. s2a s2b.\n\n\x00\x00\x00\n")
  cfg = _text_cfg(tmp_path / "mixed.txt", novel[0] / "vocab.txt", docs_per_group=1, eval_documents=0)
  assert loader.empty_group_limit(3) == 5
  batches = take(loader.make_pretrain_iterator(cfg, load_tokenizer(cfg.vocab), global_batch_size=4, seed=0), 30)
  assert all(b["input_ids"].shape == (4, 32) for b in batches)


def test_mlm_only_packs_full_sentences_across_documents(tagged):
  cfg, tok, doc_of = tagged  # nsp=False
  batches = take(loader.make_pretrain_iterator(cfg, tok, global_batch_size=16, seed=0), 4)
  rows = [row for b in batches for row in unmasked(b)]
  crossing = [row for row in rows if len({int(doc_of[t]) for t in row if doc_of[t] >= 0}) > 1]
  assert len(crossing) > len(rows) // 2  # 12-token documents, 30-token rows: most rows hold several
  for row in crossing:
    seps = [0, *np.flatnonzero(row == tok.sep_id)]  # after [CLS], a [SEP] closes each document's part
    parts = [{int(doc_of[t]) for t in row[a + 1:b]} for a, b in zip(seps, seps[1:])]
    assert all(len(p) == 1 for p in parts) and all(p != q for p, q in zip(parts, parts[1:]))
  assert all(len(b["next_sentence_labels"]) == 16 and not b["next_sentence_labels"].any() for b in batches)
  lengths = np.concatenate([b["attention_mask"].sum(axis=1) for b in batches])
  assert np.mean(lengths) > 0.8 * 32  # full, where one document alone would not fill them


def test_a_small_corpus_holds_out_the_tail_of_every_document_whatever_the_file_order(tmp_path, novel, caplog):
  root, sentence_of = novel
  sentences = [f"s{i}a s{i}b s{i}c." for i in range(40)]
  (tmp_path / "a.txt").write_text(" ".join(sentences[:20]) + "\n\n" + " ".join(sentences[20:30]) + "\n")
  (tmp_path / "b.txt").write_text(" ".join(sentences[30:]) + "\n")
  seen = lambda batches: {int(sentence_of[t]) for b in batches for t in unmasked(b)[b["attention_mask"] == 1]
                          if sentence_of[t] >= 0}
  held = []
  for order in ("a.txt,b.txt", "b.txt,a.txt"):
    cfg = _text_cfg(",".join(f"{tmp_path}/{name}" for name in order.split(",")), root / "vocab.txt")
    with caplog.at_level("WARNING"):
      loader.check_data(cfg, eval_enabled=True)
    assert "held-out evaluation" not in caplog.text
    tok = load_tokenizer(cfg.vocab)
    batches = loader.make_eval_batches(cfg, tok, global_batch_size=4, num_batches=3)
    held.append(seen(batches))
    train = take(loader.make_pretrain_iterator(cfg, tok, global_batch_size=8, seed=0), 12)
    assert not seen(train) & held[-1]
    assert set(np.concatenate([b["next_sentence_labels"] for b in batches])) == {0, 1}
  assert held[0] == held[1] == {18, 19, 29, 39}  # the last tenth of each of the three documents


def test_a_held_out_split_that_cannot_make_nsp_pairs_is_warned_about(novel, caplog):
  root, _ = novel
  cfg = _text_cfg(root / "novel.txt", root / "vocab.txt")  # one document: one held-out tail
  with caplog.at_level("WARNING"):
    loader.check_data(cfg, eval_enabled=True)
  assert ("held-out evaluation: the held-out split of " in caplog.text and
          "holds 1 document(s): every random next segment (NotNext) comes from that same document, so its NSP "
          "accuracy means nothing" in caplog.text)
  caplog.clear()
  cfg.nsp = False
  with caplog.at_level("WARNING"):
    loader.check_data(cfg, eval_enabled=True)
  assert "held-out evaluation" not in caplog.text


def test_the_masking_cap_follows_the_rate_and_a_lower_one_is_refused(novel):
  cfg = data_config.default_pretrain_config()
  assert cfg.max_predictions_per_seq == 20
  cfg.masked_lm_prob = 0.3
  assert cfg.max_predictions_per_seq == 39  # MosaicBERT's 30% at 128 tokens
  cfg.max_seq_length = 512
  assert cfg.max_predictions_per_seq == 154
  root, _ = novel
  cfg = _text_cfg(root / "novel.txt", root / "vocab.txt", masked_lm_prob=0.3)  # the cap was set to 5 at 32 tokens
  with pytest.raises(ValueError, match=r"max_predictions_per_seq=5 caps masking below data.masked_lm_prob=0.3, "
                                       r"which selects 9 tokens of a full 32-token sequence"):
    loader.check_data(cfg, eval_enabled=False)
