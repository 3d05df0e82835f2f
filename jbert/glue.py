r"""The GLUE suite: every (task, seed) fine-tuned from one checkpoint, then the BERT paper's Table 1 as mean ± std.

  python -m jbert.glue --init_from=PATH --tasks=all --seeds=0,1,2 --workdir=DIR [--set=KEY=VALUE ...]

Each run is `configs/finetune.py:TASK` in `DIR/TASK/seed_S` with `--config.seed=S`; a run whose results.json
exists is skipped, and an interrupted one resumes from its checkpoint, so rerunning the command finishes the
suite. The table (dev-set scores ×100: F1 for MRPC/QQP, Spearman for STS-B, Matthews correlation for CoLA,
accuracy elsewhere; the average over the paper's columns, without WNLI as the paper) is printed and written to
`DIR/glue.md` and `DIR/glue.json`.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import pathlib
import shlex
import sys

from absl import app
from absl import flags
import numpy as np

from jbert import errors

# (column, task, split, metric) in the order of the BERT paper's Table 1, then WNLI.
COLUMNS = (
    ("MNLI-m", "mnli", "validation_matched", "accuracy"),
    ("MNLI-mm", "mnli", "validation_mismatched", "accuracy"),
    ("QQP", "qqp", "validation", "f1"),
    ("QNLI", "qnli", "validation", "accuracy"),
    ("SST-2", "sst2", "validation", "accuracy"),
    ("CoLA", "cola", "validation", "matthews_corr"),
    ("STS-B", "stsb", "validation", "spearman"),
    ("MRPC", "mrpc", "validation", "f1"),
    ("RTE", "rte", "validation", "accuracy"),
    ("WNLI", "wnli", "validation", "accuracy"),
)
TASKS = tuple(dict.fromkeys(task for _, task, _, _ in COLUMNS))
NOT_AVERAGED = ("WNLI",)

_INIT_FROM = flags.DEFINE_string("init_from", None, "The checkpoint to fine-tune (any format load_pretrained reads).")
_TASKS = flags.DEFINE_list("tasks", ["all"], f"GLUE tasks, or `all` ({', '.join(TASKS)}).")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds; each (task, seed) is one fine-tuning run.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for the runs and the table.")
_SET = flags.DEFINE_multi_string("set", [], "KEY=VALUE overrides of every run's config (e.g. "
                                 "batch_size=16, task.tfds_data_dir=/data/tfds).")


def run_config(task: str, seed: int, init_from: str, overrides: dict[str, str]):
  """configs/finetune.py:TASK (`jbert.train.finetune_config`, so an installed jbert has it too) with the seed,
  init_from and the overrides applied (typed as the config's)."""
  from jbert.train import finetune_config  # pylint: disable=g-import-not-at-top  (imports every task: not for --help)
  config = finetune_config.get_config(task)
  config.seed, config.init_from = seed, init_from
  for key, value in overrides.items():
    target, *path = config, *key.split(".")
    for part in path[:-1]:
      target = target[part]
    field_type = target.get_type(path[-1])  # an unset (None) key keeps its declared type
    if value == "None" or field_type is type(None):
      target[path[-1]] = None if value == "None" else value
    elif field_type is bool:
      target[path[-1]] = value.lower() in ("1", "true", "yes")
    else:
      target[path[-1]] = field_type(value)
  return config


def run_suite(init_from: str, tasks, seeds, workdir: str, overrides: dict[str, str] | None = None,
              train_fn=None) -> dict[str, dict]:
  """Runs what is not finished yet; returns {task: {seed: results.json}}."""
  if train_fn is None:
    from jbert.train import trainer as train  # pylint: disable=g-import-not-at-top
    train_fn = train.train_and_evaluate
  results = {}
  for task in tasks:
    for seed in seeds:
      run_dir = os.path.join(workdir, task, f"seed_{seed}")
      done = os.path.join(run_dir, "results.json")
      if not os.path.exists(done):
        logging.getLogger("jbert").info("GLUE: %s seed %d in %s", task, seed, run_dir)
        train_fn(run_config(task, seed, init_from, overrides or {}), run_dir)
        if not os.path.exists(done):  # stopped by SIGTERM or Ctrl-C, saved, and said how to resume: so is the suite
          raise SystemExit(0)
      with open(done, encoding="utf-8") as f:
        results.setdefault(task, {})[seed] = json.load(f)
  return results


def table(results: dict[str, dict]) -> tuple[str, dict]:
  """(markdown, {column: {mean, std, n}}) of the dev scores ×100 over seeds; the paper's average last."""
  summary = {}
  for column, task, split, metric in COLUMNS:
    if task not in results:
      continue
    scores = []
    for seed_results in results[task].values():
      metrics = seed_results["metrics"]
      scores.append(100 * metrics.get(split, metrics.get("validation", {}))[metric])
    summary[column] = {"mean": float(np.mean(scores)), "std": float(np.std(scores)), "n": len(scores)}
  averaged = [c for c in summary if c not in NOT_AVERAGED]
  if averaged:
    summary["Average"] = {"mean": float(np.mean([summary[c]["mean"] for c in averaged])),
                          "std": float("nan"), "n": min(summary[c]["n"] for c in averaged)}
  cells = [f"{v['mean']:.1f} ± {v['std']:.1f}" if not np.isnan(v["std"]) else f"{v['mean']:.1f}"
           for v in summary.values()]
  markdown = ("| " + " | ".join(summary) + " |\n|" + "---|" * len(summary) + "\n| " + " | ".join(cells) + " |\n")
  return markdown, summary


def main(argv):
  from jbert.runtime import ahead  # pylint: disable=g-import-not-at-top
  ahead.then_leave(lambda: _reported_main(argv))  # a stopped run's compiles are not waited for


def _reported_main(argv):
  with errors.reported("jbert.glue"):
    _main(argv)


def _main(argv):
  if len(argv) > 1:
    raise errors.UserError(f"Unexpected arguments: {argv[1:]}")
  if not _INIT_FROM.value or not _WORKDIR.value:
    raise errors.UserError("--init_from and --workdir are required.")
  tasks = list(TASKS) if _TASKS.value == ["all"] else _TASKS.value
  unknown = sorted(set(tasks) - set(TASKS))
  if unknown:
    raise errors.UserError(f"unknown GLUE task(s) {unknown}; choose from {', '.join(TASKS)} or all.")
  overrides = dict(item.split("=", 1) for item in _SET.value)
  logging.getLogger("jbert").setLevel(logging.INFO)
  from jbert.runtime import compile_cache  # pylint: disable=g-import-not-at-top
  from jbert.train import trainer  # pylint: disable=g-import-not-at-top
  compile_cache.enable()  # the seeds of a task compile the same programs: from the second one on, they are loaded
  command = shlex.join(["python", "-m", "jbert.glue", *sys.argv[1:]])
  results = run_suite(_INIT_FROM.value, tasks, [int(s) for s in _SEEDS.value], _WORKDIR.value, overrides,
                      train_fn=functools.partial(trainer.train_and_evaluate, command=command))
  markdown, summary = table(results)
  seeds = f"{len(_SEEDS.value)} seed(s): {', '.join(_SEEDS.value)}"
  text = f"GLUE dev, mean ± std over {seeds}; init_from {_INIT_FROM.value}\n\n{markdown}"
  pathlib.Path(_WORKDIR.value, "glue.md").write_text(text, encoding="utf-8")
  pathlib.Path(_WORKDIR.value, "glue.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
  print(text)


if __name__ == "__main__":
  app.run(main)
