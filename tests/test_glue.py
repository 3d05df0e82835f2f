"""Every GLUE config fine-tunes end to end on TFDS mock data, writes results.json and the GLUE server's files, and
`python -m jbert.glue` runs (task, seed) pairs, skips finished ones and tabulates mean ± std."""
import json
import math
import subprocess
import sys

import pytest
import tensorflow_datasets as tfds

from jbert import glue
from jbert.train import trainer as train
from tests.tasks import finetune_data as fd

MOCK_ROWS = 24  # per split; a batch of 16 leaves a padded last evaluation batch
SERVER_FILES = {"cola": ["CoLA"], "sst2": ["SST-2"], "mrpc": ["MRPC"], "qqp": ["QQP"], "stsb": ["STS-B"],
                "mnli": ["AX", "MNLI-m", "MNLI-mm"], "qnli": ["QNLI"], "rte": ["RTE"], "wnli": ["WNLI"]}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  return str(fd.tiny_checkpoint(tmp_path_factory.mktemp("ckpt")))


def tiny(task, checkpoint, **more):
  return fd.finetune_config(task, init_from=checkpoint, total_steps=2, batch_size=16, log_every_steps=1, **more)


@pytest.mark.parametrize("task", sorted(SERVER_FILES))
def test_every_glue_config_runs_on_mock_data(tmp_path, checkpoint, task):
  import tensorflow_datasets.text  # noqa: F401  pylint: disable=unused-import,import-outside-toplevel
  with tfds.testing.mock_data(num_examples=MOCK_ROWS):
    train.train_and_evaluate(tiny(task, checkpoint), str(tmp_path))
  results = json.loads((tmp_path / "results.json").read_text())
  splits = ["validation_matched", "validation_mismatched"] if task == "mnli" else ["validation"]
  assert sorted(results["metrics"]) == splits
  for metrics in results["metrics"].values():
    if task != "stsb":  # classes: rows gold, columns predicted, every validation row counted once
      matrix = metrics.pop("confusion_matrix")
      classes = 3 if task == "mnli" else 2
      assert [len(row) for row in matrix] == [classes] * classes and sum(map(sum, matrix)) == MOCK_ROWS
    assert all(math.isfinite(v) for v in metrics.values())
  # The prediction files carry the input texts (one or two by task) and the gold label beside the prediction.
  split = "validation_matched" if task == "mnli" else "validation"
  header = (tmp_path / "predictions" / f"{split}.tsv").read_text().splitlines()[0].split("\t")
  texts = ["text_a"] if task in ("cola", "sst2") else ["text_a", "text_b"]
  assert header[:len(texts) + 3] == ["index", *texts, "label", "prediction"]
  lines = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  evals = [l for l in lines if any(k.startswith("eval/") for k in l)]
  prefix = "eval/validation_matched/" if task == "mnli" else "eval/"
  assert evals and all(k.startswith(prefix) or k.startswith("eval/validation_mismatched/") or k == "step"
                       for k in evals[-1])
  assert sorted(p.stem for p in (tmp_path / "glue").iterdir()) == SERVER_FILES[task]
  for path in (tmp_path / "glue").iterdir():
    rows = path.read_text().splitlines()
    assert rows[0] == "index\tprediction" and len(rows) == MOCK_ROWS + 1
    values = {r.split("\t")[1] for r in rows[1:]}
    if task in ("mnli", "qnli", "rte"):
      assert values <= {"entailment", "neutral", "contradiction", "not_entailment"}
    elif task == "stsb":
      assert all(float(v) == float(v) for v in values)
    else:
      assert values <= {"0", "1"}
  assert (tmp_path / "export" / "config.json").exists()


def test_suite_runs_pairs_skips_finished_ones_and_tabulates(tmp_path, checkpoint):
  import tensorflow_datasets.text  # noqa: F401  pylint: disable=unused-import,import-outside-toplevel
  calls = []

  def train_fn(config, workdir):
    calls.append((config.task.name, config.seed))
    config.unlock()
    config.batch_size, config.total_steps, config.log_every_steps = 16, 2, 1
    config.model.scan_layers, config.data.max_seq_length = False, 16
    train.train_and_evaluate(config, workdir)

  with tfds.testing.mock_data(num_examples=MOCK_ROWS):
    results = glue.run_suite(checkpoint, ["rte", "stsb"], [0, 1], str(tmp_path), train_fn=train_fn)
    assert calls == [("rte", 0), ("rte", 1), ("stsb", 0), ("stsb", 1)]
    again = glue.run_suite(checkpoint, ["rte", "stsb"], [0, 1], str(tmp_path), train_fn=train_fn)
  assert len(calls) == 4 and again == results  # finished runs are read back, not run again
  assert results["rte"][0]["seed"] == 0 and results["rte"][1]["seed"] == 1
  markdown, summary = glue.table(results)
  rte = [100 * results["rte"][s]["metrics"]["validation"]["accuracy"] for s in (0, 1)]
  assert summary["RTE"]["mean"] == pytest.approx(sum(rte) / 2)
  assert summary["RTE"]["std"] == pytest.approx(abs(rte[0] - rte[1]) / 2)
  assert summary["Average"]["mean"] == pytest.approx((summary["RTE"]["mean"] + summary["STS-B"]["mean"]) / 2)
  assert markdown.splitlines()[0] == "| STS-B | RTE | Average |"
  assert f"{summary['RTE']['mean']:.1f} ± {summary['RTE']['std']:.1f}" in markdown


def test_run_config_applies_typed_overrides():
  config = glue.run_config("cola", 2, "/ckpt", {"batch_size": "16", "model.scan_layers": "False",
                                                "optim.learning_rate": "3e-5", "task.tfds_data_dir": "/d"})
  assert (config.seed, config.init_from, config.batch_size) == (2, "/ckpt", 16)
  assert config.model.scan_layers is False and config.optim.learning_rate == 3e-5
  assert config.task.tfds_data_dir == "/d" and config.task.name == "cola"


def test_a_users_mistake_is_one_line_and_exit_2(tmp_path):
  result = subprocess.run([sys.executable, "-m", "jbert.glue", f"--workdir={tmp_path / 'w'}", "--tasks=sst2,nope"],
                          capture_output=True, text=True, timeout=120, check=False)
  assert result.returncode == 2 and not (tmp_path / "w").exists()
  assert result.stderr.strip().splitlines() == ["jbert.glue: --init_from and --workdir are required."]


def test_run_config_works_from_an_installed_package_outside_the_checkout(tmp_path):
  """An installed jbert has no configs/ beside it: the package alone (as pip installs it) builds the config that
  `configs/finetune.py:TASK` builds in the checkout, and nothing else is imported from outside it."""
  import importlib  # pylint: disable=import-outside-toplevel
  import os  # pylint: disable=import-outside-toplevel
  import pathlib  # pylint: disable=import-outside-toplevel
  import shutil  # pylint: disable=import-outside-toplevel
  checkout = pathlib.Path(glue.__file__).resolve().parents[1]
  site = tmp_path / "site-packages"
  shutil.copytree(checkout / "jbert", site / "jbert", ignore=shutil.ignore_patterns("__pycache__"))
  script = (
      "import importlib.util, json, sys\n"
      "from jbert import glue\n"
      "config = glue.run_config('mnli', 3, '/ckpt', {'batch_size': '8', 'optim.learning_rate': '3e-5'})\n"
      "outside = sorted(n for n, m in sys.modules.items() if n.split('.')[0] in ('configs', 'run', 'bench', 'tpu'))\n"
      "print(json.dumps({'file': glue.__file__, 'configs': importlib.util.find_spec('configs') is not None,\n"
      "                  'outside': outside, 'config': json.loads(config.to_json())}))\n")
  env = {**os.environ, "PYTHONPATH": str(site), "JAX_PLATFORMS": "cpu"}
  result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  seen = json.loads(result.stdout.strip().splitlines()[-1])
  assert seen["file"] == str(site / "jbert" / "glue.py") and not seen["configs"] and seen["outside"] == []
  in_checkout = importlib.import_module("configs.finetune").get_config("mnli")
  in_checkout.seed, in_checkout.init_from, in_checkout.batch_size = 3, "/ckpt", 8
  in_checkout.optim.learning_rate = 3e-5
  assert seen["config"] == json.loads(in_checkout.to_json())
  assert seen["config"]["eval_every_steps"] == 5_000 and seen["config"]["task"]["name"] == "mnli"
