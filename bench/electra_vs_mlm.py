r"""ELECTRA vs MLM pretraining at equal training FLOPs, each then fine-tuned on an SST-2-like task; prints JSON.

  python bench/electra_vs_mlm.py --out=/tmp/electra_vs_mlm [--mlm_steps=600 --seeds=0,1,2 --vocab_size=4000]

Both pretrain the same model size (configs/tiny.py's: 2 layers, 128 wide) on the same prepared corpus (the shared
novel, `python -m jbert.data prepare --train_vocab`), at the same batch and length: MLM (configs/tiny.py without
NSP, FULL-SENTENCES) for `--mlm_steps`, ELECTRA (configs/electra.py:tiny) for as many steps as give the same
training FLOPs (`Task.step_flops` of each: ELECTRA's step adds its generator's and its head's). Each pretrained
encoder is then fine-tuned on a classification task of the novel's spans (`--task`: word order, or
bench/finetune_e2e.py's keyword rows; `--sst2_rows`, `--epochs`, `--learning_rate` as there) from its workdir
(MLM) or its export (ELECTRA's discriminator), and with `--baseline` so are the initial weights; reported: the
evaluation accuracy per seed, their mean and standard deviation, and the difference ELECTRA - MLM.
"""
from __future__ import annotations

import functools
import json
import math
import pathlib
import statistics
import subprocess
import sys

from absl import app
from absl import flags
import numpy as np

import finetune_e2e  # bench/, the script's own folder: its data and flags (--out, --text, --sst2_*, --epochs, ...)

REPO = finetune_e2e.REPO
_MLM_STEPS = flags.DEFINE_integer("mlm_steps", 600, "MLM pretraining steps; ELECTRA gets the same FLOPs.")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds of pretraining and fine-tuning (one pair of runs each).")
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", 4000, "WordPiece vocabulary trained on the corpus.")
_BATCH = flags.DEFINE_integer("batch_size", 32, "Pretraining batch (rows of --pretrain_seq tokens).")
_PRETRAIN_SEQ = flags.DEFINE_integer("pretrain_seq", 64, "Pretraining sequence length.")
_BASELINE = flags.DEFINE_bool("baseline", True, "Also fine-tune the initial weights (one MLM step at warmup's "
                                "first learning rate): what pretraining adds.")
_TASK = flags.DEFINE_enum("task", "shuffle", ["shuffle", "order", "sst2"],
                          "shuffle: spans of the novel against their words shuffled; order: against one adjacent "
                          "pair swapped (both CoLA-like: word order, which pretraining learns and no single token "
                          "tells); sst2: bench/finetune_e2e.py's keyword rows (solved from the keyword alone).")

COMMON = ("--config.data.source=prepared", "--config.eval_every_steps=0", "--config.log_every_steps=50")


def pretrain_configs(corpus: str, batch: int, seq: int):
  """(MLM config, ELECTRA config) as run.py builds them from the commands' overrides."""
  if str(REPO) not in sys.path:  # run as a script: configs/ is the repository's
    sys.path.insert(0, str(REPO))
  from configs import electra, tiny  # pylint: disable=import-outside-toplevel
  configs = []
  for config in (tiny.get_config(), electra.get_config("tiny")):
    config.data.source, config.data.prepared, config.data.nsp = "prepared", corpus, False
    config.data.short_seq_prob = 0.0  # FULL-SENTENCES, as ELECTRA's rows
    config.batch_size, config.data.max_seq_length = batch, seq
    configs.append(config)
  return configs


def equal_flops_steps(mlm_steps: int, corpus_vocab: int, batch: int, seq: int, corpus: str = "unused") -> dict:
  """ELECTRA's steps with the FLOPs of `mlm_steps` MLM steps, and both per-step counts."""
  from jbert import tasks  # pylint: disable=import-outside-toplevel
  from jbert.train import architecture  # pylint: disable=import-outside-toplevel
  per_step = []
  for config in pretrain_configs(corpus, batch, seq):
    task = tasks.build_task(config)
    per_step.append(task.step_flops(architecture.bert_config(config.model, corpus_vocab), batch, seq))
  mlm, electra = per_step
  return {"mlm_step_flops": mlm, "electra_step_flops": electra,
          "electra_steps": max(1, round(mlm_steps * mlm / electra))}


def order_rows(words: list[str], n: int, seed: int, max_words: int, shuffle: bool = False) -> list[dict]:
  """Spans of the novel of SST-2's word counts (at least 4), every other one ("neg") with two adjacent different
  words swapped, or with `shuffle` all its words in a new order: a question of word order, which no single token
  answers."""
  rng = np.random.default_rng(seed)
  counts = np.clip(np.round(rng.lognormal(math.log(7.5), 0.75, n)), 4, max_words).astype(int)
  rows = []
  for i, count in enumerate(counts):
    span = finetune_e2e._span(words, rng, int(count))  # pylint: disable=protected-access
    swapped = i % 2 == 1
    if swapped and shuffle:
      order = np.arange(len(span))
      while (order == np.arange(len(span))).all():
        order = rng.permutation(len(span))
      span = [span[j] for j in order]
    elif swapped:
      pairs = [j for j in range(len(span) - 1) if span[j].lower() != span[j + 1].lower()]
      j = int(rng.choice(pairs)) if pairs else 0
      span[j], span[j + 1] = span[j + 1], span[j]
    rows.append({"sentence": " ".join(span), "label": ("pos", "neg")[swapped]})
  return rows


def pretrain_command(kind: str, corpus: str, workdir: pathlib.Path, steps: int, seed: int) -> list[str]:
  config = "configs/electra.py:tiny" if kind == "electra" else "configs/tiny.py"
  extra = [] if kind == "electra" else ["--config.data.nsp=False", "--config.data.short_seq_prob=0.0"]
  return [sys.executable, str(REPO / "run.py"), f"--config={REPO / config}", f"--workdir={workdir}",
          f"--config.data.prepared={corpus}", f"--config.total_steps={steps}", f"--config.seed={seed}",
          f"--config.batch_size={_BATCH.value}", f"--config.data.max_seq_length={_PRETRAIN_SEQ.value}",
          f"--config.checkpoint_every_steps={steps}", *COMMON, *extra]


def accuracy(workdir: pathlib.Path) -> float:
  results = json.loads((workdir / "results.json").read_text())["metrics"]
  return float(next(iter(results.values()))["accuracy"])


def main(argv):
  del argv
  out = pathlib.Path(finetune_e2e._OUT.value)  # pylint: disable=protected-access
  out.mkdir(parents=True, exist_ok=True)
  text = pathlib.Path(finetune_e2e._TEXT.value)  # pylint: disable=protected-access
  corpus = out / "corpus"
  if not (corpus / "manifest.json").exists():
    subprocess.run([sys.executable, "-m", "jbert.data", "prepare", f"--input={text}", f"--output={corpus}",
                    f"--train_vocab={_VOCAB_SIZE.value}"], cwd=REPO, check=True)
  vocab = sum(1 for _ in open(corpus / "vocab.txt", encoding="utf-8"))
  budget = equal_flops_steps(_MLM_STEPS.value, vocab, _BATCH.value, _PRETRAIN_SEQ.value, str(corpus))
  words = finetune_e2e.source_words(text.read_text(encoding="utf-8"))
  train_rows, eval_rows = (int(n) for n in finetune_e2e._SST2_ROWS.value)  # pylint: disable=protected-access
  data = out / _TASK.value
  data.mkdir(exist_ok=True)
  make_rows = {"order": order_rows, "shuffle": functools.partial(order_rows, shuffle=True),
               "sst2": finetune_e2e.sst2_rows}[_TASK.value]
  finetune_e2e.write_csv(data / "train.csv", make_rows(words, train_rows, 0, 28))
  finetune_e2e.write_csv(data / "dev.csv", make_rows(words, eval_rows, 1, 28))
  files = finetune_e2e.task_files("sst2", data)
  runs = (("mlm", _MLM_STEPS.value), ("electra", budget["electra_steps"])) + ((("random", 1),) if _BASELINE.value
                                                                              else ())
  scores = {kind: [] for kind, _ in runs}
  for seed in map(int, _SEEDS.value):
    for kind, steps in runs:
      pre, tuned = out / f"{kind}_{seed}", out / f"{kind}_{seed}_{_TASK.value}"
      if (tuned / "results.json").exists():  # a rerun of an interrupted measurement keeps what it finished
        scores[kind].append(accuracy(tuned))
        continue
      subprocess.run(pretrain_command(kind, str(corpus), pre, steps, seed), cwd=REPO, check=True)
      model = pre / "export" if kind == "electra" else pre
      subprocess.run(finetune_e2e.jbert_command(
          str(model), files, str(tuned), finetune_e2e._SST2_SEQ.value, finetune_e2e._EPOCHS.value,  # pylint: disable=protected-access
          finetune_e2e._LR.value, seed, True), cwd=REPO, check=True)  # pylint: disable=protected-access
      scores[kind].append(accuracy(tuned))
  summary = {kind: {"accuracy": s, "mean": statistics.mean(s),
                    "std": statistics.stdev(s) if len(s) > 1 else 0.0} for kind, s in scores.items()}
  summary.update(budget, task=_TASK.value, mlm_steps=_MLM_STEPS.value, seeds=[int(s) for s in _SEEDS.value],
                 electra_minus_mlm=summary["electra"]["mean"] - summary["mlm"]["mean"])
  print(json.dumps(summary))


if __name__ == "__main__":
  app.run(main)
