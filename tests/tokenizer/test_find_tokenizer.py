"""`find_tokenizer`: the tokenizer of a model directory, a TF1 checkpoint or a training workdir."""
import pytest

from jbert import tokenizer

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _vocab(directory, words=("hello",)):
  directory.mkdir(parents=True, exist_ok=True)
  (directory / "vocab.txt").write_text("\n".join([*SPECIALS, *words]) + "\n", encoding="utf-8")
  return str(directory / "vocab.txt")


def test_model_directory_and_file(tmp_path):
  vocab = _vocab(tmp_path / "hf")
  (tmp_path / "hf" / "config.json").write_text("{}")
  assert tokenizer.find_tokenizer(tmp_path / "hf") == vocab
  assert tokenizer.find_tokenizer(vocab) == vocab
  assert tokenizer.find_tokenizer(tmp_path / "hf" / "config.json") == vocab  # a file inside the directory


def test_tf1_checkpoint_prefix(tmp_path):
  vocab = _vocab(tmp_path / "uncased_L-2_H-128_A-2")
  (tmp_path / "uncased_L-2_H-128_A-2" / "bert_config.json").write_text("{}")
  (tmp_path / "uncased_L-2_H-128_A-2" / "bert_model.ckpt.index").write_bytes(b"")
  assert tokenizer.find_tokenizer(tmp_path / "uncased_L-2_H-128_A-2" / "bert_model.ckpt") == vocab


def test_training_workdir_and_its_checkpoints_directory(tmp_path):
  workdir = tmp_path / "run"
  (workdir / "checkpoints" / "600").mkdir(parents=True)
  vocab = _vocab(workdir / tokenizer.RUN_TOKENIZER_DIR)
  assert tokenizer.find_tokenizer(workdir) == vocab
  assert tokenizer.find_tokenizer(workdir / "checkpoints") == vocab
  assert tokenizer.load_tokenizer(workdir).convert_tokens_to_ids(["hello"]) == [5]


def test_nothing_found_is_none(tmp_path):
  (tmp_path / "config.json").write_text("{}")
  assert tokenizer.find_tokenizer(tmp_path) is None
  assert tokenizer.find_tokenizer(tmp_path / "missing" / "deeper") is None
  (tmp_path / "tokenizer.json").write_text('{"model": {"type": "WordLevel"}}')  # a model no kind reads
  assert tokenizer.find_tokenizer(tmp_path) is None


def test_sentencepiece_and_ambiguous_directories(tmp_path):
  (tmp_path / "spm.model").write_bytes(b"")
  assert tokenizer.find_tokenizer(tmp_path) == str(tmp_path / "spm.model")
  (tmp_path / "other.model").write_bytes(b"")
  with pytest.raises(ValueError, match=r"several tokenizers \['other.model', 'spm.model'\]"):
    tokenizer.find_tokenizer(tmp_path)
