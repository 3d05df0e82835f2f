r"""Convert BERT checkpoints: `python -m jbert.convert SRC DST [--model=pretraining] [--to=jbert|hf]`.

SRC: a Hugging Face dir, an original TF1 checkpoint (dir or `.../bert_model.ckpt`), a jbert model dir or a jbert
training workdir. DST: a jbert model dir (default for HF/TF1 sources) or a Hugging Face dir (default for jbert
sources). `--model` defaults to the class recorded in SRC's config.json (`architectures`), else pretraining.

A sentence-transformers SRC (modules.json) converts its Transformer module and keeps its Pooling, Normalize and
maximum length (modules.json, 1_Pooling/, sentence_bert_config.json) in DST, as a Hugging Face dir by default, so
that DST embeds as SRC does with jbert.embed and with sentence-transformers, without further flags.

SRC's tokenizer (`jbert.tokenizer.find_tokenizer`: vocab.txt, a WordPiece tokenizer.json, a SentencePiece
.model, or a training run's copy) goes into DST too: vocab.txt with transformers' tokenizer_config.json and
special_tokens_map.json, or the .model, so DST alone can be loaded, fine-tuned from and served.
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import sys
import tempfile
from typing import Sequence

def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("src")
  parser.add_argument("dst")
  from jbert.model import registry  # pylint: disable=g-import-not-at-top  (the one list of heads)
  parser.add_argument("--model", choices=sorted(registry.keys()), default=None,
                      help="BERT class to convert as; default: SRC's recorded class, else pretraining")
  parser.add_argument("--to", choices=("jbert", "hf"), default=None,
                      help="output format; default: hf for jbert sources and sentence-transformers folders, "
                           "jbert otherwise")
  parser.add_argument("--num_labels", type=int, default=None, help="task heads: number of labels")
  args = parser.parse_args(argv)

  from jbert import errors  # pylint: disable=g-import-not-at-top  (keeps --help instant)
  from jbert.inference import cli  # pylint: disable=g-import-not-at-top
  try:
    return _convert(args)
  except cli.USER_ERRORS + (ImportError,) as e:
    if errors.show_traceback():
      raise
    print(f"jbert.convert: {errors.one_line(e)}", file=sys.stderr)
    return errors.EXIT_STATUS


def _convert(args: argparse.Namespace) -> int:
  """The conversion; user errors are raised (FileNotFoundError, ValueError, io.OutputError) before DST exists."""
  from jbert.runtime import mirror, storage  # pylint: disable=g-import-not-at-top
  from jbert.weights import remote  # pylint: disable=g-import-not-at-top
  storage.require([args.src], "SRC")
  storage.require([args.dst], "DST")
  # A gs:// DST is converted into a local folder, then uploaded file by file (each object whole).
  local_root = tempfile.mkdtemp(prefix="jbert-convert-") if storage.is_remote(args.dst) else None
  dst = os.path.join(local_root, "model") if local_root else os.path.abspath(args.dst)
  if local_root is None:
    _check_destination(dst)
  try:
    args = argparse.Namespace(**{**vars(args), "src": remote.local_model(args.src)})  # a gs:// model: a local copy
    _write(args, dst)
    if local_root:
      mirror.upload(dst, args.dst)
  finally:
    if local_root:
      shutil.rmtree(local_root, ignore_errors=True)
  return 0


def _write(args: argparse.Namespace, dst: str) -> None:
  """Reads SRC (local, or a gs:// training workdir) and writes the model into the local folder `dst`."""
  import jbert  # pylint: disable=g-import-not-at-top
  from jbert import tokenizer, weights  # pylint: disable=g-import-not-at-top
  from jbert.checkpoint import reading  # pylint: disable=g-import-not-at-top
  from jbert.model import registry  # pylint: disable=g-import-not-at-top
  from jbert.runtime import storage  # pylint: disable=g-import-not-at-top
  from jbert.weights import jbert_dir  # pylint: disable=g-import-not-at-top
  from jbert.weights import st_folder  # pylint: disable=g-import-not-at-top
  sentence_transformer = st_folder.is_sentence_transformer(args.src)
  src_is_jbert = jbert_dir.is_jbert_dir(args.src) or reading.find_checkpoint_dir(args.src) is not None
  # sentence-transformers reads only a Hugging Face transformer: its folders stay readable by it.
  to = args.to or ("hf" if src_is_jbert or sentence_transformer else "jbert")
  src = st_folder.transformer_folder(args.src) if sentence_transformer else args.src
  info = weights.describe(src)
  model_cls = registry.by_key(args.model).cls if args.model else (
      info.head.cls if info.head else jbert.BertModel if sentence_transformer else jbert.BertForPreTraining)
  config, params = jbert.load_pretrained(src, model_cls, num_labels=args.num_labels)
  keep_names = info.label_names if args.num_labels in (None, info.num_labels) else None
  # The kind of task that trained it stays with the same head and labels (what `jbert.predict` looks up).
  same_model = info.head is not None and model_cls is info.head.cls and args.num_labels in (None, info.num_labels)
  found = tokenizer.find_tokenizer(src) or tokenizer.find_tokenizer(args.src)
  # Written to a folder beside DST and moved in when complete: a failure (a full disk) leaves no half model.
  staging = os.path.join(os.path.dirname(dst), f".{os.path.basename(dst)}.{os.getpid()}.tmp")
  try:
    jbert.save_pretrained(config, params, staging, model_cls, format=to, label_names=keep_names,
                          task=info.task if same_model else None)
    if found is not None:
      tokenizer.load_tokenizer(found).save(staging)
    if sentence_transformer:
      st_folder.copy_modules(args.src, staging)
    _readable_by_all(glob.glob(os.path.join(staging, "*.safetensors")))
    _move_into(staging, dst)
  except OSError as e:
    from jbert.inference import io  # pylint: disable=g-import-not-at-top
    raise io.OutputError(f"Writing {dst} failed: {e.strerror or e}; free space or choose another DST (nothing was "
                         "written there).") from e
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  shown = args.dst if storage.is_remote(args.dst) else dst
  print(f"wrote {model_cls.__name__} ({config.num_hidden_layers} layers, hidden {config.hidden_size}, "
        f"{_count(params):,} parameters) as {to} to {shown}: {', '.join(sorted(os.listdir(dst)))}")
  if found is None:
    print(f"jbert.convert: {args.src} has no tokenizer (vocab.txt, tokenizer.json or *.model), so {shown} has "
          "none; copy the one the model was trained with there.", file=sys.stderr)


def _check_destination(dst: str) -> None:
  """DST can be written: not a file, and its nearest existing folder writable. Checked before SRC is read."""
  from jbert.inference import io  # pylint: disable=g-import-not-at-top
  if os.path.exists(dst) and not os.path.isdir(dst):
    raise io.OutputError(f"DST {dst} is a file; name a folder (new or existing) for the converted model.")
  folder = dst
  while not os.path.exists(folder):
    folder = os.path.dirname(folder)
  if not os.path.isdir(folder):
    raise io.OutputError(f"DST {dst} cannot be written: {folder} is a file, not a folder; choose another DST.")
  if not os.access(folder, os.W_OK | os.X_OK):
    raise io.OutputError(f"DST {dst} cannot be written: {folder} is read-only for this user; choose another DST.")


def _move_into(staging: str, dst: str) -> None:
  """The staged files into `dst`: renamed as a whole where `dst` is new, else entry by entry over its own."""
  if not os.path.exists(dst):
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    os.rename(staging, dst)
    return
  for name in os.listdir(staging):
    target = os.path.join(dst, name)
    if os.path.isdir(target) and not os.path.islink(target):
      shutil.rmtree(target)
    os.replace(os.path.join(staging, name), target)


def _readable_by_all(paths: Sequence[str]) -> None:
  """Gives `paths` the mode a new file gets under the umask (usually 0644): safetensors writes its files 0600,
  which keeps other users and containers from reading a model that is meant to be shared."""
  umask = os.umask(0)
  os.umask(umask)
  for path in paths:
    os.chmod(path, 0o666 & ~umask)


def _count(params) -> int:
  import jax  # pylint: disable=g-import-not-at-top
  return sum(int(x.size) for x in jax.tree.leaves(params))


if __name__ == "__main__":
  sys.exit(main())
