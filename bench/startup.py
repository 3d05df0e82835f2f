r"""Start-up with and without the persistent compile cache: `python -m jbert.embed` run twice on one model folder,
and the resume of a fine-tuning run, timed to its first training step.

  python bench/startup.py [--texts=2000 --layers=6 --hidden=384 --heads=12 --seq=128 --batch_size=32]
                          [--text=botchan.txt --vocab=bert-base-uncased-vocab.txt]   (../shared/data)
                          [--parts=embed,resume --repeats=1]

A random BERT (by default MiniLM's size: 6 layers, 384 wide, 12 heads) is saved as a Hugging Face folder.

Embedding: `python -m jbert.embed --pooling=mean` over the first `--texts` non-empty lines of the text, once with
the cache off, then twice with one fresh cache directory: the first of those compiles and writes every program,
the second loads them (`--repeats` times over, each pair with a fresh directory). Each call is timed from the
command to its exit, and its phases through bench/embed_phases.py (`embed_*_phases`: the command's `main` under
timers; `start` is the interpreter's start-up and flag parsing, `exit` the interpreter's shutdown); `embed_ratio`
is the second call's time over the first's (each pair's, the median of them with `--repeats`).

Resume: `run.py --config=configs/finetune.py:local` fine-tunes the folder on the same lines (labels: the parity of
the line's length) with a fresh cache directory and is stopped by SIGTERM once its first checkpoint exists. Its
workdir is copied twice and each copy resumed with the same command, once with `--compile_cache=off` and once
with the cache the first run filled; start-up is the time from the command to the trainer's `step N done in`
line, whose count of programs loaded from the cache is reported too. The resumed runs are then killed.

The last line is one JSON object.
"""
from __future__ import annotations

import csv
import json
import os
import pathlib
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

REPO = pathlib.Path(__file__).resolve().parents[1]
_DATA = REPO.parent / "shared" / "data"
FIRST_STEP = re.compile(r"step (\d+) done in ([\d.]+) s \((\d+) XLA programs? in ([\d.]+) s"
                        r"(?:, (\d+) of them from the compile cache)?\)")

_TEXT = flags.DEFINE_string("text", str(_DATA / "botchan.txt"), "Plain text; its non-empty lines are the texts.")
_VOCAB = flags.DEFINE_string("vocab", str(_DATA / "bert-base-uncased-vocab.txt"), "WordPiece vocab.txt.")
_TEXTS = flags.DEFINE_integer("texts", 2000, "Lines embedded, and fine-tuned on.")
_LAYERS = flags.DEFINE_integer("layers", 6, "Layers of the random model.")
_HIDDEN = flags.DEFINE_integer("hidden", 384, "Hidden size (intermediate: 4x).")
_HEADS = flags.DEFINE_integer("heads", 12, "Attention heads.")
_SEQ = flags.DEFINE_integer("seq", 128, "Fine-tuning's max_seq_length.")
_BATCH = flags.DEFINE_integer("batch_size", 32, "Fine-tuning's batch size.")
_TIMEOUT = flags.DEFINE_integer("timeout", 1200, "Seconds any one command may take.")
_PARTS = flags.DEFINE_list("parts", ["embed", "resume"], "What to time: embed, resume.")
_REPEATS = flags.DEFINE_integer("repeats", 1, "Pairs of embed calls (first, second), each with a fresh cache.")


def write_model(folder: pathlib.Path) -> None:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  tokenizer = transformers.BertTokenizer(vocab=_VOCAB.value)
  config = transformers.BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=_HIDDEN.value,
                                   num_hidden_layers=_LAYERS.value, num_attention_heads=_HEADS.value,
                                   intermediate_size=4 * _HIDDEN.value)
  transformers.BertModel(config).save_pretrained(folder)
  tokenizer.save_pretrained(folder)


def cpu_s() -> float:
  """CPU seconds (user + system) of the finished commands so far: steadier than wall time on a loaded host."""
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def entries(cache: pathlib.Path) -> int:
  return sum(1 for _ in cache.iterdir()) if cache.exists() else 0


def embed(model: pathlib.Path, texts: pathlib.Path, cache: str, output: pathlib.Path) -> tuple[float, float, dict]:
  """(wall, CPU) seconds of one `python -m jbert.embed` (run by bench/embed_phases.py), and its phases."""
  phases = output.with_suffix(".phases.json")
  start, cpu = time.perf_counter(), cpu_s()
  subprocess.run([sys.executable, "bench/embed_phases.py", f"--phases_json={phases}", f"--model={model}",
                  f"--input={texts}", f"--output={output}", "--pooling=mean"], cwd=REPO,
                 env=dict(os.environ, JBERT_COMPILE_CACHE=cache), check=True, capture_output=True,
                 timeout=_TIMEOUT.value)
  wall, cpu = time.perf_counter() - start, cpu_s() - cpu
  report = json.loads(phases.read_text(encoding="utf-8"))
  inside = sum(report["phases_s"].values())
  report["phases_s"] = {"start": round(report["process_s"] - inside, 3), **report["phases_s"],
                        "exit": round(wall - report["process_s"], 3)}
  return wall, cpu, report


def finetune_command(model: pathlib.Path, data: pathlib.Path, workdir: pathlib.Path, cache: str) -> list[str]:
  return [sys.executable, "run.py", "--config=configs/finetune.py:local", f"--workdir={workdir}",
          f"--compile_cache={cache}", f"--config.init_from={model}", f"--config.task.train_file={data}",
          f"--config.task.eval_file={data}", "--config.task.text_a=sentence", "--config.task.label=label",
          "--config.task.label_names=even,odd", f"--config.batch_size={_BATCH.value}",
          f"--config.data.max_seq_length={_SEQ.value}", "--config.total_steps=50", "--config.log_every_steps=50",
          "--config.checkpoint_every_steps=2", "--config.async_checkpointing=false"]


def first_step(command: list[str]) -> tuple[float, dict[str, float]]:
  """Seconds from the command to its first step's line, and that line's numbers with the CPU seconds the
  command used up to then (`cpu_s`); the run is killed then."""
  start, cpu = time.perf_counter(), cpu_s()
  proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  tail = []
  try:
    for line in proc.stderr:
      found = FIRST_STEP.search(line)
      if found:
        seconds = time.perf_counter() - start
        step, step_s, programs, compile_s, cached = found.groups()
        proc.kill()
        proc.wait()
        return seconds, {"step": int(step), "first_step_s": float(step_s), "programs": int(programs),
                         "compile_s": float(compile_s), "from_cache": int(cached or 0), "cpu_s": cpu_s() - cpu}
      tail = (tail + [line])[-20:]
    raise RuntimeError(f"{command} ended without a first step:\n{''.join(tail)}")
  finally:
    proc.kill()
    proc.wait()


def stopped_after_first_checkpoint(command: list[str], workdir: pathlib.Path) -> None:
  proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  start = time.perf_counter()
  while not (workdir / "checkpoints" / "2").exists():
    if proc.poll() is not None or time.perf_counter() - start > _TIMEOUT.value:
      proc.kill()
      raise RuntimeError(f"no checkpoint 2 from {command}:\n{proc.communicate()[1][-3000:]}")
    time.sleep(0.1)
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=_TIMEOUT.value)
  if proc.returncode != 0:
    raise RuntimeError(f"the stopped run exited {proc.returncode}:\n{err[-3000:]}")


def main(argv):
  del argv
  for path in (_TEXT.value, _VOCAB.value):
    if not os.path.exists(path):
      raise app.UsageError(f"{path} does not exist; pass --text and --vocab (botchan.txt and "
                           "bert-base-uncased-vocab.txt live in ../shared/data).")
  lines = [l.strip() for l in pathlib.Path(_TEXT.value).read_text(encoding="utf-8").splitlines() if l.strip()]
  lines = lines[:_TEXTS.value]
  load = os.getloadavg()[0]
  with tempfile.TemporaryDirectory(prefix="jbert-bench-startup-") as tmp:
    tmp = pathlib.Path(tmp)
    model, texts, data = tmp / "model", tmp / "texts.txt", tmp / "train.csv"
    write_model(model)
    texts.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with open(data, "w", encoding="utf-8", newline="") as f:
      writer = csv.writer(f)
      writer.writerow(["sentence", "label"])
      writer.writerows([line, ("even", "odd")[len(line) % 2]] for line in lines)
    print(f"{len(lines)} texts, model {_LAYERS.value}x{_HIDDEN.value}, load average {load:.1f} on "
          f"{os.cpu_count()} cores", flush=True)

    results = {"texts": len(lines), "model": f"{_LAYERS.value}x{_HIDDEN.value}"}
    if "embed" in _PARTS.value:
      results.update(embed_pairs(model, texts, tmp))
    if "resume" in _PARTS.value:
      results.update(resume(model, data, tmp))
  results["load_average_start"], results["load_average_end"] = load, os.getloadavg()[0]
  print(json.dumps(results))


def embed_pairs(model: pathlib.Path, texts: pathlib.Path, tmp: pathlib.Path) -> dict:
  """The embed calls: without a cache, then `--repeats` pairs (first, second) each with a fresh cache."""
  results, ratios = {}, []
  for repeat in range(_REPEATS.value):
    cache = tmp / f"cache{repeat}"
    for name, setting in (("no_cache", "off"), ("first", str(cache)), ("second", str(cache))):
      if name == "no_cache" and repeat:
        continue
      before = entries(cache)
      wall, cpu, report = embed(model, texts, setting, tmp / f"{name}{repeat}.npy")
      new = entries(cache) - before
      print(f"embed ({name}): {wall:.1f} s, {cpu:.1f} CPU s, {new} new cache files, {report['traced']} program(s) "
            f"traced, {report['stored']} loaded as stored programs, load average {os.getloadavg()[0]:.1f}; "
            + ", ".join(f"{k} {v:.2f}" for k, v in report["phases_s"].items()), flush=True)
      if not repeat:
        results.update({f"embed_{name}_s": wall, f"embed_{name}_cpu_s": cpu, f"embed_{name}_new_entries": new,
                        f"embed_{name}_phases": report["phases_s"], f"embed_{name}_traced": report["traced"],
                        f"embed_{name}_stored": report["stored"]})
      results.setdefault(f"embed_{name}_runs_s", []).append(wall)
    ratios.append(results["embed_second_runs_s"][-1] / results["embed_first_runs_s"][-1])
  results["embed_ratios"] = ratios
  results["embed_ratio"] = sorted(ratios)[len(ratios) // 2]
  results["embed_second_speedup"] = results["embed_first_s"] / results["embed_second_s"]
  results["embed_second_cpu_speedup"] = results["embed_first_cpu_s"] / results["embed_second_cpu_s"]
  return results


def resume(model: pathlib.Path, data: pathlib.Path, tmp: pathlib.Path) -> dict:
  """A stopped fine-tuning run resumed to its first step, without and with the compile cache."""
  results = {}
  run_cache = tmp / "run_cache"
  workdir = tmp / "run"
  stopped_after_first_checkpoint(finetune_command(model, data, workdir, str(run_cache)), workdir)
  for name, setting in (("no_cache", "off"), ("cached", str(run_cache))):
    copy = tmp / f"resume_{name}"
    shutil.copytree(workdir, copy)
    seconds, line = first_step(finetune_command(model, data, copy, setting))
    results[f"resume_{name}_to_first_step_s"] = seconds
    results.update({f"resume_{name}_{k}": v for k, v in line.items()})
    print(f"resume ({name}): first step (step {line['step']}) after {seconds:.1f} s ({line['cpu_s']:.1f} CPU s); "
          f"{line['programs']} program(s) in {line['compile_s']:.1f} s, {line['from_cache']} from the cache",
          flush=True)
  results["resume_speedup"] = results["resume_no_cache_to_first_step_s"] / results["resume_cached_to_first_step_s"]
  return results


if __name__ == "__main__":
  app.run(main)
