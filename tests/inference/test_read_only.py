"""Reading a training workdir never writes to it: `load_pretrained`, `jbert.predict`, embeddings, `jbert.convert`
and fine-tuning with `init_from` all work on a run nobody may write to (a shared or archived run, a read-only
mount), and leave it byte for byte (and timestamp for timestamp) as it was.

The tests run as root, which file permissions do not stop, so the workdir is made read-only AND every file and
folder under it is fingerprinted (content, size, modification time) before and after: a file created and removed
again (the old write probe of every Checkpointer) still changes its folder's modification time.
"""
import csv
import hashlib
import importlib
import json
import os
import stat

from absl import flags
import numpy as np

import jbert
from jbert.inference.embedding import embed
from jbert.train import trainer as train
from tasks import finetune_data as fd

STEPS = {"total_steps": 2, "log_every_steps": 2, "checkpoint_every_steps": 0, "async_checkpointing": False}


def _fingerprint(root):
  out = {}
  for folder, dirs, names in os.walk(root):
    for name in sorted(dirs + names):
      path = os.path.join(folder, name)
      info = os.lstat(path)
      digest = hashlib.sha256(open(path, "rb").read()).hexdigest() if stat.S_ISREG(info.st_mode) else None
      out[os.path.relpath(path, root)] = (info.st_mode, info.st_size, info.st_mtime_ns, digest)
  out["."] = os.lstat(root).st_mtime_ns
  return out


def _chmod_tree(root, writable):
  for folder, dirs, names in os.walk(root):
    for path in [folder] + [os.path.join(folder, n) for n in dirs + names]:
      mode = os.lstat(path).st_mode
      os.chmod(path, mode | stat.S_IWUSR if writable else mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def _predict(*args) -> int:
  command = importlib.import_module("jbert.predict")
  flags.FLAGS.unparse_flags()
  try:
    command.main(flags.FLAGS(["jbert.predict", *map(str, args)]))
    return 0
  except SystemExit as e:
    return e.code
  finally:
    flags.FLAGS.unparse_flags()


def test_a_read_only_workdir_is_read_and_left_untouched(tmp_path):
  init = fd.tiny_checkpoint(tmp_path / "init")
  overrides = fd.local_overrides(tmp_path / "data", n_train=64, n_eval=8)
  workdir = tmp_path / "run"
  train.train_and_evaluate(fd.finetune_config("local", init_from=str(init), **STEPS, **overrides), str(workdir))
  with open(workdir / "predictions" / "validation.tsv", encoding="utf-8", newline="") as f:
    want = [row["prediction"] for row in csv.DictReader(f, delimiter="\t")]
  before = _fingerprint(workdir)
  _chmod_tree(workdir, writable=False)
  try:
    config, params = jbert.load_pretrained(workdir, jbert.BertForSequenceClassification)
    from jbert.inference import folder  # pylint: disable=import-outside-toplevel
    resolved = folder.resolve(workdir)
    assert (resolved.info.kind, resolved.info.head.cls, resolved.step) == (
        "workdir", jbert.BertForSequenceClassification, 2)
    assert resolved.checkpoint_dir == str(workdir / "checkpoints") and resolved.run_config["task"]["text_b"] == "b"
    assert resolved.tokenizer == str(workdir / "tokenizer" / "vocab.txt")
    assert config.hidden_size == 64 and params["classifier"]["kernel"].shape == (64, 2)

    out = tmp_path / "out.jsonl"
    assert _predict(f"--model={workdir}", f"--input={overrides['task.eval_file']}", f"--output={out}") == 0
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [p["label"] for p in got] == want  # The run's own predictions, from its own (read-only) checkpoint.

    vectors = embed(["w0 w10 w11", "w1 w12"], str(workdir), pooling="mean")
    assert vectors.shape == (2, 64) and np.all(np.isfinite(vectors))

    from jbert import convert  # pylint: disable=import-outside-toplevel
    assert convert.main([str(workdir), str(tmp_path / "converted")]) == 0
    _, converted = jbert.load_pretrained(tmp_path / "converted", jbert.BertForSequenceClassification)
    np.testing.assert_array_equal(converted["classifier"]["kernel"], params["classifier"]["kernel"])

    again = tmp_path / "again"
    train.train_and_evaluate(fd.finetune_config("local", init_from=str(workdir), **STEPS, **overrides), str(again))
    assert json.loads((again / "results.json").read_text())["metrics"]
  finally:
    _chmod_tree(workdir, writable=True)
  assert _fingerprint(workdir) == before
