"""Generated SQuAD data for the question-answering task tests: find the marked span.

Each context is 8-30 random words with one span `< w.. w.. >` (1-3 words between the markers) somewhere in it;
the answer is the marked span. SQuAD 2.0 data adds unanswerable questions, whose contexts have no marker.
With 32-token windows, contexts often need two windows, and some windows hold only one of the markers.
"""
import json
import pathlib
import sys

import numpy as np

WORDS = tuple(f"w{i}" for i in range(40))
VOCAB = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<", ">", "?", "where", "is", "the", "marked", "span",
         *WORDS)
QUESTION = "where is the marked span ?"


def write_vocab(path) -> str:
  path.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
  return str(path)


def marked_span_examples(num_examples: int, seed: int, *, unanswerable_every: int = 0) -> list[dict]:
  """Examples in TFDS's `squad` layout (what `read_squad_json` also returns)."""
  rng = np.random.default_rng(seed)
  examples = []
  for i in range(num_examples):
    words = rng.choice(WORDS, size=int(rng.integers(8, 31))).tolist()
    impossible = bool(unanswerable_every) and i % unanswerable_every == 0
    qid = f"s{seed}-{i}"
    if impossible:
      examples.append({"id": qid, "title": "g", "context": " ".join(words), "question": QUESTION,
                       "answers": {"text": [], "answer_start": []}, "is_impossible": True})
      continue
    k = int(rng.integers(1, 4))
    at = int(rng.integers(0, len(words) - k + 1))
    before, answer = " ".join(words[:at]), "< " + " ".join(words[at:at + k]) + " >"
    context = " ".join(p for p in (before, answer, " ".join(words[at + k:])) if p)
    start = len(before) + bool(before)
    assert context[start:start + len(answer)] == answer
    examples.append({"id": qid, "title": "g", "context": context, "question": QUESTION,
                     "answers": {"text": [answer], "answer_start": [start]}, "is_impossible": False})
  return examples


def to_squad_json(examples: list[dict]) -> dict:
  """The SQuAD file of `examples` (one paragraph per example)."""
  paragraphs = []
  for ex in examples:
    answers = [{"text": t, "answer_start": int(s)} for t, s in zip(ex["answers"]["text"],
                                                                    ex["answers"]["answer_start"])]
    qa = {"id": ex["id"], "question": ex["question"], "answers": answers}
    if ex.get("is_impossible"):
      qa["is_impossible"] = True
    paragraphs.append({"context": ex["context"], "qas": [qa]})
  return {"version": "generated", "data": [{"title": "g", "paragraphs": paragraphs}]}


def write_squad_json(path, examples: list[dict]) -> str:
  path.write_text(json.dumps(to_squad_json(examples)), encoding="utf-8")
  return str(path)


def tiny_config(name: str, vocab: str, **overrides):
  """configs/finetune.py:NAME as a from-scratch tiny BERT on 32-token windows of the generated data."""
  repo = str(pathlib.Path(__file__).resolve().parents[2])
  if repo not in sys.path:
    sys.path.insert(0, repo)
  from configs import finetune  # pylint: disable=import-outside-toplevel
  config = finetune.get_config(name)
  config.data.vocab = vocab
  config.data.max_seq_length = 32
  config.task.doc_stride = 12
  config.task.max_query_length = 8
  for key, value in {"preset": "tiny", "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128,
                     "max_position_embeddings": 64, "scan_layers": False, "hidden_dropout_prob": 0.0,
                     "attention_probs_dropout_prob": 0.0}.items():
    config.model[key] = value
  config.batch_size = 32
  config.optim.learning_rate = 5e-3
  config.log_every_steps = 10
  config.checkpoint_every_steps = 0
  config.async_checkpointing = False
  config.update_from_flattened_dict(overrides)  # dotted keys; an unknown one raises
  return config
