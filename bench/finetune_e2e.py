r"""Time to a fine-tuned model, end to end: jbert's `run.py` beside the same recipe in transformers + PyTorch.

  python bench/finetune_e2e.py --out=/tmp/e2e [--tasks=sst2,mrpc \
      --systems=jbert,jbert_bucketed,jbert_fixed,torch_fixed,torch_dynamic]

Each system is a subprocess timed from its command to its results on disk (`results.json`, written after the
evaluation and the saved model), so start-up, tokenisation, compilation, training, evaluation and export all count.
Data are generated from botchan.txt (no downloads):

  sst2  single sentences with SST-2's training lengths (lognormal token counts: mean ~13, p90 ~27 with [CLS] and
        [SEP]); the label is which of two keyword lists supplies one of its words (learnable from scratch);
        8,000 training rows, 872 evaluation rows, sequence 64 (the issue's measurement).
  mrpc  sentence pairs with MRPC's shape (~22 words each; 3,668 / 408 rows) at sequence 128; the label is the
        keyword list of the second sentence.

The model is a MiniLM-L6-sized BERT (hidden 384, 6 layers, 12 heads, intermediate 1536, bert-base-uncased's
vocabulary) randomly initialised once and saved as a Hugging Face folder that every system starts from. The recipe:
batch 32, AdamW (weight decay 0.01 except biases and LayerNorm), 10% linear warmup then linear decay, clipping
at 1.0, dropout 0.1, `--epochs` passes, float32, seeded shuffling. Systems:

  jbert          run.py with packed batches (the default `data.packing=True`): each batch's examples laid end to
                 end in rows of the sequence length, one or two row counts a run
  jbert_bucketed run.py with `--config.data.packing=False`: length-bucketed batches (`data.bucketing=True`)
  jbert_fixed    run.py with `data.packing=False data.bucketing=False`: every batch padded to the sequence length
  torch_fixed    transformers' BertForSequenceClassification, `padding="max_length"`
  torch_dynamic  the same with `DataCollatorWithPadding`: each batch padded to its longest row

Every run gets empty cache directories (`XDG_CACHE_HOME`, `JBERT_COMPILE_CACHE`, JAX's), so nothing compiled
by an earlier run is reused: these are first runs. The padding fraction is that of the training batches (jbert:
from its metrics.jsonl; PyTorch: counted); `train_shapes` and `eval_shapes` are the batch shapes jbert compiled
programs for (its log's compile-ahead line; 1 each where it has none), PyTorch compiles nothing.
The last line printed is one JSON object (also `--out/results.json`), with the 1-minute load average around each run.
"""
from __future__ import annotations

import csv
import json
import math
import os
import pathlib
import re
import subprocess
import sys
import time

from absl import app
from absl import flags
import numpy as np

import torch_optim  # bench/, the script's own folder

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
SYSTEMS = ("jbert", "jbert_bucketed", "jbert_fixed", "torch_fixed", "torch_dynamic")
# jbert systems -> (data.packing, data.bucketing)
JBERT_BATCHES = {"jbert": (True, True), "jbert_bucketed": (False, True), "jbert_fixed": (False, False)}
POSITIVE = ("good", "fine", "happy", "nice", "kind", "glad")
NEGATIVE = ("bad", "poor", "sad", "angry", "cruel", "awful")

_OUT = flags.DEFINE_string("out", None, "Directory for data, model, runs and results.json.")
_TASKS = flags.DEFINE_list("tasks", ["sst2", "mrpc"], "sst2 and/or mrpc.")
_SYSTEMS = flags.DEFINE_list("systems", list(SYSTEMS), f"Any of {', '.join(SYSTEMS)}.")
_TEXT = flags.DEFINE_string("text", str(SHARED / "botchan.txt"), "Source text of the sentences.")
_VOCAB = flags.DEFINE_string("vocab", str(SHARED / "bert-base-uncased-vocab.txt"), "WordPiece vocab.txt.")
_SST2_ROWS = flags.DEFINE_list("sst2_rows", ["8000", "872"], "Training and evaluation rows of sst2.")
_MRPC_ROWS = flags.DEFINE_list("mrpc_rows", ["3668", "408"], "Training and evaluation rows of mrpc.")
_SST2_SEQ = flags.DEFINE_integer("sst2_seq", 64, "Sequence length of sst2.")
_MRPC_SEQ = flags.DEFINE_integer("mrpc_seq", 128, "Sequence length of mrpc.")
_EPOCHS = flags.DEFINE_float("epochs", 1.0, "Passes over the training rows.")
_LR = flags.DEFINE_float("learning_rate", 1e-4, "Peak learning rate (the model starts from random weights).")
_MODEL = flags.DEFINE_list("model", ["384", "6", "12", "1536"], "hidden, layers, heads, intermediate.")
_SEED = flags.DEFINE_integer("seed", 0, "Data, initialisation and shuffling seed.")
# Internal: the PyTorch recipe runs as `finetune_e2e.py --torch_run=JSON`, timed like any other command.
_TORCH_RUN = flags.DEFINE_string("torch_run", None, "Internal: run the transformers recipe described by JSON.")


# -- data ------------------------------------------------------------------------------------------------------

def source_words(text: str) -> list[str]:
  """The words of the text between Project Gutenberg's START and END lines, keywords left out (they label)."""
  start, end = text.find("*** START OF"), text.find("*** END OF")
  body = text[text.find("\n", start) + 1 if start >= 0 else 0:end if end >= 0 else len(text)]
  keywords = set(POSITIVE + NEGATIVE)
  return [w for w in body.split() if re.sub(r"\W", "", w.lower()) not in keywords]


def _span(words: list[str], rng: np.random.Generator, n: int) -> list[str]:
  start = int(rng.integers(0, len(words) - n))
  return list(words[start:start + n])


def _labelled(words: list[str], rng: np.random.Generator, positive: bool) -> str:
  words = list(words)
  words[int(rng.integers(len(words)))] = str(rng.choice(POSITIVE if positive else NEGATIVE))
  return " ".join(words)


def sst2_rows(words: list[str], n: int, seed: int, max_words: int) -> list[dict]:
  """Sentences of lognormal word counts (median 7.5, sigma 0.75: SST-2's token lengths once WordPiece splits the
  punctuation); label pos/neg from the inserted keyword."""
  rng = np.random.default_rng(seed)
  counts = np.clip(np.round(rng.lognormal(math.log(7.5), 0.75, n)), 1, max_words).astype(int)
  return [{"sentence": _labelled(_span(words, rng, c), rng, i % 2 == 0), "label": ("neg", "pos")[i % 2 == 0]}
          for i, c in enumerate(counts)]


def mrpc_rows(words: list[str], n: int, seed: int, max_words: int) -> list[dict]:
  """Pairs of ~22-word sentences (normal, sd 6); the second one's keyword is the label."""
  rng = np.random.default_rng(seed)
  counts = np.clip(np.round(rng.normal(19.0, 5.0, (n, 2))), 5, max_words).astype(int)
  return [{"sentence1": " ".join(_span(words, rng, a)), "sentence2": _labelled(_span(words, rng, b), rng, i % 2 == 0),
           "label": ("neg", "pos")[i % 2 == 0]} for i, (a, b) in enumerate(counts)]


def write_csv(path: pathlib.Path, rows: list[dict]) -> pathlib.Path:
  with path.open("w", encoding="utf-8", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
  return path


def read_csv(path) -> list[dict]:
  with open(path, encoding="utf-8", newline="") as f:
    return list(csv.DictReader(f))


def make_model(directory: pathlib.Path, vocab: str, hidden: int, layers: int, heads: int, intermediate: int,
               seed: int) -> pathlib.Path:
  """A randomly initialised BERT as a Hugging Face folder (weights, config, tokenizer) every system starts from."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(seed)
  tokenizer = transformers.BertTokenizerFast(vocab=vocab, do_lower_case=True)
  config = transformers.BertConfig(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
                                   num_attention_heads=heads, intermediate_size=intermediate)
  transformers.BertForPreTraining(config).save_pretrained(directory)
  tokenizer.save_pretrained(directory)
  return directory


def token_lengths(model_dir, texts_a, texts_b=None) -> np.ndarray:
  """Tokens per row with [CLS] and [SEP]s, untruncated."""
  import transformers  # pylint: disable=g-import-not-at-top
  tokenizer = transformers.BertTokenizerFast.from_pretrained(model_dir)
  encoded = tokenizer(texts_a, texts_b) if texts_b is not None else tokenizer(texts_a)
  return np.array([len(ids) for ids in encoded["input_ids"]])


# -- the systems -----------------------------------------------------------------------------------------------

def task_files(task: str, directory: pathlib.Path) -> dict:
  columns = {"text_a": "sentence", "text_b": None} if task == "sst2" else {"text_a": "sentence1",
                                                                          "text_b": "sentence2"}
  return {"train": str(directory / "train.csv"), "eval": str(directory / "dev.csv"), **columns}


def jbert_settings(model: str, files: dict, seq: int, epochs: float, lr: float, seed: int, bucketing: bool,
                   packing: bool = True) -> dict:
  """The config keys the jbert systems set, with their values (configs/finetune.py:local)."""
  settings = {"init_from": model, "task.train_file": files["train"], "task.eval_file": files["eval"],
              "task.text_a": files["text_a"], "task.label": "label", "task.label_names": "neg,pos",
              "data.max_seq_length": seq, "num_epochs": epochs, "optim.learning_rate": lr, "seed": seed,
              "data.bucketing": bucketing, "data.packing": packing}
  if files["text_b"]:
    settings["task.text_b"] = files["text_b"]
  return settings


def jbert_command(model: str, files: dict, workdir: str, seq: int, epochs: float, lr: float, seed: int,
                  bucketing: bool, packing: bool = True) -> list[str]:
  settings = jbert_settings(model, files, seq, epochs, lr, seed, bucketing, packing)
  return [sys.executable, str(REPO / "run.py"), "--config=" + str(REPO / "configs" / "finetune.py") + ":local",
          f"--workdir={workdir}", *(f"--config.{k}={v}" for k, v in settings.items())]


def torch_command(model: str, files: dict, workdir: str, seq: int, epochs: float, lr: float, seed: int,
                  dynamic: bool) -> list[str]:
  spec = dict(model=model, files=files, workdir=workdir, seq=seq, epochs=epochs, lr=lr, seed=seed, dynamic=dynamic)
  return [sys.executable, str(pathlib.Path(__file__).resolve()), "--torch_run=" + json.dumps(spec)]


def torch_run(spec: dict) -> None:
  """The transformers + PyTorch recipe: train, evaluate, save the model, then results.json."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(len(os.sched_getaffinity(0)))
  torch.manual_seed(spec["seed"])
  files, seq, workdir = spec["files"], spec["seq"], pathlib.Path(spec["workdir"])
  tokenizer = transformers.BertTokenizerFast.from_pretrained(spec["model"])
  model = transformers.BertForSequenceClassification.from_pretrained(spec["model"], num_labels=2)
  padding = False if spec["dynamic"] else "max_length"

  def encode(path):
    rows = read_csv(path)
    texts_b = [r[files["text_b"]] for r in rows] if files["text_b"] else None
    enc = tokenizer([r[files["text_a"]] for r in rows], texts_b, truncation=True, max_length=seq, padding=padding)
    return [{**{k: enc[k][i] for k in enc}, "labels": int(r["label"] == "pos")} for i, r in enumerate(rows)]

  collate = (transformers.DataCollatorWithPadding(tokenizer) if spec["dynamic"]
             else transformers.default_data_collator)
  train = torch.utils.data.DataLoader(encode(files["train"]), batch_size=32, shuffle=True, collate_fn=collate,
                                      generator=torch.Generator().manual_seed(spec["seed"]))
  evaluation = torch.utils.data.DataLoader(encode(files["eval"]), batch_size=32, collate_fn=collate)
  total = math.ceil(len(train) * spec["epochs"])
  optimizer = torch_optim.adamw(model, learning_rate=spec["lr"], weight_decay=0.01, eps=1e-6)
  schedule = transformers.get_linear_schedule_with_warmup(optimizer, int(0.1 * total), total)
  model.train()
  step, real, padded = 0, 0, 0
  while step < total:
    for batch in train:
      loss = model(**batch).loss
      loss.backward()
      torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
      optimizer.step()
      schedule.step()
      optimizer.zero_grad(set_to_none=True)
      real += int(batch["attention_mask"].sum())
      padded += batch["attention_mask"].numel()
      step += 1
      if step == total:
        break
  model.eval()
  correct = count = 0
  with torch.no_grad():
    for batch in evaluation:
      labels = batch.pop("labels")
      correct += int((model(**batch).logits.argmax(-1) == labels).sum())
      count += len(labels)
  model.save_pretrained(workdir / "export")
  tokenizer.save_pretrained(workdir / "export")
  summary = {"metrics": {"validation": {"accuracy": correct / count}}, "step": step,
             "padding_fraction": 1 - real / padded}
  (workdir / "results.json").write_text(json.dumps(summary))


def jbert_padding_fraction(workdir: pathlib.Path) -> float | None:
  """The step-weighted mean of the logged train/padding_fraction (every window after the first step)."""
  lines = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  logged = [(l["step"], l["train/padding_fraction"]) for l in lines if "train/padding_fraction" in l]
  previous, weighted, steps = 1, 0.0, 0
  for step, fraction in logged:
    weighted, steps, previous = weighted + fraction * (step - previous), steps + step - previous, step
  return weighted / steps if steps else None


def jbert_shapes(log: str) -> tuple[int, int]:
  """(training, evaluation) batch shapes a run compiled programs for, from its compile-ahead log line."""
  found = re.search(r"the gradient at (.*), the update and (\d+) evaluation shape", log)
  return (len(found.group(1).split(", ")), int(found.group(2))) if found else (1, 1)


def run_system(system: str, task: str, root: pathlib.Path, model: str, files: dict, seq: int) -> dict:
  workdir = root / "runs" / f"{task}_{system}"
  args = (model, files, str(workdir), seq, _EPOCHS.value, _LR.value, _SEED.value)
  if system.startswith("jbert"):
    packing, bucketing = JBERT_BATCHES[system]
    command = jbert_command(*args, bucketing=bucketing, packing=packing)
  else:
    command = torch_command(*args, dynamic=system == "torch_dynamic")
  cache = root / "cache" / f"{task}_{system}"
  env = {**os.environ, "XDG_CACHE_HOME": str(cache), "JBERT_COMPILE_CACHE": str(cache / "jbert"),
         "JAX_COMPILATION_CACHE_DIR": str(cache / "jax")}
  workdir.parent.mkdir(parents=True, exist_ok=True)
  load_before = os.getloadavg()[0]
  start = time.perf_counter()
  with open(root / "runs" / f"{task}_{system}.log", "w", encoding="utf-8") as log:
    subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
  wall = time.perf_counter() - start
  results = json.loads((workdir / "results.json").read_text())
  padding = jbert_padding_fraction(workdir) if system.startswith("jbert") else results["padding_fraction"]
  out = {"wall_s": round(wall, 2), "accuracy": results["metrics"]["validation"]["accuracy"],
         "steps": results["step"], "padding_fraction": padding,
         "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
  if system.startswith("jbert"):
    text = (root / "runs" / f"{task}_{system}.log").read_text(encoding="utf-8")
    out["train_shapes"], out["eval_shapes"] = jbert_shapes(text)
  return out


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if _TORCH_RUN.value:
    return torch_run(json.loads(_TORCH_RUN.value))
  if not _OUT.value:
    raise app.UsageError("--out=DIR is required.")
  unknown = sorted(set(_SYSTEMS.value) - set(SYSTEMS)) + sorted(set(_TASKS.value) - {"sst2", "mrpc"})
  if unknown:
    raise app.UsageError(f"unknown systems/tasks {unknown}; systems: {', '.join(SYSTEMS)}; tasks: sst2, mrpc.")
  root = pathlib.Path(_OUT.value)
  root.mkdir(parents=True, exist_ok=True)
  hidden, layers, heads, intermediate = (int(x) for x in _MODEL.value)
  model = str(make_model(root / "model", _VOCAB.value, hidden, layers, heads, intermediate, _SEED.value))
  words = source_words(pathlib.Path(_TEXT.value).read_text(encoding="utf-8"))
  report = {"model": dict(hidden=hidden, layers=layers, heads=heads, intermediate=intermediate),
            "epochs": _EPOCHS.value, "learning_rate": _LR.value, "threads": len(os.sched_getaffinity(0)),
            "tasks": {}}
  for task in _TASKS.value:
    rows, seq, make = ((_SST2_ROWS.value, _SST2_SEQ.value, sst2_rows) if task == "sst2" else
                       (_MRPC_ROWS.value, _MRPC_SEQ.value, mrpc_rows))
    directory = root / "data" / task
    directory.mkdir(parents=True, exist_ok=True)
    train_rows = make(words, int(rows[0]), _SEED.value, seq // 2 - 4)
    write_csv(directory / "train.csv", train_rows)
    write_csv(directory / "dev.csv", make(words, int(rows[1]), _SEED.value + 1, seq // 2 - 4))
    files = task_files(task, directory)
    lengths = token_lengths(model, [r[files["text_a"]] for r in train_rows],
                            [r[files["text_b"]] for r in train_rows] if files["text_b"] else None)
    entry = {"train_rows": len(train_rows), "seq": seq, "tokens_mean": float(lengths.mean()),
             "tokens_p90": float(np.percentile(lengths, 90)), "systems": {}}
    for system in _SYSTEMS.value:
      entry["systems"][system] = run_system(system, task, root, model, files, seq)
      print(f"{task} {system}: {json.dumps(entry['systems'][system])}", flush=True)
    runs = entry["systems"]
    for other in ("jbert_bucketed", "jbert_fixed", "torch_fixed", "torch_dynamic"):
      if "jbert" in runs and other in runs:
        entry[f"speedup_vs_{other}"] = round(runs[other]["wall_s"] / runs["jbert"]["wall_s"], 3)
    report["tasks"][task] = entry
  (root / "results.json").write_text(json.dumps(report, indent=2))
  print(json.dumps(report))


if __name__ == "__main__":
  app.run(main)
