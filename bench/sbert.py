r"""Bi-encoder training on this host: jbert's mnrl train step beside sentence-transformers' own loss on PyTorch,
and an STS Spearman report of the same recipe in both.

  python bench/sbert.py [--sizes=minilm,base --batch=32 --seq=64 --steps=4 --rounds=2] [--sts_steps=300]

Throughput: MultipleNegativesRankingLoss (scale 20, cosine, in-batch negatives) on (anchor, positive) pairs with mean
pooling, from the same initial weights: jbert's train step (`configs/finetune.py:mnrl`: forward, backward, AdamW
with clipping and weight decay, dropout on, float32) against a plain PyTorch loop over sentence-transformers'
`MultipleNegativesRankingLoss` on a `SentenceTransformer` (Transformer + Pooling), torch AdamW with the same
groups, clipping and hyper-parameters, one fixed batch of random ids, the same threads. `minilm` is MiniLM-L6's
shape (hidden 384, 6 layers, 12 heads, intermediate 1536), `base` BERT-base's. Blocks alternate between the
frameworks over `rounds` (one untimed step after each switch); pairs/s are batch / median step time.

STS report (`--sts_steps` > 0): a small encoder (hidden 128, 2 layers), randomly initialised once and saved, is
trained with mnrl on generated paraphrases (concepts named by one of two synonyms, reordered) by `run.py`'s trainer
and by the same recipe in sentence-transformers (same initial weights, batch, steps, learning rate, warmup, decay,
clipping); both are scored by Spearman of cosine similarity on generated pairs whose gold score is the share of
concepts they have in common (0..5). The last line is a JSON object.
"""
from __future__ import annotations

import json
import os
import pathlib
import random
import statistics
import sys
import tempfile
import time

from absl import app
from absl import flags
import flax.linen as nn
import jax
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from configs import finetune  # noqa: E402
import jbert_step  # noqa: E402  (bench/, the script's own folder)
import timing  # noqa: E402
import torch_optim  # noqa: E402
from jbert import weights  # noqa: E402
from jbert.model import BertConfig, BertModel  # noqa: E402
from jbert.runtime import flops  # noqa: E402
from jbert.tasks import build_task  # noqa: E402

_SIZES = flags.DEFINE_list("sizes", ["minilm", "base"], "Model shapes to time: minilm, base.")
_BATCH = flags.DEFINE_integer("batch", 32, "(anchor, positive) pairs per step.")
_SEQ = flags.DEFINE_integer("seq", 64, "Tokens per text.")
_STEPS = flags.DEFINE_integer("steps", 4, "Timed train steps per framework and size.")
_ROUNDS = flags.DEFINE_integer("rounds", 2, "Alternating blocks per framework.")
_STS_STEPS = flags.DEFINE_integer("sts_steps", 300, "Training steps of the STS report; 0 skips it.")
_STS_BATCH = flags.DEFINE_integer("sts_batch", 32, "Pairs per step of the STS report.")
_STS_LR = flags.DEFINE_float("sts_lr", 5e-4, "Peak learning rate of the STS report (10% warmup, linear decay).")

SIZES = {"minilm": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536),
         "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
         "sts": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512)}
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def write_model(folder: pathlib.Path, config: BertConfig, params, words: list[str]) -> str:
  """A Hugging Face BertModel folder with a WordPiece vocabulary of `words`, which sentence-transformers loads."""
  import transformers  # pylint: disable=g-import-not-at-top
  weights.save_pretrained(config, params, folder, BertModel)
  (folder / "vocab.txt").write_text("\n".join(SPECIALS + words) + "\n", encoding="utf-8")
  transformers.BertTokenizer(vocab=str(folder / "vocab.txt")).save_pretrained(folder)
  return str(folder)


def fresh_params(config: BertConfig, seed: int = 0):
  from jbert.model import init_params  # pylint: disable=g-import-not-at-top
  params = jax.device_get(nn.meta.unbox(init_params(BertModel(config), jax.random.key(seed))))
  return params


def mnrl_config(**overrides):
  config = finetune.get_config("mnrl")
  config.model.dtype = "float32"
  config.update_from_flattened_dict(overrides)  # dotted keys; an unknown one raises
  return config


# -- throughput --


class _Jbert:

  def __init__(self, config: BertConfig, params, batch):
    cfg = mnrl_config()
    task = build_task(cfg)
    model = task.model(config)
    self._train, tx, state = jbert_step.constant_lr_train_step(cfg, task, model, (1, 2, 8))
    self.state = state.replace(params={"bert": params}, opt_state=jax.jit(tx.init)({"bert": params}))
    self.batch = jax.device_put(batch)

  def train(self) -> float:
    self.state, metrics = self._train(self.state, self.batch)
    return float(jax.block_until_ready(metrics)["loss"])


class _SentenceTransformers:
  """A plain PyTorch loop over sentence-transformers' own model and loss: what its trainer runs per step, without
  the data loader."""

  def __init__(self, folder: str, batch, max_seq_length: int, learning_rate: float | None = None):
    import torch  # pylint: disable=g-import-not-at-top
    from sentence_transformers import SentenceTransformer, losses, models  # pylint: disable=g-import-not-at-top
    self._torch = torch
    transformer = models.Transformer(folder, max_seq_length=max_seq_length)
    self.model = SentenceTransformer(modules=[transformer, models.Pooling(transformer.get_embedding_dimension(),
                                                                         pooling_mode="mean")], device="cpu")
    self.loss = losses.MultipleNegativesRankingLoss(self.model)
    cfg = mnrl_config().optim
    # The pooler is unused by the loss, as in jbert's SentenceEncoder.
    self.optimizer = torch_optim.adamw_from_config(self.model, cfg, learning_rate, skip=lambda n: "pooler" in n)
    self.set_batch(batch)

  def set_batch(self, batch) -> None:
    self.columns = [{k: self._torch.from_numpy(batch[k][:, j].astype(np.int64)) for k in
                     ("input_ids", "token_type_ids", "attention_mask")} for j in range(batch["input_ids"].shape[1])]

  def train(self) -> float:
    self.model.train()
    self.optimizer.zero_grad(set_to_none=True)
    loss = self.loss(self.columns, None)
    loss.backward()
    self._torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
    self.optimizer.step()
    return loss.item()


def random_pairs(vocab: int, batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
  """(anchor, positive) rows of random ids, lengths between seq/4 and seq."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(max(seq // 4, 3), seq + 1, (batch, 2, 1))
  positions = np.arange(seq)
  ids = rng.integers(1000, vocab, (batch, 2, seq))
  ids = np.where(positions == 0, 2, np.where(positions == lengths - 1, 3, ids))
  mask = (positions < lengths).astype(np.int32)
  return {"input_ids": (ids * mask).astype(np.int32), "token_type_ids": np.zeros_like(mask),
          "attention_mask": mask, "label": np.zeros(batch, np.float32)}


def throughput(size: str, tmp: pathlib.Path) -> dict:
  words = [f"w{i}" for i in range(30522 - len(SPECIALS))]
  config = BertConfig.from_preset("base", vocab_size=30522, max_position_embeddings=512, **SIZES[size])
  params = fresh_params(config)
  batch = random_pairs(config.vocab_size, _BATCH.value, _SEQ.value)
  folder = write_model(tmp / size, config, params, words)
  params.pop("pooler")
  runners = {"jbert": _Jbert(config, params, batch), "st": _SentenceTransformers(folder, batch, _SEQ.value)}
  times = timing.alternating_blocks(runners, "train", _STEPS.value, max(1, min(_ROUNDS.value, _STEPS.value)),
                                    warmup=2)
  out = {}
  for name, values in times.items():
    out[f"{size}_{name}_step_s"] = statistics.median(values)
    out[f"{size}_{name}_pairs_s"] = _BATCH.value / statistics.median(values)
  out[f"{size}_speedup_vs_st"] = out[f"{size}_st_step_s"] / out[f"{size}_jbert_step_s"]
  # The bound at equal work: the step's matmul FLOPs (both sides of every pair, forward and backward) at this
  # host's measured float32 matmul peak. No framework trains faster than this without doing less work.
  step_flops = flops.train_flops_per_step(config, batch_size=2 * _BATCH.value, seq_len=_SEQ.value, num_masked=0,
                                          nsp=False)
  peak = flops.measure_matmul_peak(np.float32)  # measured once per process
  out[f"{size}_bound_pairs_s"] = _BATCH.value / (step_flops / peak)
  out[f"{size}_jbert_of_bound"] = out[f"{size}_jbert_pairs_s"] / out[f"{size}_bound_pairs_s"]
  out[f"{size}_st_of_bound"] = out[f"{size}_st_pairs_s"] / out[f"{size}_bound_pairs_s"]
  out["matmul_peak_gflop_s"] = peak / 1e9
  return out



# -- STS report --


def sts_data(seed: int, concepts: int = 200):
  """(training paraphrases, scored evaluation pairs, words): concept i is `aI` on the first side of a pair and
  `bI` on the second, in another order, so that no two sides share a token and only learnt synonyms relate them."""
  rng = random.Random(seed)

  def sentence(picked, form):
    return " ".join(f"{form}{c}" for c in rng.sample(picked, len(picked)))

  train = []
  for _ in range(20_000):
    picked = rng.sample(range(concepts), rng.randint(4, 8))
    train.append({"s1": sentence(picked, "a"), "s2": sentence(picked, "b")})
  scored = []
  for _ in range(500):
    picked = rng.sample(range(concepts), 6)
    shared = rng.randint(0, 6)
    other = picked[:shared] + rng.sample([c for c in range(concepts) if c not in picked], 6 - shared)
    scored.append({"s1": sentence(picked, "a"), "s2": sentence(other, "b"), "score": 5.0 * shared / 6})
  return train, scored, [f"{p}{c}" for c in range(concepts) for p in "ab"]


def spearman(embed, rows) -> float:
  from scipy import stats  # pylint: disable=g-import-not-at-top
  u, v = embed([r["s1"] for r in rows]), embed([r["s2"] for r in rows])
  cosine = np.sum(u * v, -1) / np.linalg.norm(u, axis=-1) / np.linalg.norm(v, axis=-1)
  return float(stats.spearmanr(cosine, [r["score"] for r in rows])[0])


def sts_report(tmp: pathlib.Path) -> dict:
  import torch  # pylint: disable=g-import-not-at-top
  import jbert  # pylint: disable=g-import-not-at-top
  from jbert.train import trainer  # pylint: disable=g-import-not-at-top
  train_rows, scored, words = sts_data(0)
  steps, batch, seq, lr = _STS_STEPS.value, _STS_BATCH.value, 32, _STS_LR.value
  config = BertConfig.from_preset("base", vocab_size=len(SPECIALS) + len(words), max_position_embeddings=64,
                                  **SIZES["sts"])
  init = write_model(tmp / "sts_init", config, fresh_params(config, seed=1), words)
  with open(tmp / "train.jsonl", "w", encoding="utf-8") as f:
    f.writelines(json.dumps(r) + "\n" for r in train_rows)
  with open(tmp / "dev.jsonl", "w", encoding="utf-8") as f:
    f.writelines(json.dumps(r) + "\n" for r in scored)
  untrained = spearman(lambda texts: jbert.embed(texts, init, pooling="mean", max_length=seq), scored)
  files = {"task.train_file": str(tmp / "train.jsonl"), "task.text_a": "s1", "task.text_b": "s2",
           "data.max_seq_length": seq}
  cfg = mnrl_config(**files, **{"init_from": init, "total_steps": steps, "batch_size": batch,
                                "optim.learning_rate": lr, "task.eval_file": str(tmp / "dev.jsonl"),
                                "task.eval_kind": "scored", "task.label": "score", "task.score_range": "0,5",
                                "log_every_steps": max(steps // 4, 1), "checkpoint_every_steps": 0})
  start = time.perf_counter()
  trainer.train_and_evaluate(cfg, str(tmp / "jbert_run"))
  jbert_s = time.perf_counter() - start
  jbert_spearman = spearman(lambda texts: jbert.embed(texts, str(tmp / "jbert_run" / "export")), scored)
  # The same recipe in sentence-transformers: batches of shuffled rows, linear warmup (10%) then decay.
  tok = jbert.load_tokenizer(str(tmp / "sts_init" / "vocab.txt"))
  task = build_task(mnrl_config(**files), tok)
  features = task._train  # pylint: disable=protected-access
  order = np.random.default_rng(0).permutation(len(features["input_ids"]))
  st = _SentenceTransformers(init, {k: v[:batch] for k, v in features.items()}, seq, learning_rate=lr)
  warmup = int(round(0.1 * steps))
  schedule = torch.optim.lr_scheduler.LambdaLR(st.optimizer, lambda s: (s + 1) / max(warmup, 1) if s < warmup
                                               else max(0.0, (steps - s) / max(steps - warmup, 1)))
  start = time.perf_counter()
  for s in range(steps):
    rows = order[(s * batch) % len(order):][:batch]
    st.set_batch({k: v[rows] for k, v in features.items()})
    loss = st.train()
    schedule.step()
  if not np.isfinite(loss):
    raise RuntimeError(f"sentence-transformers' training diverged (loss {loss}).")
  st_s = time.perf_counter() - start
  st.model.eval()
  st_spearman = spearman(lambda texts: st.model.encode(texts, convert_to_numpy=True), scored)
  return {"sts_steps": steps, "sts_batch": batch, "sts_untrained_spearman": untrained,
          "sts_jbert_spearman": jbert_spearman, "sts_st_spearman": st_spearman, "sts_jbert_train_s": jbert_s,
          "sts_st_train_s": st_s}


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  import torch  # pylint: disable=g-import-not-at-top
  threads = len(os.sched_getaffinity(0))
  torch.set_num_threads(threads)
  r = {"batch": _BATCH.value, "seq": _SEQ.value, "threads": threads, "load_avg_1m": os.getloadavg()[0]}
  with tempfile.TemporaryDirectory() as tmp:
    for size in _SIZES.value:
      if size not in ("minilm", "base"):
        raise app.UsageError(f"--sizes: {size!r} is not minilm or base.")
      r.update(throughput(size, pathlib.Path(tmp)))
      print(f"{size}: jbert {r[f'{size}_jbert_pairs_s']:.1f} pairs/s, sentence-transformers "
            f"{r[f'{size}_st_pairs_s']:.1f} pairs/s -> {r[f'{size}_speedup_vs_st']:.2f}x "
            f"(batch {_BATCH.value} pairs x {_SEQ.value} tokens, {threads} threads); matmul bound "
            f"{r[f'{size}_bound_pairs_s']:.1f} pairs/s at {r['matmul_peak_gflop_s']:.0f} GFLOP/s", flush=True)
    if _STS_STEPS.value > 0:
      r.update(sts_report(pathlib.Path(tmp)))
      print(f"STS Spearman after {r['sts_steps']} mnrl steps: jbert {r['sts_jbert_spearman']:.3f}, "
            f"sentence-transformers {r['sts_st_spearman']:.3f} (untrained {r['sts_untrained_spearman']:.3f})")
  r["load_avg_1m_end"] = os.getloadavg()[0]
  print(json.dumps(r))


if __name__ == "__main__":
  app.run(main)
