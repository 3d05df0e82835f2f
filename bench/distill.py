r"""Distillation on an SST-2-like set: a 6-layer teacher -> a 3-layer student, with distillation vs on hard labels only.

  python bench/distill.py --out=/tmp/distill [--sst2_rows=8000,872 --epochs=2 --student_epochs=1 --model=384,6,12,1536]

Data (no downloads): single sentences with SST-2's length distribution (`finetune_e2e.sst2_rows`' lognormal word
counts), each carrying 1 or 3 sentiment keywords from two lists; the label is the majority's list, so the model has
to weigh cues, not spot one word. `--noise` of the training labels are flipped
(annotation noise; the evaluation rows are clean).

  teacher      BertForSequenceClassification (`--model`: MiniLM-L6's size, hidden 384, 6 layers) randomly
               initialised and fine-tuned by run.py (configs/finetune.py:local) for `--epochs`
  distilled    configs/finetune.py:distill from the teacher's layers 0,2,4 (soft T=2 + hard 0.5 + hidden cosine 1)
  hard_only    the same student, the same command with soft_weight=0 hidden_weight=0 hard_weight=1: fine-tuning the
               truncated teacher on the gold labels alone
  hard_small   hard_only on the first `--labelled` training rows alone (as many steps as hard_only)
  transfer     the student distilled on the other training rows with their labels dropped (unlabelled transfer
               data: soft + hidden only; the teacher saw their labels, the student never does)

Each run is a run.py subprocess (start-up, caching the teacher's outputs and compiles included in its wall time).
Then `jbert.predict` on the evaluation sentences, teacher vs student: the first call (loading, compiling,
predicting), then the best of `--predict_repeats` calls of a loaded Predictor over the sentences x 4, the two models
alternating in blocks so that the host's load falls on both.

`--step_timing`: one training step of the student (batch 32, sequence 64, float32) with the teacher's outputs read
from the batch (what the task does) vs with the frozen teacher's forward pass inside the jitted step, and what
caching costs (the teacher's forward over the training rows, once per run, and its memory).
The last line printed is one JSON object (also `--out/results.json`).
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

from absl import app
from absl import flags
import numpy as np

import finetune_e2e  # bench/, the script's own folder
import timing

REPO = pathlib.Path(__file__).resolve().parents[1]

# finetune_e2e's flags serve here too: --out, --text, --vocab, --sst2_rows (training, held-out rows), --sst2_seq,
# --epochs (the teacher's), --learning_rate (every run's), --model (the teacher: hidden, layers, heads,
# intermediate; MiniLM-L6's size by default), --seed.
F = finetune_e2e
_LABELLED = flags.DEFINE_integer("labelled", 1000, "Gold rows of the transfer comparison (0: skip it).")
_NOISE = flags.DEFINE_float("noise", 0.1, "Share of training labels flipped.")
_STUDENT_EPOCHS = flags.DEFINE_float("student_epochs", 1.0, "Student epochs.")
_LAYERS = flags.DEFINE_string("student_layers", "0,2,4", "Teacher layers of the student.")
_REPEATS = flags.DEFINE_integer("predict_repeats", 6, "Timed Predictor calls per model.")
_STEP_TIMING = flags.DEFINE_bool("step_timing", True, "Time the teacher cached vs inside the step.")


def sentiment_rows(words: list[str], n: int, seed: int, max_words: int, noise: float = 0.0) -> list[dict]:
  """SST-2-length sentences with 1 or 3 keywords; label = the majority's list, then `noise` of them flipped."""
  rng = np.random.default_rng(seed)
  rows = finetune_e2e.sst2_rows(words, n, seed, max_words)
  out = []
  for row in rows:
    sentence = [w for w in row["sentence"].split() if w not in finetune_e2e.POSITIVE + finetune_e2e.NEGATIVE]
    k = int(rng.choice((1, 3)))
    positive = rng.random(k) < 0.5
    for p in positive:
      at = int(rng.integers(len(sentence) + 1))
      sentence.insert(at, str(rng.choice(finetune_e2e.POSITIVE if p else finetune_e2e.NEGATIVE)))
    label = bool(positive.sum() * 2 > k)
    if rng.random() < noise:
      label = not label
    out.append({"sentence": " ".join(sentence), "label": ("neg", "pos")[label]})
  return out


def make_model(directory: pathlib.Path, vocab: str, hidden: int, layers: int, heads: int, intermediate: int,
               seed: int) -> pathlib.Path:
  """A randomly initialised BERT saved by jbert as a Hugging Face folder, with `vocab` beside it.

  Not `finetune_e2e.make_model`: transformers 5's `BertTokenizerFast(vocab_file=...)` builds a 5-piece tokenizer
  (the specials) and saves only its tokenizer.json, so every word of its runs reads as [UNK].
  """
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jbert  # pylint: disable=g-import-not-at-top
  from jbert.model import init_params  # pylint: disable=g-import-not-at-top
  size = len(pathlib.Path(vocab).read_text(encoding="utf-8").splitlines())
  config = jbert.BertConfig(vocab_size=size, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                            intermediate_size=intermediate)
  params = nn.meta.unbox(init_params(jbert.BertForPreTraining(config), jax.random.key(seed)))
  jbert.save_pretrained(config, params, directory, jbert.BertForPreTraining)
  shutil.copy(vocab, directory / "vocab.txt")
  return directory


def run(name: str, root: pathlib.Path, config: str, settings: dict) -> dict:
  """A run.py subprocess's wall time, steps and held-out accuracy; a rerun of the bench into the same --out reuses
  the runs it finished (runs/NAME.json)."""
  workdir, summary = root / "runs" / name, root / "runs" / f"{name}.json"
  if summary.exists():
    return json.loads(summary.read_text())
  command = [sys.executable, str(REPO / "run.py"), f"--config={REPO / 'configs' / 'finetune.py'}:{config}",
             f"--workdir={workdir}", *(f"--config.{k}={v}" for k, v in settings.items())]
  workdir.parent.mkdir(parents=True, exist_ok=True)
  start = time.perf_counter()
  with open(root / "runs" / f"{name}.log", "w", encoding="utf-8") as log:
    subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
  results = json.loads((workdir / "results.json").read_text())
  out = {"wall_s": round(time.perf_counter() - start, 1), "steps": results["step"],
         "accuracy": round(results["metrics"]["validation"]["accuracy"], 4)}
  print(f"{name}: {json.dumps(out)}", flush=True)
  summary.write_text(json.dumps(out))
  return out


class _Served:
  """A loaded `jbert.inference.Predictor` and its examples: `call()` predicts them all (what a server repeats)."""

  def __init__(self, model: str, texts: list[str]):
    from jbert.inference import Predictor  # pylint: disable=g-import-not-at-top
    self.predictor = Predictor(model)
    self.examples = self.predictor.examples(texts)

  def call(self):
    return self.predictor(self.examples, progress=False)


def predict_timing(models: dict[str, str], texts: list[str], gold: list[str]) -> dict:
  """Per model: the first `jbert.predict` call (load, compile, predict) and, on a loaded Predictor, the best of
  `--predict_repeats` calls over `texts` x 4, the models alternating in blocks (`timing.blocks`)."""
  import jbert  # pylint: disable=g-import-not-at-top
  out = {}
  for name, model in models.items():
    first, records = timing.timed(jbert.predict, texts, model)
    out[name] = {"first_call_s": round(first, 2),
                 "accuracy": round(float(np.mean(np.array([r["label"] for r in records]) == np.array(gold))), 4)}
  served = {name: _Served(model, texts * 4) for name, model in models.items()}
  blocks = timing.blocks(served, "call", timed=max(2, _REPEATS.value), rounds=3, warmup=1)
  for name in models:
    out[name].update(rows=len(texts) * 4, best_s=round(min(blocks.seconds[name]), 3),
                     cpu_s=round(min(blocks.cpu_seconds[name]), 3))
  return out


def step_timing(root: pathlib.Path, teacher: str, distil_settings: dict) -> dict:
  """The student's training step with cached teacher outputs vs with the teacher inside, and the cache's cost."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  import jbert  # pylint: disable=g-import-not-at-top
  from jbert import tasks  # pylint: disable=g-import-not-at-top
  from jbert.tokenizer import load_tokenizer  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, str(REPO))
  from configs import finetune  # pylint: disable=g-import-not-at-top
  config = finetune.get_config("distill")
  config.update_from_flattened_dict({**{k: str(v) if isinstance(v, pathlib.Path) else v
                                       for k, v in distil_settings.items()}, "model.scan_layers": False})
  tokenizer = load_tokenizer(str(pathlib.Path(teacher) / "vocab.txt"))
  start = time.perf_counter()
  task = tasks.build_task(config, tokenizer)
  built = time.perf_counter() - start
  cache_s, features = timing.timed(task.train_features)  # the teacher's pass, as making the training stream runs it
  # the hidden states of the rows' tokens (jbert/tasks/distillation/teacher_cache.py), or None
  hidden = task.hidden_cache
  cache_mib = (features["teacher_logits"].nbytes + (hidden.nbytes if hidden is not None else 0)) / 2**20
  t_config, t_params = jbert.load_pretrained(teacher, jbert.BertForSequenceClassification, scan_layers=False)
  s_config = t_config.replace(num_hidden_layers=len(task.layers))
  s_params = task.load_init(teacher, s_config, seed=0, fresh=None)
  teacher_model = jbert.BertForSequenceClassification(t_config, num_labels=task.num_labels)
  student_model = task.model(s_config)
  tx = optax.adamw(1e-4)
  seq = F._SST2_SEQ.value
  batch = {k: features[k][:32, ..., :seq] if k != "teacher_logits" and features[k].ndim > 1 else features[k][:32]
           for k in task.batch_spec(32, seq) if k != "teacher_hidden"}
  if hidden is not None:
    batch["teacher_hidden"] = hidden.batch(list(range(32)), seq)
  inputs = {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask", "label")}

  def student_step(params, opt_state, batch):
    def loss_fn(p):
      out = task.apply(student_model, p, batch, jax.random.key(0), deterministic=False)
      return tasks.training_loss(task, task.loss(out, batch))
    grads = jax.grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  cached = jax.jit(student_step)

  @jax.jit
  def in_step(params, opt_state, teacher_params, batch):
    out = teacher_model.apply({"params": teacher_params}, batch["input_ids"], token_type_ids=batch["token_type_ids"],
                              attention_mask=batch["attention_mask"], deterministic=True,
                              output_hidden_states=task.hidden_weight > 0)
    full = {**batch, "teacher_logits": jax.lax.stop_gradient(out.logits.astype(jnp.float32))}
    if task.hidden_weight > 0:
      hidden = jnp.stack([out.hidden_states[i] for i in task.layer_map], 1).astype(jnp.float32)
      full["teacher_hidden"] = jax.lax.stop_gradient(jnp.swapaxes(hidden, 2, 3))
    return student_step(params, opt_state, full)

  opt_state = tx.init(s_params)
  block = lambda tree: jax.block_until_ready(tree)
  cached_s = timing.best_seconds(lambda: block(cached(s_params, opt_state, batch)), repeats=10, warmup=2)
  in_step_s = timing.best_seconds(lambda: block(in_step(s_params, opt_state, t_params, inputs)), repeats=10,
                                  warmup=2)
  rows = len(features["input_ids"])
  return {"batch": 32, "seq": F._SST2_SEQ.value, "cached_step_ms": round(cached_s * 1e3, 1),
          "teacher_in_step_ms": round(in_step_s * 1e3, 1), "in_step_over_cached": round(in_step_s / cached_s, 2),
          "cache_rows": rows, "cache_s": round(cache_s, 1), "cache_mib": round(cache_mib, 1),
          "task_build_s": round(built, 1)}


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if not F._OUT.value:
    raise app.UsageError("--out=DIR is required.")
  root = pathlib.Path(F._OUT.value)
  (root / "data").mkdir(parents=True, exist_ok=True)
  hidden, layers, heads, intermediate = (int(x) for x in F._MODEL.value)
  words = finetune_e2e.source_words(pathlib.Path(F._TEXT.value).read_text(encoding="utf-8"))
  init = str(make_model(root / "model", F._VOCAB.value, hidden, layers, heads, intermediate, F._SEED.value))
  max_words = F._SST2_SEQ.value // 2 - 4
  train = sentiment_rows(words, int(F._SST2_ROWS.value[0]), F._SEED.value, max_words, _NOISE.value)
  dev = sentiment_rows(words, int(F._SST2_ROWS.value[1]), F._SEED.value + 1, max_words)
  files = {"train": finetune_e2e.write_csv(root / "data" / "train.csv", train),
           "dev": finetune_e2e.write_csv(root / "data" / "dev.csv", dev)}
  common = {"task.eval_file": files["dev"], "task.text_a": "sentence", "data.max_seq_length": F._SST2_SEQ.value,
            "optim.learning_rate": F._LR.value, "seed": F._SEED.value}
  report = {"teacher": dict(hidden=hidden, layers=layers, heads=heads, intermediate=intermediate),
            "student_layers": _LAYERS.value, "train_rows": len(train), "eval_rows": len(dev), "noise": _NOISE.value,
            "threads": len(os.sched_getaffinity(0)), "runs": {}}
  runs = report["runs"]
  runs["teacher"] = run("teacher", root, "local", {
      **common, "init_from": init, "task.train_file": files["train"], "task.label": "label",
      "task.label_names": "neg,pos", "num_epochs": F._EPOCHS.value})
  teacher = str(root / "runs" / "teacher" / "export")
  distil = {**common, "task.teacher": teacher, "task.student_layers": _LAYERS.value, "task.label": "label",
            "num_epochs": _STUDENT_EPOCHS.value}
  runs["distilled"] = run("distilled", root, "distill", {**distil, "task.train_file": files["train"],
                                                          "task.hidden_weight": 1.0})
  runs["hard_only"] = run("hard_only", root, "distill", {**distil, "task.train_file": files["train"],
                                                          "task.soft_weight": 0.0, "task.hard_weight": 1.0})
  if _LABELLED.value:
    n = _LABELLED.value
    small = finetune_e2e.write_csv(root / "data" / "labelled.csv", train[:n])
    unlabelled = finetune_e2e.write_csv(root / "data" / "unlabelled.csv", [{"sentence": r["sentence"]}
                                                                           for r in train[n:]])
    epochs_small = _STUDENT_EPOCHS.value * len(train) / n  # the same number of steps as the full runs
    runs["hard_small"] = run("hard_small", root, "distill", {**distil, "task.train_file": small,
                                                              "task.soft_weight": 0.0, "task.hard_weight": 1.0,
                                                              "num_epochs": epochs_small})
    runs["transfer"] = run("transfer", root, "distill", {**distil, "task.train_file": unlabelled,
                                                          "task.hidden_weight": 1.0})
  texts = [r["sentence"] for r in dev]
  gold = [r["label"] for r in dev]
  predict = predict_timing({"teacher": teacher, "student": str(root / "runs" / "distilled" / "export")}, texts, gold)
  predict["speedup"] = round(predict["teacher"]["best_s"] / predict["student"]["best_s"], 2)
  report["predict"] = predict
  print(f"predict: {json.dumps(report['predict'])}", flush=True)
  if _STEP_TIMING.value:
    report["step_timing"] = step_timing(root, teacher, {**distil, "task.train_file": str(files["train"]),
                                                        "task.hidden_weight": 1.0})
  (root / "results.json").write_text(json.dumps(report, indent=2))
  print(json.dumps(report))


if __name__ == "__main__":
  app.run(main)
