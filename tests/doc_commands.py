"""The commands that README.md and the documentation pages show, parsed as a user would copy them.

Shared by tests/test_readme.py (every page's commands use configs, keys, flags and files that exist) and
tests/test_docs.py. A command is found in a fenced code block (continuation lines joined, `# ...` comments cut)
or in inline code, which may wrap over two lines of Markdown.
"""
from __future__ import annotations

import functools
import json
import pathlib
import re
import shlex
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def pages() -> dict[str, str]:
  """README.md and every page of the site, by path relative to the repository."""
  found = [REPO / "README.md", *sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)]
  return {str(p.relative_to(REPO)): p.read_text(encoding="utf-8") for p in found}


def snippets(text: str) -> list[str]:
  """Each command line of the fenced blocks, and each inline code span, as one line."""
  out, fence = [], []
  inside = False
  prose = []
  for line in text.splitlines():
    if line.lstrip().startswith("```"):
      inside = not inside
      if not inside:
        joined = "\n".join(fence).replace("\\\n", " ")
        out += [re.sub(r"(^|\s)#.*", "", l).strip() for l in joined.splitlines()]
        fence = []
      continue
    (fence if inside else prose).append(line)
  out += [" ".join(s.split()) for s in re.findall(r"(?<!`)`([^`]+)`(?!`)", "\n".join(prose))]
  return [s for s in out if s]


def _tokens(command: str) -> list[str]:
  # Optional parts ([--x=...]) and alternatives (a|b) are what a user picks from: keep every flag named.
  command = command.replace("[", " ").replace("]", " ").replace("...", " ")
  try:
    return shlex.split(command)
  except ValueError:  # a quote the snippet opens and the prose closes
    return command.split()


def run_commands(text: str) -> list[list[str]]:
  """The `python run.py ...` commands of a page, split into words."""
  return [_tokens(m.group(0)) for s in snippets(text) for m in re.finditer(r"python3? run\.py .*", s)]


def _flags_of(rest: str) -> list[str]:
  words = []
  for word in _tokens(rest):
    if word in ("--", "|", "||", "&&", ";", ">", "2>") or word.startswith(("#", ">")):
      break  # what follows is another command (jbert.distributed's, a pipe) or a comment
    words.append(word)
  flags = [w.split("=", 1)[0][2:] for w in words if w.startswith("--") and len(w) > 2]
  return [f for f in flags if not f.startswith("config.")]


def script_commands(text: str) -> list[tuple[str, list[str]]]:
  """(`bench/X.py`, its --flags) for each `python bench/X.py ...` or `python tpu/X.py ...` of a page."""
  return [(m.group(1), _flags_of(m.group(2))) for s in snippets(text)
          for m in re.finditer(r"python3? ((?:bench|tpu)/\w+\.py)\b(.*)", s)]


def module_commands(text: str) -> list[tuple[str, list[str]]]:
  """(`jbert.X`, its --flags) for each `python -m jbert.X ...` of a page; `run` for run.py."""
  out = []
  for s in snippets(text):
    for m in re.finditer(r"python3? (?:-m (jbert(?:\.\w+)?)|run\.py)\b(.*)", s):
      words = []
      for word in _tokens(m.group(2)):
        if word in ("--", "|", "||", "&&", ";", ">", "2>") or word.startswith(("#", ">")):
          break  # what follows is another command (jbert.distributed's, a pipe) or a comment
        words.append(word)
      flags = [w.split("=", 1)[0][2:] for w in words if w.startswith("--") and len(w) > 2]
      out.append((m.group(1) or "run", [f for f in flags if not f.startswith("config.")]))
  return out


@functools.cache
def command_flags() -> dict[str, dict]:
  """{command: {flag: is boolean}} read from the commands themselves (docs/_ext/jbert_docs.py), in a process
  of its own so that this one's absl flags stay as they are."""
  proc = subprocess.run([sys.executable, str(DOCS / "_ext" / "jbert_docs.py")], capture_output=True, text=True,
                        cwd=REPO, check=True, timeout=600)
  read = json.loads(proc.stdout.strip().splitlines()[-1])
  return {command: {f["name"]: f["boolean"] for f in flags} for command, flags in read.items()}


# absl's own flags, which every absl command takes.
ABSL_FLAGS = {"help", "helpfull", "helpshort", "verbosity", "v", "logtostderr", "alsologtostderr", "log_dir",
              "stderrthreshold", "flagfile", "undefok"}
# Commands that parse with argparse or their own FlagValues, without absl's flags.
NOT_ABSL = {"jbert.convert", "jbert.serve", "jbert.distributed", "jbert.tokenizer"}


def unknown_flags(command: str, flags: list[str]) -> list[str]:
  """The flags of `command` that it does not accept."""
  known = command_flags()[command]
  accepted = set(known) | ({"help"} if command in NOT_ABSL else ABSL_FLAGS)
  accepted |= {f"no{name}" for name, boolean in known.items() if boolean}
  return [f for f in flags if f not in accepted]


@functools.cache
def defined_flags() -> frozenset[str]:
  """Every flag name the scripts and the package define: absl's DEFINE_*("name"), and a script's own
  "--name" it parses by hand (a script also takes its imports' flags)."""
  names = set(ABSL_FLAGS) | {"config"}
  for path in [*REPO.glob("bench/*.py"), *REPO.glob("tpu/*.py"), *REPO.glob("jbert/**/*.py")]:
    text = path.read_text(encoding="utf-8")
    names |= set(re.findall(r"DEFINE_\w+\(\s*[\"'](\w+)[\"']", text))
    if path.parent.name in ("bench", "tpu"):
      names |= set(re.findall(r"[\"']--(\w+)", text))
  return frozenset(names | {f"no{n}" for n in names})
