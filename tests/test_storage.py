"""gs:// in an install without TensorFlow, against a GCS emulator (tests/gcs_emulator.py): run.py trains,
checkpoints, is killed and resumes in the bucket; the emulator setting reaches every storage client; a missing
package is one line."""
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

import gcs_emulator
from gcs_emulator import gcs, gcs_bucket  # noqa: F401  pylint: disable=unused-import  (fixtures)
from jbert.runtime import storage
from test_resume import REPO, TOTAL, command, reference_losses


def bucket_losses(gcs, workdir):
  records = [json.loads(line) for line in gcs.read(f"{workdir}/metrics.jsonl").decode().splitlines()]
  steps = [r["step"] for r in records if "train/loss" in r]
  assert steps == sorted(set(steps)), "a step was logged twice"
  return {r["step"]: r["train/loss"] for r in records if "train/loss" in r}


def committed_steps(gcs, workdir):
  return sorted(int(name.split("/")[0]) for name in gcs.objects(f"{workdir}/checkpoints")
                if re.fullmatch(r"\d+/commit_success\.txt", name))


def test_tensorflow_is_hidden_from_the_commands(gcs):
  probe = "import importlib.util, sys; print(importlib.util.find_spec('tensorflow')); import tensorflow"
  result = subprocess.run([sys.executable, "-c", probe], env=gcs.environ(hide_tensorflow=True), capture_output=True,
                          text=True, timeout=60)
  assert result.returncode == 1 and result.stdout == "None\n" and "ModuleNotFoundError" in result.stderr


def test_run_py_on_a_bucket_trains_is_killed_and_resumes_there_without_tensorflow(gcs, tmp_path_factory):
  """docs/tpu.md's gs:// command, TensorFlow absent: every file of the run is in the bucket (checkpoints through
  tensorstore, the rest through gcsfs, TensorBoard through google-cloud-storage, the compile cache too); kill -9
  after a checkpoint, and the same command restores that step and logs the uninterrupted run's losses."""
  reference = reference_losses(tmp_path_factory)
  workdir = f"gs://{gcs.create_bucket()}/run"
  cmd = [*command(workdir), f"--compile_cache=gs://{workdir.split('/')[2]}/xla"]
  env = gcs.environ(hide_tensorflow=True, JBERT_TRACEBACK="1")
  proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  start = time.time()
  while not committed_steps(gcs, workdir):
    assert proc.poll() is None, f"the run ended before its first checkpoint: {proc.stderr.read()[-3000:]}"
    assert time.time() - start < 300, "no checkpoint reached the bucket"
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  assert proc.wait() == -signal.SIGKILL
  proc.stderr.close()
  killed_at = committed_steps(gcs, workdir)[-1]
  assert 4 <= killed_at < TOTAL

  resumed = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  restored = re.search(r"state: resumed from checkpoint step (\d+)", resumed.stderr)
  assert restored and int(restored.group(1)) == killed_at, resumed.stderr[-3000:]
  # The killed run's lease is still in the bucket, unreleased: read, named, and taken over.
  assert re.search(r"\.jbert\.lock was renewed \d+ s ago by another run \(pid \d+", resumed.stderr)
  assert bucket_losses(gcs, workdir) == reference
  # The first run compiled into the bucket; the resumed one loaded its programs from there.
  compiled = re.search(r"\((\d+) XLA programs? in [\d.]+ s, (\d+) of them from the compile cache\)", resumed.stderr)
  assert compiled and compiled.group(1) == compiled.group(2), resumed.stderr[-3000:]
  files = gcs.objects(workdir)
  assert {"config.json", "history.jsonl", "metrics.jsonl", ".jbert.lock", "tokenizer/vocab.txt"} <= set(files)
  assert committed_steps(gcs, workdir)[-1] == TOTAL
  assert any(name.startswith("tensorboard/events.out.tfevents") and size > 0 for name, size in files.items())
  history = [json.loads(line) for line in gcs.read(f"{workdir}/history.jsonl").decode().splitlines()]
  assert [(h["event"], h["step"]) for h in history] == [("start", 0), ("resume", int(restored.group(1)))]
  assert json.loads(gcs.read(f"{workdir}/.jbert.lock"))["released"]


# ----------------------------------------------------------------------------------------------------------
# The emulator setting, and a missing package.
# ----------------------------------------------------------------------------------------------------------


def test_the_emulator_setting_reaches_every_client_and_the_users_own_settings_stay():
  environ = {"STORAGE_EMULATOR_HOST": "127.0.0.1:4443", "EPATH_USE_TF": "true"}
  added = storage.configure(environ)
  assert environ == {"STORAGE_EMULATOR_HOST": "127.0.0.1:4443", "EPATH_USE_TF": "true",
                     "TENSORSTORE_GCS_HTTP_URL": "http://127.0.0.1:4443", "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
                     "FSSPEC_GS_TOKEN": "anon", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false", "NO_GCE_CHECK": "true",
                     "CLOUD_STORAGE_EMULATOR_ENDPOINT": "http://127.0.0.1:4443"}
  assert "EPATH_USE_TF" not in added and added["TENSORSTORE_GCS_HTTP_URL"] == "http://127.0.0.1:4443"
  for unset in ({}, {"STORAGE_EMULATOR_HOST": ""}, {"STORAGE_EMULATOR_HOST": "default"}):
    assert storage.configure(unset) == {} and unset in ({}, {"STORAGE_EMULATOR_HOST": ""},
                                                        {"STORAGE_EMULATOR_HOST": "default"})


def test_config_paths_in_a_bucket_are_found_and_named():
  import ml_collections  # pylint: disable=import-outside-toplevel
  config = ml_collections.ConfigDict({"init_from": "gs://b/run", "data": {"vocab": "/local/vocab.txt",
                                                                          "files": "a.txt,gs://b/c.txt"}})
  assert sorted(storage.remote_values(config)) == [("data.files", "gs://b/c.txt"), ("init_from", "gs://b/run")]


def test_run_py_names_a_missing_gcsfs_in_one_line_before_anything_starts(tmp_path):
  env = {**gcs_emulator.Emulator.environ(None, hide_tensorflow=True), gcs_emulator.HIDE_ENV: "tensorflow,gcsfs"}
  env.pop("STORAGE_EMULATOR_HOST")
  result = subprocess.run([sys.executable, "run.py", "--config=configs/tiny.py", "--workdir=gs://bucket/run"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
  assert result.returncode == 2 and result.stdout == ""
  assert result.stderr == ("run.py: --workdir=gs://bucket/run needs gcsfs to open gs:// paths, and it is not "
                           "installed: pip install gcsfs (jbert's own install, `pip install -e .`, brings it).\n")


# ----------------------------------------------------------------------------------------------------------
# Fine-tuning and inference with every path in the bucket (this process, pointed at the emulator).
# ----------------------------------------------------------------------------------------------------------


def test_fine_tuning_and_prediction_with_every_path_in_a_bucket(gcs, gcs_bucket, tmp_path, monkeypatch):
  """init_from, data.vocab and the workdir in the bucket; checkpoints, best/, export/, predictions and
  results.json land there; the export, read back from the bucket, predicts what the run predicted."""
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import jbert  # pylint: disable=import-outside-toplevel
  from jbert.inference import prediction  # pylint: disable=import-outside-toplevel
  from jbert.runtime import mirror  # pylint: disable=import-outside-toplevel
  from jbert.train import best as best_lib  # pylint: disable=import-outside-toplevel
  from jbert.train import trainer as train  # pylint: disable=import-outside-toplevel
  from tests.tasks import finetune_data as fd  # pylint: disable=import-outside-toplevel
  monkeypatch.setenv(mirror.CACHE_ENV, str(tmp_path / "cache"))
  checkpoint = fd.tiny_checkpoint(tmp_path / "ckpt")
  mirror.upload(str(checkpoint), f"{gcs_bucket}/ckpt")
  mirror.upload(str(checkpoint / "vocab.txt"), f"{gcs_bucket}/vocab.txt")
  workdir = f"{gcs_bucket}/run"
  config = fd.finetune_config("local", init_from=f"{gcs_bucket}/ckpt", eval_every_steps=2, log_every_steps=2,
                              checkpoint_every_steps=2, total_steps=4, keep_best="accuracy",
                              **{"data.vocab": f"{gcs_bucket}/vocab.txt"},
                              **fd.local_overrides(tmp_path / "data", n_train=64, n_eval=16))
  train.train_and_evaluate(config, workdir)

  files = gcs.objects(workdir)
  assert {"results.json", "config.json", "metrics.jsonl", "best/best.json", "export/config.json",
          "export/model.safetensors", "export/vocab.txt", "checkpoints/4/commit_success.txt"} <= set(files)
  assert not [name for name in files if ".tmp" in name]  # no staging folder left behind
  results = json.loads(gcs.read(f"{workdir}/results.json"))
  assert results["export"] == f"{workdir}/export" and results["init_from"] == f"{gcs_bucket}/ckpt"
  record = json.loads(gcs.read(f"{workdir}/best/best.json"))
  assert record == results["best"] and record["step"] in (2, 4)
  prediction_file = next(name for name in results["files"] if "validation" in name)
  assert prediction_file.startswith(f"{workdir}/")
  written = gcs.read(prediction_file).decode().splitlines()

  # The export, read from the bucket, has the best step's parameters and predicts the same labels.
  _, exported = jbert.load_pretrained(f"{workdir}/export", jbert.BertForSequenceClassification)
  _, kept = jbert.load_pretrained(f"{workdir}/best", jbert.BertForSequenceClassification)
  for a, b in zip(jax.tree.leaves(exported), jax.tree.leaves(kept), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # The workdir itself, read where it is (Orbax): its newest checkpoint, with the head the run recorded.
  assert jbert.describe(workdir).kind == "workdir"
  _, latest = jbert.load_pretrained(workdir, jbert.BertForSequenceClassification)
  assert jax.tree.structure(latest) == jax.tree.structure(exported)
  if record["step"] == 4:
    for a, b in zip(jax.tree.leaves(latest), jax.tree.leaves(exported), strict=True):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  predictor = prediction.Predictor(f"{workdir}/export")
  rows = list(predictor(predictor.read(str(tmp_path / "data" / "dev.csv"))))
  header, *lines = [line.split("\t") for line in written]
  assert len(rows) == len(lines) == 16
  for row, line in zip(rows, lines):
    assert row["label"] == line[header.index("prediction")]
    assert abs(row["probabilities"]["yes"] - float(line[header.index("p_yes")])) < 1e-5

  # A kill while best/ was being replaced: best/ lacks its record, best.tmp/ is whole; the next start mends it.
  mirror.copy_folder(f"{workdir}/best", f"{workdir}/best.tmp")
  epath_record = f"{workdir}/best/best.json"
  mirror.remove(epath_record)
  keeper = best_lib.BestKeeper.from_config(config, workdir)
  assert (keeper.value, keeper.step) == (record["value"], record["step"])
  keeper.recover()
  assert json.loads(gcs.read(epath_record)) == record
  assert not [name for name in gcs.objects(workdir) if name.startswith("best.tmp")]


def test_embeddings_of_a_model_in_a_bucket_written_to_the_bucket(gcs, gcs_bucket, tmp_path, monkeypatch):
  """`--model=gs://...` (downloaded once into the cache) embeds as the local folder does; jbert.convert reads
  from and writes to the bucket; `--output=gs://...` appears whole or not at all, and a bucket that cannot be
  written is named before any work."""
  import io as std_io  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import jbert  # pylint: disable=import-outside-toplevel
  from jbert.inference import io  # pylint: disable=import-outside-toplevel
  from jbert.runtime import atomic, mirror  # pylint: disable=import-outside-toplevel
  from tests.tasks import finetune_data as fd  # pylint: disable=import-outside-toplevel
  monkeypatch.setenv(mirror.CACHE_ENV, str(tmp_path / "cache"))
  checkpoint = fd.tiny_checkpoint(tmp_path / "ckpt")
  mirror.upload(str(checkpoint), f"{gcs_bucket}/model")
  texts = ["w1 w2 w3", "w4 w5", "w6"]
  local = np.asarray(jbert.embed(texts, str(checkpoint), pooling="mean"))
  remote = np.asarray(jbert.embed(texts, f"{gcs_bucket}/model", pooling="mean"))
  assert local.shape == (3, 64)
  np.testing.assert_array_equal(remote, local)
  cached = tmp_path / "cache" / gcs_bucket.removeprefix("gs://") / "model"
  assert sorted(p.name for p in cached.iterdir() if not p.name.startswith(".")) == sorted(
      p.name for p in checkpoint.iterdir())

  # jbert.convert from the bucket to the bucket: a jbert model folder there, which reads back the same weights.
  from jbert import convert  # pylint: disable=import-outside-toplevel
  assert convert.main([f"{gcs_bucket}/model", f"{gcs_bucket}/converted", "--to=jbert"]) == 0
  assert {"config.json", "vocab.txt"} <= set(gcs.objects(f"{gcs_bucket}/converted"))
  _, original = jbert.load_pretrained(str(checkpoint))
  _, converted = jbert.load_pretrained(f"{gcs_bucket}/converted")
  for a, b in zip(jax.tree.leaves(original), jax.tree.leaves(converted), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

  output = f"{gcs_bucket}/out/embeddings.npy"
  io.check_writable(output)
  with io.NpyWriter(output) as writer:
    writer.write(remote[:2])
    writer.write(remote[2:])
  np.testing.assert_array_equal(np.load(std_io.BytesIO(gcs.read(output))), remote)
  with pytest.raises(KeyboardInterrupt):  # interrupted mid-write: the earlier object stays as it was
    with io.NpyWriter(output) as writer:
      writer.write(remote[:1])
      raise KeyboardInterrupt
  np.testing.assert_array_equal(np.load(std_io.BytesIO(gcs.read(output))), remote)
  with pytest.raises(RuntimeError), atomic.open_for_write(f"{gcs_bucket}/out/results.json") as f:
    f.write("{half")
    raise RuntimeError("failed while writing")
  assert set(gcs.objects(f"{gcs_bucket}/out")) == {"embeddings.npy"}
  with pytest.raises(io.OutputError, match=r"^--output=gs://no-such-bucket-jbert/x.npy cannot be written: .*check "
                     "the bucket's name"):
    io.check_writable("gs://no-such-bucket-jbert/x.npy")


def test_a_workdir_in_a_missing_bucket_is_one_line(gcs_bucket):
  from jbert.checkpoint import lock  # pylint: disable=import-outside-toplevel
  with pytest.raises(OSError, match=r"^cannot write gs://jbert-no-such-bucket/run/\.jbert\.lock: the bucket "
                     r"jbert-no-such-bucket does not exist \(or this machine may not write it\): create it \(gcloud "
                     r"storage buckets create gs://jbert-no-such-bucket\) or check its name, or choose another "
                     r"--workdir\.$"):
    lock.acquire("gs://jbert-no-such-bucket/run")


def test_the_cache_of_a_bucket_folder_fetches_only_what_changed(gcs_bucket, tmp_path, monkeypatch):
  from jbert.runtime import mirror  # pylint: disable=import-outside-toplevel
  monkeypatch.setenv(mirror.CACHE_ENV, str(tmp_path / "cache"))
  source = tmp_path / "model"
  (source / "sub").mkdir(parents=True)
  (source / "config.json").write_text("{}")
  (source / "sub" / "weights.bin").write_bytes(b"v1")
  mirror.upload(str(source), f"{gcs_bucket}/model")
  fetched = []
  copy = mirror._copy  # pylint: disable=protected-access
  monkeypatch.setattr(mirror, "_copy", lambda src, dst: (fetched.append(os.fspath(dst)), copy(src, dst)))
  local = mirror.download(f"{gcs_bucket}/model")
  assert local == str(tmp_path / "cache" / gcs_bucket.removeprefix("gs://") / "model") and len(fetched) == 2
  fetched.clear()
  assert mirror.download(f"{gcs_bucket}/model") == local and fetched == []  # unchanged: nothing fetched
  (source / "sub" / "weights.bin").write_bytes(b"version 2")
  (source / "config.json").unlink()
  mirror.upload(str(source), f"{gcs_bucket}/model", replace=True)
  fetched.clear()
  mirror.download(f"{gcs_bucket}/model")
  assert fetched == [os.path.join(local, "sub", "weights.bin")]
  assert (pathlib.Path(local) / "sub" / "weights.bin").read_bytes() == b"version 2"
  assert not (pathlib.Path(local) / "config.json").exists()  # gone from the bucket, gone from the copy


# ----------------------------------------------------------------------------------------------------------
# A prepared corpus in the bucket: written by `python -m jbert.data prepare`, trained on by run.py.
# ----------------------------------------------------------------------------------------------------------


def test_a_corpus_prepared_into_a_bucket_trains_there_without_tensorflow(gcs, gcs_bucket, tmp_path):
  """docs/pretraining.md's pod route on the emulator: prepare writes its ArrayRecord shards and manifest to gs://
  (through ArrayRecord's own GCS client), and run.py reads the same documents from there."""
  from jbert.data import prepare, prepared  # pylint: disable=import-outside-toplevel
  text = "\n\n".join(" ".join(f"Story {d} goes on with part {s} of its tale." for s in range(1 + d % 4))
                       for d in range(40))
  (tmp_path / "stories.txt").write_text(text)
  vocab = sorted({w.lower() for w in text.replace(".", " .").split()} | {str(i) for i in range(40)})
  (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *vocab]) + "\n")
  bucket = gcs_bucket.removeprefix("gs://")
  env = gcs.environ(hide_tensorflow=True, JBERT_TRACEBACK="1")
  made = subprocess.run([sys.executable, "-m", "jbert.data", "prepare", f"--input={tmp_path / 'stories.txt'}",
                         f"--output=gs://{bucket}/corpus", f"--vocab={tmp_path / 'vocab.txt'}", "--eval_documents=4"],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert made.returncode == 0, made.stderr[-3000:]
  assert "AdaptiveReadaheadCache" not in made.stderr  # gcsfs's INFO line per opened file stays off the console
  assert {"manifest.json", "vocab.txt"} <= {name.split("/")[-1] for name in gcs.objects(f"gs://{bucket}/corpus")}
  local = tmp_path / "local"
  prepare.prepare(prepare.Options(inputs=str(tmp_path / "stories.txt"), output=str(local), workers=1,
                                  eval_documents=4, vocab=str(tmp_path / "vocab.txt")), log=lambda line: None)
  assert gcs.read(f"gs://{bucket}/corpus/manifest.json") == (local / "manifest.json").read_bytes()

  trained = subprocess.run(
      [sys.executable, "run.py", "--config=configs/tiny.py", f"--workdir=gs://{bucket}/run",
       "--config.data.source=prepared", f"--config.data.prepared=gs://{bucket}/corpus", "--config.total_steps=2",
       "--config.eval_every_steps=2", "--config.eval_batches=1", "--config.batch_size=8",
       "--config.data.max_seq_length=32", "--config.data.max_predictions_per_seq=5"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert trained.returncode == 0, trained.stderr[-3000:]
  assert f"corpus: prepared corpus gs://{bucket}/corpus: 40 documents" in trained.stderr
  assert sorted(bucket_losses(gcs, f"gs://{bucket}/run")) == [2]
  assert committed_steps(gcs, f"gs://{bucket}/run") == [2]
  for split, count in (("train", 36), ("eval", 4)):  # this process reads the bucket's shards as the local ones
    remote, here = prepared.PreparedDocuments(f"{gcs_bucket}/corpus", split), prepared.PreparedDocuments(str(local), split)
    assert len(remote) == len(here) == count
    assert [remote[i] for i in range(count)] == [here[i] for i in range(count)]
