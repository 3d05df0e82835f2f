"""A generated corpus with learnable structure, for pretraining offline: no network, no downloaded data.

A small fixed world of characters, each with a consistent job, city, pet and favourite food, told about in
short stories whose sentences follow a script (introduction, morning, pet, evening, night). A tiny BERT
learns quickly: function words and agreement (she/her, cat/cats, walk/walks) are local, facts ("mia lives in
oslo") are consistent across the corpus, and a random next segment is easy to tell apart (another character, a
jump in the script), so both MLM and NSP accuracy rise within a few hundred steps.

`ensure_corpus` writes, once, `train.txt` and `eval.txt` in google-research/bert's format (a sentence per
line, a blank line between documents) and `vocab.txt`, a closed WordPiece vocabulary in which inflected forms
are left out on purpose so that `cats` is `cat ##s`: whole-word masking gets words of several pieces.
"""
import dataclasses
import os
import pathlib

import numpy as np

from jbert.runtime import atomic

VERSION = 1
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
SUFFIXES = ("s", "ed")

_NAMES = (("anna", "she"), ("ben", "he"), ("clara", "she"), ("david", "he"), ("emma", "she"), ("felix", "he"),
          ("grace", "she"), ("hugo", "he"), ("iris", "she"), ("jack", "he"), ("kate", "she"), ("leo", "he"),
          ("mia", "she"), ("noah", "he"), ("olga", "she"), ("paul", "he"), ("rosa", "she"), ("sam", "he"),
          ("tina", "she"), ("victor", "he"), ("wendy", "she"), ("yuri", "he"), ("zoe", "she"), ("omar", "he"))
_JOBS = (("baker", "bakery"), ("doctor", "hospital"), ("teacher", "school"), ("farmer", "farm"),
         ("pilot", "airport"), ("chef", "restaurant"), ("painter", "studio"), ("sailor", "harbor"))
_CITIES = ("paris", "oslo", "rome", "lima", "cairo", "tokyo", "dublin", "quito")
_PETS = (("cat", "sleep"), ("dog", "run"), ("bird", "sing"), ("horse", "jump"), ("rabbit", "hide"),
         ("goat", "climb"))
_COLORS = ("red", "black", "white", "brown", "gray", "green")
_FOODS = ("bread", "rice", "soup", "fish", "cheese", "pasta", "apples", "beans")
_DAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_WEATHER = ("sunny", "cold", "rainy", "windy", "warm")
_OBJECT = {"he": "him", "she": "her"}
_POSSESSIVE = {"he": "his", "she": "her"}


@dataclasses.dataclass(frozen=True)
class Corpus:
  """Paths of a generated corpus."""
  directory: pathlib.Path
  train: pathlib.Path
  eval: pathlib.Path
  vocab: pathlib.Path


def _characters(rng: np.random.Generator) -> list[dict]:
  """The fixed world: every character's facts, drawn once so that all stories agree."""
  people = []
  for i, (name, pronoun) in enumerate(_NAMES):
    job, place = _JOBS[rng.integers(len(_JOBS))]
    pet, action = _PETS[rng.integers(len(_PETS))]
    friend = (i + 1 + int(rng.integers(len(_NAMES) - 1))) % len(_NAMES)
    people.append(dict(name=name, he=pronoun, job=job, place=place, city=_CITIES[rng.integers(len(_CITIES))],
                       pet=pet, action=action, color=_COLORS[rng.integers(len(_COLORS))],
                       food=_FOODS[rng.integers(len(_FOODS))], friend=friend, pets=1 + int(rng.integers(3))))
  return people


def _story(p: dict, people: list[dict], rng: np.random.Generator) -> list[str]:
  """One document: the script's sentences about character `p`, in order, some left out."""
  f = people[p["friend"]]
  he, him, his = p["he"], _OBJECT[p["he"]], _POSSESSIVE[p["he"]]
  pet = p["pet"] + "s" if p["pets"] > 1 else p["pet"]
  verb = "" if p["pets"] > 1 else "s"
  count = ("a", "two", "three")[p["pets"] - 1]
  day = int(rng.integers(len(_DAYS)))
  script = [
      [f"{p['name']} is a {p['job']} who lives in {p['city']} .",
       f"{p['name']} lives in {p['city']} and works as a {p['job']} ."],
      [f"every morning {he} walks to the {p['place']} .",
       f"on {_DAYS[day]} {he} walked to the {p['place']} ."],
      [f"it was {_WEATHER[rng.integers(len(_WEATHER))]} that day , so {he} took {his} coat ."],
      [f"{he} has {count} {p['color']} {pet} .", f"{p['name']} has {count} {p['color']} {pet} at home ."],
      [f"the {pet} like{verb} to {p['action']} in the garden .",
       f"{his} {pet} never {p['action']}{verb} at night ."],
      [f"after work {he} eats {p['food']} with {f['name']} .", f"{f['name']} cooked {p['food']} for {him} ."],
      [f"{f['name']} is a {f['job']} from {f['city']} .", f"{f['name']} visited {him} from {f['city']} ."],
      [f"they talked about the {pet} and the {p['food']} .", f"{f['name']} likes {p['name']} very much ."],
      [f"at night {p['name']} walks home and sleeps .", f"the next day was {_DAYS[(day + 1) % 7]} ."],
  ]
  keep = rng.random(len(script)) < 0.8
  keep[0] = True
  return [options[rng.integers(len(options))].capitalize() for options, k in zip(script, keep) if k]


def generate(num_documents: int, seed: int) -> list[list[str]]:
  """`num_documents` stories; the world is the same for every seed, the stories differ."""
  people = _characters(np.random.default_rng(VERSION))
  rng = np.random.default_rng(seed)
  return [_story(people[rng.integers(len(people))], people, rng) for _ in range(num_documents)]


def vocabulary(documents: list[list[str]]) -> list[str]:
  """Specials, punctuation and base words, then `##` suffixes; a word that is a stem plus a suffix is left out
  (its stem kept), so the tokenizer splits it into pieces."""
  words = {w for doc in documents for sentence in doc for w in sentence.lower().split()}
  stems = {}
  for w in words:
    for s in SUFFIXES:
      stem = w[:-len(s)]
      # A stem counts when it is a word itself or takes another suffix too (walks, walked -> walk).
      if w.endswith(s) and stem and (stem in words or any(stem + t in words for t in SUFFIXES if t != s)):
        stems[w] = stem
  return [*SPECIAL_TOKENS, *sorted((words - set(stems)) | set(stems.values())), *(f"##{s}" for s in SUFFIXES)]


def _write(path: pathlib.Path, text: str) -> None:
  """Atomic: processes generating the same corpus at once never see a partial file."""
  with atomic.open_for_write(str(path), encoding="utf-8") as f:
    f.write(text)


def default_directory() -> pathlib.Path:
  cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return pathlib.Path(cache) / "jbert" / f"synthetic-v{VERSION}"


def ensure_corpus(directory: str | os.PathLike | None = None, num_train: int = 4000,
                  num_eval: int = 200) -> Corpus:
  """Generates the corpus into `directory` (default `default_directory()`) unless it is already there."""
  root = pathlib.Path(directory) if directory else default_directory()
  corpus = Corpus(root, root / "train.txt", root / "eval.txt", root / "vocab.txt")
  if all(p.exists() for p in (corpus.train, corpus.eval, corpus.vocab)):
    return corpus
  root.mkdir(parents=True, exist_ok=True)
  train, held_out = generate(num_train, seed=1), generate(num_eval, seed=2)
  for path, docs in ((corpus.train, train), (corpus.eval, held_out)):
    _write(path, "\n\n".join("\n".join(doc) for doc in docs) + "\n")
  _write(corpus.vocab, "\n".join(vocabulary(train + held_out)) + "\n")
  return corpus
