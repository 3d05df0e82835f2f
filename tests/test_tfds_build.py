"""`python -m jbert.tfds_build`: TFDS's real GLUE builder prepares ArrayRecord files with neither Apache Beam nor
TensorFlow (a plain install), into a bucket; the fine-tuning datasets read them back from there."""
import subprocess
import sys

import pytest

from jbert import errors
from jbert import tfds_build
from jbert.tasks import TASKS
from jbert.runtime import mirror
from gcs_emulator import gcs, gcs_bucket  # noqa: F401  pylint: disable=unused-import  (fixtures)
from test_resume import REPO

TRAIN = [("a great film", 1), ("awful acting", 0), ("fine fun", 1)]
VALIDATION = [("good", 1), ("bad", 0)]
TEST = ["some test", "another"]

# GLUE's archive, as TFDS's download manager would have extracted it: no network in tests, so the check that some
# download host answers (which this fake makes moot) is skipped too.
FAKE_DOWNLOAD = """import os
from tensorflow_datasets.core.download import download_manager
import __main__ as command  # jbert.tfds_build, run by `python -m`
download_manager.DownloadManager.download_and_extract = lambda self, url: os.environ["FAKE_GLUE_DIR"]
command._some_host_answers = lambda name, found: None
"""


@pytest.fixture
def glue_download(tmp_path):
  folder = tmp_path / "glue" / "SST-2"
  folder.mkdir(parents=True)
  (folder / "train.tsv").write_text("sentence\tlabel\n" + "".join(f"{s} \t{l}\n" for s, l in TRAIN))
  (folder / "dev.tsv").write_text("sentence\tlabel\n" + "".join(f"{s} \t{l}\n" for s, l in VALIDATION))
  (folder / "test.tsv").write_text("index\tsentence\n" + "".join(f"{i}\t{s}\n" for i, s in enumerate(TEST)))
  (tmp_path / "fake_glue_download.py").write_text(FAKE_DOWNLOAD)
  return tmp_path


def test_glue_prepares_into_a_bucket_without_beam_or_tensorflow_and_tasks_read_it(gcs, gcs_bucket, glue_download,
                                                                                   tmp_path, monkeypatch):
  data_dir = f"{gcs_bucket}/tfds"
  env = gcs.environ(hide_tensorflow=True, FAKE_GLUE_DIR=str(glue_download / "glue"))
  env["PYTHONPATH"] += f":{glue_download}"
  result = subprocess.run([sys.executable, "-m", "jbert.tfds_build", "glue/sst2", f"--data_dir={data_dir}",
                           "--imports=fake_glue_download"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"glue/sst2: test 2, train 3, validation 2 examples in {data_dir}/glue/sst2/" in result.stdout
  files = gcs.objects(data_dir)
  version = next(name.split("/")[2] for name in files if name.endswith("dataset_info.json"))
  assert {f"glue/sst2/{version}/glue-{split}.array_record-00000-of-00001"
          for split in ("train", "validation", "test")} <= set(files)

  # ArrayRecord opens local files only: the task reads a local copy of that dataset's folder.
  monkeypatch.setenv(mirror.CACHE_ENV, str(tmp_path / "cache"))
  local = mirror.local_tfds_dir(data_dir, "glue/sst2")
  assert local == str(tmp_path / "cache" / gcs_bucket.removeprefix("gs://") / "tfds")
  sst2 = TASKS.dataset("sst2")
  train = sst2.load("train", data_dir=local)
  assert sorted((row["sentence"].decode().strip(), int(row["label"])) for row in train) == sorted(TRAIN)
  assert sorted(int(row["label"]) for row in sst2.load("validation", data_dir=local)) == [0, 1]
  assert tfds_build.prepared(tfds_build.builder("glue/sst2", data_dir))  # a rerun leaves it as it is


def test_a_beam_dataset_is_refused_before_anything_is_downloaded(tmp_path):
  with pytest.raises(tfds_build.BeamDataset, match=r"wikipedia/20230601.en is an Apache Beam dataset.*"
                     r"python -m jbert.data prepare"):
    tfds_build.builder("wikipedia/20230601.en", str(tmp_path))
  assert list(tmp_path.iterdir()) == []


def test_unknown_dataset_is_a_users_mistake(tmp_path):
  with pytest.raises(errors.UserError, match=r"TFDS has no dataset .glue/sst3. \(BuilderConfig sst3 not found"):
    tfds_build.builder("glue/sst3", str(tmp_path))
  with pytest.raises(errors.UserError, match=r"^TFDS has no dataset 'no_such_dataset' \(Dataset no_such_dataset "
                     r"not found\); names look like"):
    tfds_build.builder("no_such_dataset", str(tmp_path))


def test_the_command_refuses_a_mistake_in_one_line_before_downloading(tmp_path):
  result = subprocess.run([sys.executable, "-m", "jbert.tfds_build", "glue/sst2", "wikipedia/20230601.en",
                           f"--data_dir={tmp_path}"], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert result.returncode == 2 and result.stdout == ""
  assert result.stderr.startswith("jbert.tfds_build: wikipedia/20230601.en is an Apache Beam dataset")
  assert result.stderr.count("\n") == 1 and list(tmp_path.iterdir()) == []  # glue/sst2 not prepared either


# What a machine without network answers: no name resolves (TFDS's own retries took 3.4 minutes of back-off here).
NO_DNS = """import socket
def _no_dns(host, *args, **kwargs):
  raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
socket.getaddrinfo = _no_dns
"""


def _closed_port() -> int:
  import socket  # pylint: disable=import-outside-toplevel
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _offline_run(tmp_path, offline: str, *flags) -> tuple[subprocess.CompletedProcess, float]:
  import os  # pylint: disable=import-outside-toplevel
  import time  # pylint: disable=import-outside-toplevel
  env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy", "no_proxy")}
  args = []
  if offline == "no DNS":
    (tmp_path / "no_dns.py").write_text(NO_DNS)
    env["PYTHONPATH"] = f"{tmp_path}:{env.get('PYTHONPATH', '')}"
    args.append("--imports=no_dns")
  else:  # every download goes through a proxy on a loopback port nothing listens on
    env["HTTP_PROXY"] = env["HTTPS_PROXY"] = f"http://127.0.0.1:{_closed_port()}"
  start = time.perf_counter()
  result = subprocess.run([sys.executable, "-m", "jbert.tfds_build", "glue/sst2", f"--data_dir={tmp_path / 'tfds'}",
                           *args, *flags], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  return result, time.perf_counter() - start


@pytest.mark.parametrize("offline, why", [("no DNS", "its name does not resolve: no network or no DNS"),
                                          ("proxy refuses", "the proxy refused the connection or could not be reached")])
def test_without_network_one_line_names_the_host_and_manual_dir_within_seconds(tmp_path, offline, why):
  result, seconds = _offline_run(tmp_path, offline)
  assert result.returncode == 2 and result.stdout == "", result.stderr[-3000:]
  assert result.stderr == (
      f"jbert.tfds_build: glue/sst2: cannot reach dl.fbaipublicfiles.com ({why}), nor bit.ly or "
      "firebasestorage.googleapis.com, where TFDS downloads it from; download its files where there is network "
      "access (TFDS's checksums of the dataset list their URLs), put them in a folder here and pass "
      "--manual_dir=FOLDER (TFDS then reads them instead of downloading).\n")
  assert seconds < 60  # start-up included; TFDS alone retried for 3.4 minutes
  assert not (tmp_path / "tfds").exists()  # refused before TFDS wrote anything


def test_a_file_that_cannot_be_downloaded_is_named_with_the_manual_dir_given(tmp_path):
  """With --manual_dir (files already there are not downloaded) each file's host is tried as TFDS comes to it."""
  (tmp_path / "manual").mkdir()
  result, seconds = _offline_run(tmp_path, "no DNS", f"--manual_dir={tmp_path / 'manual'}")
  assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
  assert result.stderr.splitlines()[-1] == (
      "jbert.tfds_build: glue/sst2: cannot reach dl.fbaipublicfiles.com (its name does not resolve: no network or no "
      "DNS) to download https://dl.fbaipublicfiles.com/glue/data/SST-2.zip; download SST-2.zip where there is "
      f"network access and put it in {tmp_path / 'manual'} (--manual_dir), where TFDS looks for it under that name.")
  assert sum("jbert.tfds_build" in line for line in result.stderr.splitlines()) == 1
  assert seconds < 60
  assert not list((tmp_path / "tfds").rglob("*.tmp.*"))  # no temporary download folder left behind
