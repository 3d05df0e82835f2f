r"""The PyTorch side of bench/device_check.py, in a process of its own (JAX, which preallocates the GPU's memory,
starts only after it has exited):

  python bench/device_torch.py --spec=SPEC.json --out=RESULT.json

SPEC names the model folder (a Hugging Face BertModel with random weights, written by device_check), the device,
the parity inputs and the shapes to time. This writes the fp32 parity reference (TF32 off), and the seconds per
step of transformers in its best recipe on that device: bf16 autocast, SDPA attention, fused AdamW, for the
pretraining step (BertForPreTraining) at each length and the fine-tuning step (BertForSequenceClassification),
and sentence-transformers' `encode` on the embedding texts. A shape that runs out of memory is retried at half the
batch; what each part ran with is in the result.
"""
from __future__ import annotations

import json
import math
import pathlib
import sys
import time

import numpy as np

import device_shapes  # bench/: the batch and length rules both frameworks follow


def _steps_per_s(step, seconds: float, max_steps: int, warmup: int = 2) -> tuple[float, int]:
  """(steps/s, timed steps) of `step()` after `warmup` untimed steps, for up to `seconds` or `max_steps`."""
  for _ in range(warmup):
    step()
  start, done = time.perf_counter(), 0
  while done < max_steps and (done < 2 or time.perf_counter() - start < seconds):
    step()
    done += 1
  return done / (time.perf_counter() - start), done


def _halving(run, batch: int, torch):
  """run(batch) at `batch`, halved on each CUDA out-of-memory error down to 1."""
  while True:
    try:
      return run(batch), batch
    except torch.cuda.OutOfMemoryError:
      torch.cuda.empty_cache()
      if batch == 1:
        raise
      batch //= 2


def main(spec_path: str, out_path: str) -> None:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  spec = json.loads(open(spec_path, encoding="utf-8").read())
  device = torch.device(spec["device"])
  result = {"torch": torch.__version__, "transformers": transformers.__version__}
  # fp32 reference: no TF32 anywhere, so the comparison measures the implementations, not the matmul precision.
  torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
  torch.set_float32_matmul_precision("highest")
  folder = pathlib.Path(spec["folder"])
  torch.manual_seed(0)
  transformers.BertModel(transformers.BertConfig(**spec["config"])).save_pretrained(folder)  # random weights
  (folder / "vocab.txt").write_text("\n".join(spec["vocab"]) + "\n", encoding="utf-8")
  transformers.BertTokenizer(vocab=str(folder / "vocab.txt")).save_pretrained(folder)
  inputs = {k: torch.from_numpy(np.asarray(v, np.int64)).to(device) for k, v in spec["parity_inputs"].items()}
  model = transformers.BertModel.from_pretrained(folder, attn_implementation="sdpa").to(device).eval()
  with torch.no_grad():
    np.save(spec["parity_out"], model(**inputs).last_hidden_state.float().cpu().numpy())
  del model
  # No budget (the dry run): every shape runs to the end, as the device will run it.
  deadline = math.inf if spec["budget_s"] is None else time.perf_counter() + spec["budget_s"]
  hf_config = transformers.BertConfig.from_pretrained(spec["folder"], attn_implementation="sdpa",
                                                      attention_probs_dropout_prob=0.0)
  autocast = lambda: torch.autocast(device.type, dtype=torch.bfloat16)
  fused = device.type == "cuda"

  def trainer(model_cls, make_inputs):
    def run(batch):
      model = model_cls(hf_config).to(device).train()
      optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=fused)
      data = make_inputs(batch)

      def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast():
          loss = model(**data).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if device.type == "cuda":
          torch.cuda.synchronize()

      try:
        return _steps_per_s(step, spec["seconds"], spec["max_steps"])
      finally:
        del model, optimizer
    return run

  rng = np.random.default_rng(0)
  for name, shape in spec["pretrain"].items():
    if time.perf_counter() > deadline:
      result[name] = {"skipped": "time budget"}
      continue
    seq = shape["seq"]
    start_batch = shape["batch"] or device_shapes.batch_for_memory(
        seq, torch.cuda.get_device_properties(0).total_memory)
    lengths = device_shapes.row_lengths(seq, 4 * start_batch)

    def pretrain_inputs(batch, seq=seq, lengths=lengths):
      mask = (np.arange(seq)[None] < lengths[:batch, None])
      ids = rng.integers(1000, hf_config.vocab_size, (batch, seq)) * mask
      labels = np.where(mask & (rng.random((batch, seq)) < 0.15), ids, -100)
      return {"input_ids": torch.from_numpy(ids).to(device), "attention_mask": torch.from_numpy(mask.astype(
          np.int64)).to(device), "labels": torch.from_numpy(labels).to(device),
              "next_sentence_label": torch.from_numpy(rng.integers(0, 2, batch)).to(device)}

    (rate, steps), batch = _halving(trainer(transformers.BertForPreTraining, pretrain_inputs), start_batch, torch)
    result[name] = {"batch_start": start_batch, "batch": batch, "seq": seq, "steps_per_s": rate,
                    "timed_steps": steps, "seq_per_s": rate * batch}
  if time.perf_counter() < deadline:
    ft = spec["finetune"]
    hf_config.attention_probs_dropout_prob = 0.1  # the fine-tuning recipe keeps it; SDPA applies it
    hf_config.num_labels = 2

    def finetune_inputs(batch):
      mask = np.arange(ft["seq"])[None] < device_shapes.row_lengths(ft["seq"], ft["batch"])[:batch, None]
      ids = rng.integers(1000, hf_config.vocab_size, (batch, ft["seq"])) * mask
      return {"input_ids": torch.from_numpy(ids).to(device),
              "attention_mask": torch.from_numpy(mask.astype(np.int64)).to(device),
              "labels": torch.from_numpy(rng.integers(0, 2, batch)).to(device)}

    (rate, steps), batch = _halving(trainer(transformers.BertForSequenceClassification, finetune_inputs),
                                    ft["batch"], torch)
    result["finetune"] = {"batch": batch, "seq": ft["seq"], "steps_per_s": rate, "timed_steps": steps}
  if time.perf_counter() < deadline:
    import sentence_transformers  # pylint: disable=g-import-not-at-top
    texts = spec["embed"]["texts"]
    st = sentence_transformers.SentenceTransformer(spec["folder"], device=str(device),
                                                   model_kwargs={"torch_dtype": torch.bfloat16})
    st.max_seq_length = spec["embed"]["max_length"]
    st.encode(texts[:spec["embed"]["batch"]], batch_size=spec["embed"]["batch"])  # warm-up
    start = time.perf_counter()
    embeddings = st.encode(texts, batch_size=spec["embed"]["batch"], convert_to_numpy=True)
    seconds = time.perf_counter() - start
    np.save(spec["embed_out"], embeddings.astype(np.float32))
    result["embed"] = {"sentences": len(texts), "seconds": seconds, "sentences_per_s": len(texts) / seconds,
                       "sentence_transformers": sentence_transformers.__version__}
  with open(out_path, "w", encoding="utf-8") as f:
    json.dump(result, f)


if __name__ == "__main__":
  args = dict(a.lstrip("-").split("=", 1) for a in sys.argv[1:])
  main(args["spec"], args["out"])
