r"""NER F1 of the CRF head against the softmax head on a CoNLL-shaped synthetic set, same model, data and steps.

  python bench/ner_crf.py [--train=2000 --eval=300 --steps=800 --batch=32 --seeds=0,1 --workdir=DIR]

The data (generated, seeded): CoNLL-2003's nine IOB2 tags (PER, ORG, LOC, MISC), sentences of 4 to 30 words; an
entity has 1 to 3 words, each from its type's own names (60%) or from names any type uses, half of the entities
(and every one whose words are all shared names) follow a marker word of their type (tagged O), and an O word
ends each; every other word comes from a separate pool. The tags are thus a function of the words: an entity's
type is its marker's, or that of any of its own-type words. A third of the words get a "##s" piece, so tags sit
on first sub-tokens. The model is a 2-layer, 64-wide BERT trained from scratch by `configs/finetune.py:local`
(task.kind=ner, then with task.crf=true) through the shared trainer: sequence 32 (long sentences take 2-3 windows), Adam 5e-3, no dropout.

Per head and seed: the validation split's entity F1 (seqeval), the number of predicted sentences that break IOB2
(an I-X not after B-X/I-X), and the wall time of the run. Prints one line per run and, last, one JSON object.
"""
from __future__ import annotations

import json
import pathlib
import statistics
import sys
import tempfile
import time

from absl import app
from absl import flags
import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from configs import finetune  # noqa: E402
from jbert.train import trainer  # noqa: E402

_TRAIN = flags.DEFINE_integer("train", 2000, "Training sentences.")
_EVAL = flags.DEFINE_integer("eval", 300, "Validation sentences.")
_STEPS = flags.DEFINE_integer("steps", 800, "Training steps per run.")
_BATCH = flags.DEFINE_integer("batch", 32, "Sentences (windows) per batch.")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1"], "Seeds (data and model) of the runs.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Where the runs' workdirs go (default: a temporary folder).")

TYPES = ("PER", "ORG", "LOC", "MISC")
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# Entity words: each type's own ("b..." PER, "d..." ORG, "f..." LOC, "g..." MISC) and a pool any type may use, whose
# type only the entity's other words or the marker tell.
OWN = {t: tuple(c + v for v in "aeiou") for t, c in zip(TYPES, "bdfg")}
SHARED = tuple(c + v for c in "kl" for v in "aeiou")
NAMES = (*(w for words in OWN.values() for w in words), *SHARED)
OTHERS = tuple(c + v for c in "mnprst" for v in "aeiou")  # the rest


def write_vocab(path: pathlib.Path) -> str:
  path.write_text("\n".join((*SPECIALS, *(t.lower() for t in TYPES), *NAMES, *OTHERS, "##s")) + "\n",
                  encoding="utf-8")
  return str(path)


def sentences(rng: np.random.Generator, n: int, min_words: int = 4, max_words: int = 30) -> list[dict]:
  out = []
  for _ in range(n):
    tokens, tags = [], []
    length = rng.integers(min_words, max_words + 1)
    while len(tokens) < length:
      if rng.random() < 0.3:
        type_ = TYPES[rng.integers(len(TYPES))]
        words = [OWN[type_][rng.integers(5)] if rng.random() < 0.6 else SHARED[rng.integers(len(SHARED))]
                 for _ in range(rng.integers(1, 4))]
        # A marker for half of the entities, and for every one that none of its words types.
        marker = [type_.lower()] if rng.random() < 0.5 or not set(words) - set(SHARED) else []
        tokens += [*marker, *words, OTHERS[rng.integers(len(OTHERS))]]  # an O word after it: a clear boundary
        tags += ["O"] * len(marker) + [f"B-{type_}", *[f"I-{type_}"] * (len(words) - 1), "O"]
      else:
        tokens.append(OTHERS[rng.integers(len(OTHERS))])
        tags.append("O")
    tokens = [w + "s" if rng.random() < 0.3 else w for w in tokens]
    out.append({"tokens": tokens, "tags": tags})
  return out


def write_conll(path: pathlib.Path, rows: list[dict]) -> str:
  lines = []
  for s in rows:
    lines += [f"{w} {t}" for w, t in zip(s["tokens"], s["tags"])] + [""]
  path.write_text("\n".join(lines), encoding="utf-8")
  return str(path)


def iob2_breaks(tags: list[str]) -> bool:
  """Whether a tag sequence takes a transition IOB2 forbids."""
  previous = "O"
  for tag in tags:
    if tag.startswith("I-") and previous[2:] != tag[2:]:
      return True
    previous = tag
  return False


def config(vocab: str, train_file: str, eval_file: str, *, crf: bool, steps: int, batch: int, seed: int):
  cfg = finetune.get_config("local")
  settings = {
      "task.kind": "ner", "task.crf": crf, "task.train_file": train_file, "task.eval_file": eval_file,
      "model.preset": "tiny", "model.hidden_size": 64, "model.num_hidden_layers": 2, "model.num_attention_heads": 2,
      "model.intermediate_size": 128, "model.max_position_embeddings": 64, "model.scan_layers": False,
      "model.hidden_dropout_prob": 0.0, "model.attention_probs_dropout_prob": 0.0, "data.vocab": vocab,
      "data.max_seq_length": 32, "batch_size": batch, "total_steps": steps, "log_every_steps": max(1, steps // 5),
      "checkpoint_every_steps": 0, "async_checkpointing": False, "optim.learning_rate": 5e-3,
      "optim.warmup_steps": 10, "seed": seed}
  cfg.update_from_flattened_dict(settings)
  return cfg


def run_one(root: pathlib.Path, vocab: str, head: str, seed: int) -> dict:
  rng = np.random.default_rng(seed)
  train_file = write_conll(root / f"train{seed}.txt", sentences(rng, _TRAIN.value))
  eval_file = write_conll(root / f"dev{seed}.txt", sentences(rng, _EVAL.value))
  workdir = root / f"{head}{seed}"
  start = time.perf_counter()
  trainer.train_and_evaluate(config(vocab, train_file, eval_file, crf=head == "crf", steps=_STEPS.value,
                                    batch=_BATCH.value, seed=seed), str(workdir))
  seconds = time.perf_counter() - start
  scores = json.loads((workdir / "results.json").read_text())["metrics"]["validation"]
  blocks = (workdir / "predictions" / "validation.conll").read_text(encoding="utf-8").strip("\n").split("\n\n")
  predicted = [[line.split(" ")[-1] for line in block.splitlines()] for block in blocks]
  return {"head": head, "seed": seed, "f1": scores["f1"], "precision": scores["precision"],
          "recall": scores["recall"], "iob2_breaking_sentences": sum(map(iob2_breaks, predicted)),
          "sentences": len(predicted), "seconds": round(seconds, 1), "workdir": str(workdir)}


def main(argv):
  del argv
  root = pathlib.Path(_WORKDIR.value or tempfile.mkdtemp(prefix="ner_crf_bench_"))
  root.mkdir(parents=True, exist_ok=True)
  vocab = write_vocab(root / "vocab.txt")
  runs = []
  for seed in map(int, _SEEDS.value):
    for head in ("softmax", "crf"):
      runs.append(run_one(root, vocab, head, seed))
      r = runs[-1]
      print(f"{head:8s} seed {seed}: F1 {r['f1']:.4f} (P {r['precision']:.4f} R {r['recall']:.4f}), "
            f"{r['iob2_breaking_sentences']}/{r['sentences']} sentences break IOB2, {r['seconds']} s", flush=True)
  summary = {head: {"f1_mean": statistics.fmean(r["f1"] for r in runs if r["head"] == head),
                    "iob2_breaking_sentences": sum(r["iob2_breaking_sentences"] for r in runs if r["head"] == head)}
             for head in ("softmax", "crf")}
  print(json.dumps({"train": _TRAIN.value, "eval": _EVAL.value, "steps": _STEPS.value, "batch": _BATCH.value,
                    "summary": summary, "runs": runs}))


if __name__ == "__main__":
  app.run(main)
