"""Byte-level BPE (RoBERTa): ids equal transformers' RobertaTokenizer from the same folder, both folder formats."""
import json
import pickle
import shutil

import numpy as np
import pytest

import jbert
from jbert.tokenizer import ByteLevelBPETokenizer

from . import family_corpus


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
  """The folder transformers 5's RobertaTokenizer.save_pretrained writes (tokenizer.json, tokenizer_config.json);
  beside it, vocab_merges/ holds the vocab.json + merges.txt it was built from."""
  return family_corpus.train_bpe(tmp_path_factory.mktemp("bpe"))


def test_hub_folder_equals_transformers(hub):
  tok = jbert.load_tokenizer(hub)
  assert isinstance(tok, ByteLevelBPETokenizer) and tok.source.endswith("tokenizer.json")
  assert family_corpus.assert_matches_transformers(tok, hub, family_corpus.held_out()) > 400


def test_vocab_and_merges_alone_equal_transformers(hub, tmp_path):
  """The older Hub layout: vocab.json + merges.txt, no tokenizer.json and no tokenizer_config.json."""
  for name in ("vocab.json", "merges.txt"):
    shutil.copy(hub.parent / "vocab_merges" / name, tmp_path / name)
  tok = jbert.load_tokenizer(tmp_path)
  assert tok.source == str(tmp_path / "vocab.json") and not tok.do_lower_case
  assert family_corpus.assert_matches_transformers(tok, tmp_path, family_corpus.held_out(), "RobertaTokenizer") > 400


def test_mask_takes_the_space_before_it_where_the_folder_says(hub, tmp_path):
  """roberta-base's tokenizer.json gives <mask> lstrip: " <mask>" is one token, as the model was trained."""
  shutil.copytree(hub, tmp_path / "lstrip")
  data = json.loads((tmp_path / "lstrip" / "tokenizer.json").read_text())
  for token in data["added_tokens"]:
    token["lstrip"] = token["content"] == "<mask>"
  (tmp_path / "lstrip" / "tokenizer.json").write_text(json.dumps(data))
  plain, stripped = jbert.load_tokenizer(hub), jbert.load_tokenizer(tmp_path / "lstrip")
  head = plain.tokenize("The")  # one token on the novel; pieces on the generated text used where ../shared is absent
  assert plain.tokenize("The <mask> of France.")[:len(head) + 2] == [*head, "Ġ", "<mask>"]
  assert stripped.ids("The <mask> of France.")[:len(head) + 1] == [*plain.ids("The"), plain.mask_id]
  assert family_corpus.assert_matches_transformers(stripped, tmp_path / "lstrip", ["The <mask> of France."]) > 0


def test_save_writes_a_folder_transformers_and_jbert_read_back(hub, tmp_path):
  tok = jbert.load_tokenizer(hub)
  written = tok.save(tmp_path / "saved")
  assert sorted(p.rsplit("/", 1)[1] for p in written) == ["merges.txt", "special_tokens_map.json", "tokenizer.json",
                                                          "tokenizer_config.json", "vocab.json"]
  config = json.loads((tmp_path / "saved" / "tokenizer_config.json").read_text())
  assert config["tokenizer_class"] == "RobertaTokenizer" and config["add_prefix_space"] is False
  texts = family_corpus.held_out()
  again = jbert.load_tokenizer(tmp_path / "saved")
  assert again.batch_ids(texts) == tok.batch_ids(texts)
  assert family_corpus.assert_matches_transformers(again, tmp_path / "saved", texts[-30:]) > 0
  (tmp_path / "saved" / "tokenizer.json").unlink()  # its vocab.json + merges.txt alone give the same ids
  assert jbert.load_tokenizer(tmp_path / "saved").batch_ids(texts) == tok.batch_ids(texts)


def test_masks_and_layout(hub):
  tok = jbert.load_tokenizer(hub)
  pieces = tok.convert_ids_to_tokens(range(tok.vocab_size))
  assert np.flatnonzero(tok.special_mask).tolist() == [0, 1, 2, 3, 4]
  assert tok.continuation_mask.tolist() == [not p.startswith("Ġ") and i > 4 for i, p in enumerate(pieces)]
  assert tok.pair_separator_ids == (2, 2) and tok.second_type_id == 0 and tok.num_special_tokens(True) == 4
  enc = tok.encode("a b", "c", max_length=8, pad_to_max_length=True)
  ids_a, ids_b = tok.ids("a b"), tok.ids("c")
  assert enc["input_ids"] == [0, *ids_a, 2, 2, *ids_b, 2] + [1] * (4 - len(ids_a) - len(ids_b))
  assert enc["attention_mask"] == [1] * (4 + len(ids_a) + len(ids_b)) + [0] * (4 - len(ids_a) - len(ids_b))
  clone = pickle.loads(pickle.dumps(tok))  # data loader workers receive it pickled
  assert clone.batch_ids(["héllo wörld 😀"]) == tok.batch_ids(["héllo wörld 😀"])
  assert clone.batch_word_ids(["héllo"]) == tok.batch_word_ids(["héllo"]) != [tok.ids("héllo")]


def test_bad_folders_are_one_line_each(hub, tmp_path):
  shutil.copy(hub.parent / "vocab_merges" / "vocab.json", tmp_path / "vocab.json")
  with pytest.raises(FileNotFoundError, match="holds no tokenizer"):  # vocab.json is not BPE without merges.txt
    jbert.load_tokenizer(tmp_path)
  (tmp_path / "merges.txt").write_text("#version: 0.2\nĠ t h\n")
  with pytest.raises(ValueError, match="merges.txt: the merge 'Ġ t h' is not two pieces"):
    jbert.load_tokenizer(tmp_path)
  (tmp_path / "merges.txt").write_text("")
  (tmp_path / "vocab.json").write_text('["a", "b"]')
  with pytest.raises(ValueError, match="vocab.json is not a BPE vocabulary"):
    jbert.load_tokenizer(tmp_path)
  broken = tmp_path / "broken"
  broken.mkdir()
  (broken / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": {}}}')
  with pytest.raises(ValueError, match="tokenizer.json is not a tokenizer.json the tokenizers library can read"):
    jbert.load_tokenizer(broken)
  with pytest.raises(ValueError, match="do_lower_case=True but the byte-level BPE tokenizer .* does not lower-case"):
    jbert.load_tokenizer(hub, do_lower_case=True)
  (broken / "tokenizer.json").write_text((hub / "tokenizer.json").read_text())
  (broken / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "RobertaTokenizer",
                                                            "mask_token": "<MASK>"}))
  with pytest.raises(ValueError, match=r"lacks the special tokens \['<MASK>'\]"):
    jbert.load_tokenizer(broken)
