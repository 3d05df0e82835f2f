r"""ModernBERT on this CPU, jbert beside transformers' ModernBERT (sdpa attention): fine-tuning end to end, and one
forward+backward at long context.

  python bench/modernbert.py --out=/tmp/mbert [--measure=finetune,long --repeats=2 --lengths=2048,4096,8192]

finetune  an SST-2-like task (bench/finetune_e2e.py's generated sentences: 8,000 training rows, 872 evaluation
          rows, sequence 64, labels from keywords) fine-tuned from one random-initialised ModernBERT small model
          (6 layers, hidden 384, 6 heads, GeGLU 576, a global layer every third and a 128-token window elsewhere,
          bert-base-uncased's WordPiece vocabulary) saved as a Hugging Face folder both start from. The recipe:
          batch 32, AdamW (decay 0.01, none on norms and biases), 10% linear warmup then linear decay, clipping at
          1.0, one epoch, float32, seeded shuffling, lr 1e-4. jbert: `run.py --config=configs/finetune.py:local`
          with `--config.init_from` (packed rows, its default); transformers: ModernBertForSequenceClassification
          with dynamic padding (sdpa on CPU: no unpadding, which transformers does only under flash-attention 2).
          Each run is a subprocess timed from its command to results.json (start-up, tokenisation, compilation,
          training, evaluation, export); the systems alternate, `--repeats` times.
long      one forward+backward (loss: the mean square of the last hidden states) of a 3-layer model of the same
          width at each of `--lengths` tokens, batch 1, in a subprocess per measurement: `modernbert` (global,
          local, local: ModernBERT's pattern), `local` (three sliding-window layers) and `global` (three global
          layers). Time: the median of `--timed` calls after one untimed; memory: the process's peak RSS growth
          over the step (and for jbert XLA's temporary buffers of the compiled step). A local layer that costs
          O(T w) takes twice the time at twice the length; one that costs O(T^2), four times.

The last line printed is one JSON object (also OUT/results.json) with the 1-minute load average around each run.
"""
from __future__ import annotations

import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import time

from absl import app
from absl import flags

import finetune_e2e  # bench/, the script's own folder; its --out, --seed, --text and --vocab are this script's too

REPO = pathlib.Path(__file__).resolve().parents[1]
MEASURES = ("finetune", "long")
SYSTEMS = ("jbert", "torch_sdpa")
VARIANTS = {"modernbert": ("full_attention", "sliding_attention", "sliding_attention"),
            "local": ("sliding_attention",) * 3, "global": ("full_attention",) * 3}

_MEASURE = flags.DEFINE_list("measure", list(MEASURES), f"Any of {', '.join(MEASURES)}.")
_REPEATS = flags.DEFINE_integer("repeats", 2, "finetune: runs of each system, alternating.")
_ROWS = flags.DEFINE_list("rows", ["8000", "872"], "finetune: training and evaluation rows.")
_LENGTHS = flags.DEFINE_list("lengths", ["2048", "4096", "8192"], "long: sequence lengths.")
_VARIANTS = flags.DEFINE_list("variants", list(VARIANTS), f"long: any of {', '.join(VARIANTS)}.")
# PyTorch's OpenMP threads spin: on this oversubscribed 2-core host 2 threads ran a step 3x slower than 1.
_TORCH_THREADS = flags.DEFINE_integer("torch_threads", 1, "PyTorch's intra-op threads (jbert: XLA's, one per core).")
_TIMED = flags.DEFINE_integer("timed", 2, "long: timed calls per measurement (after one untimed).")
# Internal: one measurement in its own process, described by JSON.
_CHILD = flags.DEFINE_string("child", None, "Internal: run one measurement described by JSON.")

SIZES = dict(hidden_size=384, num_attention_heads=6, intermediate_size=576, local_attention=128)


def _load() -> float:
  return round(os.getloadavg()[0], 2)


def _rss_mib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def make_model(directory: pathlib.Path, layers: int, vocab: str | None, seed: int,
               layer_types=None, vocab_size: int = 1000) -> pathlib.Path:
  """A random-initialised ModernBertForMaskedLM folder (with a WordPiece tokenizer when `vocab` is given)."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(seed)
  ids = {}
  if vocab:
    tokenizer = transformers.BertTokenizerFast(vocab=vocab, do_lower_case=True)
    tokenizer.save_pretrained(directory)
    vocab_size = len(tokenizer)
    ids = dict(pad_token_id=tokenizer.pad_token_id, cls_token_id=tokenizer.cls_token_id,
               sep_token_id=tokenizer.sep_token_id, bos_token_id=tokenizer.cls_token_id,
               eos_token_id=tokenizer.sep_token_id)
  else:
    ids = dict(pad_token_id=0, cls_token_id=1, sep_token_id=2, bos_token_id=1, eos_token_id=2)
  layer_types = list(layer_types or ("full_attention" if i % 3 == 0 else "sliding_attention"
                                     for i in range(layers)))
  config = transformers.ModernBertConfig(vocab_size=vocab_size, num_hidden_layers=layers, layer_types=layer_types,
                                         max_position_embeddings=8192, **SIZES, **ids)
  transformers.ModernBertForMaskedLM(config).save_pretrained(directory)
  return directory


# -- fine-tuning -----------------------------------------------------------------------------------------------

def torch_finetune(spec: dict) -> None:
  """transformers' ModernBertForSequenceClassification, the recipe of the module docstring, then results.json."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(spec["threads"])
  torch.manual_seed(spec["seed"])
  files, seq, workdir = spec["files"], spec["seq"], pathlib.Path(spec["workdir"])
  tokenizer = transformers.AutoTokenizer.from_pretrained(spec["model"])
  model = transformers.ModernBertForSequenceClassification.from_pretrained(spec["model"], num_labels=2,
                                                                            attn_implementation="sdpa")

  def encode(path):
    rows = finetune_e2e.read_csv(path)
    enc = tokenizer([r[files["text_a"]] for r in rows], truncation=True, max_length=seq)
    return [{"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i],
             "labels": int(r["label"] == "pos")} for i, r in enumerate(rows)]

  collate = transformers.DataCollatorWithPadding(tokenizer)
  train = torch.utils.data.DataLoader(encode(files["train"]), batch_size=32, shuffle=True, collate_fn=collate,
                                      generator=torch.Generator().manual_seed(spec["seed"]))
  evaluation = torch.utils.data.DataLoader(encode(files["eval"]), batch_size=32, collate_fn=collate)
  total = len(train)
  named = list(model.named_parameters())
  decayed = lambda n: not (n.endswith("bias") or "norm" in n.lower())  # jbert's mask: no norms, no biases
  optimizer = torch.optim.AdamW([{"params": [p for n, p in named if decayed(n)], "weight_decay": 0.01},
                                 {"params": [p for n, p in named if not decayed(n)], "weight_decay": 0.0}],
                                lr=spec["lr"], eps=1e-6)
  schedule = transformers.get_linear_schedule_with_warmup(optimizer, int(0.1 * total), total)
  model.train()
  start = time.perf_counter()
  for batch in train:
    model(**batch).loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    schedule.step()
    optimizer.zero_grad(set_to_none=True)
  train_s = time.perf_counter() - start
  model.eval()
  correct = count = 0
  with torch.no_grad():
    for batch in evaluation:
      labels = batch.pop("labels")
      correct += int((model(**batch).logits.argmax(-1) == labels).sum())
      count += len(labels)
  model.save_pretrained(workdir / "export")
  (workdir / "results.json").write_text(json.dumps({"metrics": {"validation": {"accuracy": correct / count}},
                                                    "step": total, "train_steps_per_s": total / train_s}))


def jbert_steps_per_s(workdir: pathlib.Path) -> float | None:
  """Training steps per second of the loop after its first step (metrics.jsonl's logged windows)."""
  rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  rates = [(r["step"], r["train/steps_per_sec"]) for r in rows if "train/steps_per_sec" in r]
  return round(statistics.median(rate for _, rate in rates), 3) if rates else None


def finetune(root: pathlib.Path) -> dict:
  model = make_model(root / "model_small", 6, flags.FLAGS.vocab, flags.FLAGS.seed)
  words = finetune_e2e.source_words(pathlib.Path(flags.FLAGS.text).read_text(encoding="utf-8"))
  data, seq = root / "data", 64
  data.mkdir(parents=True, exist_ok=True)
  finetune_e2e.write_csv(data / "train.csv", finetune_e2e.sst2_rows(words, int(_ROWS.value[0]), flags.FLAGS.seed, 28))
  finetune_e2e.write_csv(data / "dev.csv", finetune_e2e.sst2_rows(words, int(_ROWS.value[1]), flags.FLAGS.seed + 1, 28))
  files = finetune_e2e.task_files("sst2", data)
  runs = {s: [] for s in SYSTEMS}
  for repeat in range(_REPEATS.value):
    for system in SYSTEMS:  # alternating: the host's load falls on both alike
      workdir = root / "runs" / f"{system}_{repeat}"
      if system == "jbert":
        command = finetune_e2e.jbert_command(str(model), files, str(workdir), seq, 1.0, 1e-4, flags.FLAGS.seed,
                                             bucketing=True, packing=True)
      else:
        spec = dict(kind="finetune", model=str(model), files=files, workdir=str(workdir), seq=seq, lr=1e-4,
                    seed=flags.FLAGS.seed, threads=_TORCH_THREADS.value)
        command = [sys.executable, str(pathlib.Path(__file__).resolve()), "--child=" + json.dumps(spec)]
      workdir.mkdir(parents=True, exist_ok=True)
      cache = root / "cache" / f"{system}_{repeat}"  # first runs: nothing compiled before is reused
      env = {**os.environ, "XDG_CACHE_HOME": str(cache), "JBERT_COMPILE_CACHE": str(cache / "jbert"),
             "JAX_COMPILATION_CACHE_DIR": str(cache / "jax")}
      load, start = _load(), time.perf_counter()
      with open(workdir.with_suffix(".log"), "w", encoding="utf-8") as log:
        subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
      wall = time.perf_counter() - start
      results = json.loads((workdir / "results.json").read_text())
      rate = jbert_steps_per_s(workdir) if system == "jbert" else round(results["train_steps_per_s"], 3)
      run = {"wall_s": round(wall, 1), "accuracy": round(results["metrics"]["validation"]["accuracy"], 4),
             "steps": results["step"], "train_steps_per_s": rate, "load_avg_1m": [load, _load()]}
      runs[system].append(run)
      print(f"finetune {system} #{repeat}: {json.dumps(run)}", flush=True)
  return {"rows": [int(r) for r in _ROWS.value], "seq": seq, "runs": runs}


# -- long context ----------------------------------------------------------------------------------------------

def long_child(spec: dict) -> dict:
  """One forward+backward of `spec`'s model at `spec['length']` tokens in this process."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  length, folder = spec["length"], spec["model"]
  ids = np.random.default_rng(0).integers(3, 1000, (1, length)).astype(np.int32)
  base = _rss_mib()
  if spec["system"] == "jbert":
    import jax  # pylint: disable=g-import-not-at-top
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    import jbert  # pylint: disable=g-import-not-at-top
    config, params = jbert.load_pretrained(folder, jbert.BertModel)

    def loss(p):
      out = jbert.BertModel(config).apply({"params": p}, jnp.asarray(ids), attention_mask=jnp.ones_like(ids))
      return jnp.mean(jnp.square(out.last_hidden_state))

    step = jax.jit(jax.value_and_grad(loss))
    compiled = step.lower(params).compile()
    memory = compiled.memory_analysis()
    extra = {"xla_temp_mib": round(memory.temp_size_in_bytes / 2**20, 1)} if memory else {}
    run = lambda: jax.block_until_ready(compiled(params))
  else:
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
    torch.set_num_threads(spec["threads"])
    model = transformers.ModernBertModel.from_pretrained(folder, attn_implementation="sdpa")
    tensor = torch.tensor(ids, dtype=torch.long)
    extra = {}

    def run():
      model.zero_grad(set_to_none=True)
      out = model(input_ids=tensor, attention_mask=torch.ones_like(tensor)).last_hidden_state
      out.square().mean().backward()
  start = time.perf_counter()
  run()
  first = time.perf_counter() - start
  times = []
  for _ in range(spec["timed"]):
    start = time.perf_counter()
    run()
    times.append(time.perf_counter() - start)
  return {"first_s": round(first, 3), "median_s": round(statistics.median(times), 3),
          "peak_rss_growth_mib": round(_rss_mib() - base, 1), **extra}


def long_context(root: pathlib.Path) -> dict:
  models = {v: make_model(root / f"model_{v}", 3, None, flags.FLAGS.seed, layer_types=VARIANTS[v])
            for v in _VARIANTS.value}
  out = {}
  for length in map(int, _LENGTHS.value):
    for variant in _VARIANTS.value:
      for system in SYSTEMS:
        spec = dict(kind="long", system=system, model=str(models[variant]), length=length, timed=_TIMED.value,
                    threads=_TORCH_THREADS.value)
        load = _load()
        done = subprocess.run([sys.executable, str(pathlib.Path(__file__).resolve()), "--child=" + json.dumps(spec)],
                              capture_output=True, text=True, cwd=REPO, check=False)
        if done.returncode:
          result = {"error": (done.stderr.strip().splitlines() or ["exit status %d" % done.returncode])[-1]}
        else:
          result = json.loads(done.stdout.strip().splitlines()[-1])
        result["load_avg_1m"] = [load, _load()]
        out.setdefault(variant, {}).setdefault(system, {})[length] = result
        print(f"long {variant} {system} T={length}: {json.dumps(result)}", flush=True)
  return out


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if _CHILD.value:
    spec = json.loads(_CHILD.value)
    if spec["kind"] == "finetune":
      return torch_finetune(spec)
    print(json.dumps(long_child(spec)))
    return None
  if not flags.FLAGS.out:
    raise app.UsageError("--out=DIR is required.")
  unknown = sorted(set(_MEASURE.value) - set(MEASURES)) + sorted(set(_VARIANTS.value) - set(VARIANTS))
  if unknown:
    raise app.UsageError(f"unknown measures/variants {unknown}: measures {', '.join(MEASURES)}; variants "
                         f"{', '.join(VARIANTS)}.")
  root = pathlib.Path(flags.FLAGS.out)
  root.mkdir(parents=True, exist_ok=True)
  report = {"cores": len(os.sched_getaffinity(0)), "torch_threads": _TORCH_THREADS.value, "cpu": _cpu(),
            "model": SIZES}
  if "finetune" in _MEASURE.value:
    report["finetune"] = finetune(root)
  if "long" in _MEASURE.value:
    report["long"] = long_context(root)
  (root / "results.json").write_text(json.dumps(report, indent=2))
  print(json.dumps(report))


def _cpu() -> str:
  try:
    text = pathlib.Path("/proc/cpuinfo").read_text()
  except OSError:
    return "unknown"
  name = next((l.split(":", 1)[1].strip() for l in text.splitlines() if l.startswith("model name")), "unknown")
  flags_line = next((l for l in text.splitlines() if l.startswith("flags")), "")
  return name + "".join(f" {f}" for f in ("avx512f", "avx512_bf16", "amx_bf16") if f" {f}" in flags_line)


if __name__ == "__main__":
  app.run(main)
