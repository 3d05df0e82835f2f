"""SQuAD 1.1 exact match and F1 of one fine-tuning recipe in jbert and in transformers + PyTorch, over seeds.

Both systems train the same model folder on the same windows: jbert's `squad_features` (max_seq_length,
doc_stride as the step between window starts, max_query_length), which `run.py` trains on and the transformers
side is given as its training set, so a gap cannot come from the windows. The recipe is `configs/finetune.py:squad`'s:
AdamW (b1 0.9, b2 0.999, eps 1e-6, weight decay 0.01 except biases and LayerNorm), linear warmup over 10% of the
steps then linear decay to 0, clipping at 1.0, the model's dropout, `ceil(epochs * windows / batch)` steps of
seeded epoch permutations. jbert is `run.py`'s trainer (`train_and_evaluate`); transformers is
`BertForQuestionAnswering` in a plain loop, as `run_qa.py`'s Trainer runs it. Both answer through jbert's span
search (n-best 20, at most 30 tokens, maximal-context windows) and the official v1.1 scoring, so a gap is the
training's. Each (system, seed) writes `results.json` in its folder under `out`; a rerun reuses what is there.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import statistics
import sys
import time
from typing import Any

import numpy as np

# `python bench/finetune_squad.py` from a checkout, without installing jbert.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch_optim  # noqa: E402  (bench/)
from configs import finetune  # noqa: E402
from jbert import tokenizer as tokenizer_lib  # noqa: E402
from jbert.tasks.question_answering import evaluation as squad_eval  # noqa: E402
from jbert.tasks.question_answering import features as squad  # noqa: E402
from jbert.data import streams  # noqa: E402
from jbert.train import optim  # noqa: E402
from jbert.train import trainer  # noqa: E402

SYSTEMS = ("jbert", "torch")


@dataclasses.dataclass(frozen=True)
class Recipe:
  model: str  # a Hugging Face BERT folder with its tokenizer
  train_file: str  # SQuAD 1.1 JSON
  eval_file: str
  out: str
  seeds: tuple[int, ...] = (0, 1, 2)
  train_questions: int | None = None  # the first N questions of train_file (None: all)
  eval_questions: int | None = None
  batch: int = 32
  epochs: float = 2.0
  learning_rate: float = 3e-5
  max_seq_length: int = 384
  doc_stride: int = 128
  max_query_length: int = 64

  def config(self, seed: int):
    """configs/finetune.py:squad with this recipe, as `run.py --config.KEY=...` would give it."""
    config = finetune.get_config("squad")
    config.update_from_flattened_dict({
        "init_from": self.model, "task.train_file": self.files()[0], "task.eval_file": self.files()[1],
        "seed": seed, "batch_size": self.batch, "num_epochs": self.epochs, "optim.learning_rate": self.learning_rate,
        "data.max_seq_length": self.max_seq_length, "task.doc_stride": self.doc_stride,
        "task.max_query_length": self.max_query_length, "checkpoint_every_steps": 0, "async_checkpointing": False,
        "log_every_steps": 100})
    return config

  def files(self) -> tuple[str, str]:
    return (os.path.join(self.out, "data", "train.json"), os.path.join(self.out, "data", "dev.json"))


def write_data(recipe: Recipe) -> tuple[list[dict], list[dict]]:
  """The (first N) questions of the train and eval files, written as SQuAD JSON where both systems read them."""
  out = []
  for source, target, limit in zip((recipe.train_file, recipe.eval_file), recipe.files(),
                                   (recipe.train_questions, recipe.eval_questions)):
    examples = squad.read_squad_json(source)[:limit]
    paragraphs = [{"context": ex["context"], "qas": [{"id": ex["id"], "question": ex["question"], "answers": [
        {"text": t, "answer_start": int(s)} for t, s in zip(ex["answers"]["text"], ex["answers"]["answer_start"])]}]}
        for ex in examples]
    pathlib.Path(target).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(target).write_text(json.dumps({"version": "1.1", "data": [{"title": "bench", "paragraphs":
                                                                               paragraphs}]}), encoding="utf-8")
    out.append(examples)
  return out[0], out[1]


def run_jbert(recipe: Recipe, seed: int) -> dict[str, Any]:
  folder = os.path.join(recipe.out, f"jbert_seed{seed}")
  start = time.perf_counter()
  trainer.train_and_evaluate(recipe.config(seed), folder)
  results = json.loads(pathlib.Path(folder, "results.json").read_text())
  metrics = results["metrics"]["validation"]
  return {"exact_match": metrics["exact_match"], "f1": metrics["f1"], "seconds": time.perf_counter() - start}


def run_torch(recipe: Recipe, seed: int, train_examples: list[dict], eval_examples: list[dict]) -> dict[str, Any]:
  """transformers' BertForQuestionAnswering on jbert's training windows, with the recipe's optimiser and
  schedule; answers from jbert's span search over its evaluation windows."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  folder = pathlib.Path(recipe.out, f"torch_seed{seed}")
  if (folder / "results.json").exists():
    return json.loads((folder / "results.json").read_text())
  start = time.perf_counter()
  config = recipe.config(seed)
  tok = tokenizer_lib.load_tokenizer(recipe.model)
  windows = dict(max_seq_length=recipe.max_seq_length, doc_stride=recipe.doc_stride,
                 max_query_length=recipe.max_query_length)
  train = squad.squad_features(train_examples, tok, training=True, require_answers=True, **windows)
  evaluation = squad.squad_features(eval_examples, tok, **windows)
  total = streams.total_steps_for(len(train["input_ids"]), recipe.batch, recipe.epochs)
  warmup = optim.warmup_steps(config.optim, total)
  torch.manual_seed(seed)
  model = transformers.BertForQuestionAnswering.from_pretrained(recipe.model).train()
  optimizer = torch_optim.adamw_from_config(model, config.optim)
  scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: linear_schedule(step, warmup, total))
  keys = ("input_ids", "token_type_ids", "attention_mask", "start_positions", "end_positions")
  rng = np.random.default_rng(seed)
  order = np.concatenate([rng.permutation(len(train["input_ids"]))
                          for _ in range(math.ceil(total * recipe.batch / len(train["input_ids"])))])
  losses = []
  for step in range(total):
    rows = order[step * recipe.batch:(step + 1) * recipe.batch]
    loss = model(**{k: torch.from_numpy(train[k][rows].astype(np.int64)) for k in keys}).loss
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), config.optim.grad_clip_norm)
    optimizer.step()
    scheduler.step()
    losses.append(loss.item())
  model.eval()
  starts, ends = [], []
  with torch.no_grad():
    for begin in range(0, len(evaluation["input_ids"]), 64):
      out = model(**{k: torch.from_numpy(evaluation[k][begin:begin + 64].astype(np.int64)) for k in keys[:3]})
      starts.append(out.start_logits.numpy())
      ends.append(out.end_logits.numpy())
  post = squad_eval.postprocess(evaluation, np.concatenate(starts), np.concatenate(ends),
                                n_best=config.task.n_best_size, max_answer_length=config.task.max_answer_length,
                                version_2_with_negative=False)
  metrics = squad_eval.squad_metrics(post.answers, squad.squad_references(eval_examples),
                                     version_2_with_negative=False)
  result = {"exact_match": metrics["exact_match"], "f1": metrics["f1"], "seconds": time.perf_counter() - start,
            "steps": total, "windows": len(train["input_ids"]), "first_loss": losses[0], "last_loss": losses[-1]}
  folder.mkdir(parents=True, exist_ok=True)
  (folder / "results.json").write_text(json.dumps(result))
  return result


def linear_schedule(step: int, warmup: int, total: int) -> float:
  """jbert's `linear` schedule (`jbert.train.optim.make_schedule`) as a factor of the peak, for LambdaLR: `step`
  is the number of updates taken before this one."""
  if step < warmup:
    return step / max(warmup, 1)
  return min(max((total - step) / max(total - warmup, 1), 0.0), 1.0)


def summarise(scores: list[dict[str, Any]]) -> dict[str, float]:
  """Mean and sample standard deviation (n - 1) of EM and F1 over seeds."""
  out = {}
  for key in ("exact_match", "f1"):
    values = [s[key] for s in scores]
    out[f"{key}_mean"] = statistics.fmean(values)
    out[f"{key}_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
  return out


def welch_t(a: list[float], b: list[float]) -> float | None:
  """Welch's t statistic of mean(a) - mean(b); None with fewer than two values a side or no spread."""
  if len(a) < 2 or len(b) < 2:
    return None
  spread = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
  return (statistics.fmean(a) - statistics.fmean(b)) / spread if spread else None


def run(recipe: Recipe, systems=SYSTEMS) -> dict[str, Any]:
  """Every (system, seed) of the recipe; the benchmark's JSON fields."""
  train_examples, eval_examples = write_data(recipe)
  tok = tokenizer_lib.load_tokenizer(recipe.model)
  windows = len(squad.squad_features(train_examples, tok, recipe.max_seq_length, doc_stride=recipe.doc_stride,
                                     max_query_length=recipe.max_query_length, training=True,
                                     require_answers=True)["input_ids"])
  result: dict[str, Any] = {"train_questions": len(train_examples), "eval_questions": len(eval_examples),
                            "train_windows": windows, "seeds": list(recipe.seeds),
                            "steps": streams.total_steps_for(windows, recipe.batch, recipe.epochs)}
  for system in systems:
    scores = [run_jbert(recipe, s) if system == "jbert" else run_torch(recipe, s, train_examples, eval_examples)
              for s in recipe.seeds]
    result[system] = {"per_seed": scores, **summarise(scores)}
  if all(s in result for s in SYSTEMS):
    for key in ("exact_match", "f1"):
      a, b = ([s[key] for s in result[name]["per_seed"]] for name in SYSTEMS)
      result[f"{key}_difference"] = statistics.fmean(a) - statistics.fmean(b)
      result[f"{key}_welch_t"] = welch_t(a, b)
  return result
