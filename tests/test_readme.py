"""README and documentation checks: every `python run.py` command a page shows names a config that loads and
only keys that config has; every `python -m jbert.X` command only flags that command accepts; every file of the
repository a page names exists; the data table's keys exist; the AOT memory table is tpu/README.md's."""
import importlib
import pathlib
import re
import sys

import ml_collections
import pytest

from jbert.data import config as data_config
from tests import doc_commands

REPO = doc_commands.REPO
sys.path.insert(0, str(REPO))
README = (REPO / "README.md").read_text(encoding="utf-8")
PAGES = doc_commands.pages()
DOCS = {path: text for path, text in PAGES.items() if path != "README.md"}


def _commands(kind) -> list[tuple[str, object]]:
  return [(path, c) for path, text in PAGES.items() for c in kind(text)]


RUN_COMMANDS = _commands(doc_commands.run_commands)
MODULE_COMMANDS = _commands(doc_commands.module_commands)
SCRIPT_COMMANDS = _commands(doc_commands.script_commands)


def _has_key(config: ml_collections.ConfigDict, key: str) -> bool:
  node = config
  for part in key.split("."):
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      return False
    node = node[part]
  return True


def _shows(text, *parts) -> bool:
  return any(all(p in " ".join(c) for p in parts) for c in doc_commands.run_commands(text))


def test_readme_shows_the_commands_a_newcomer_needs():
  assert _shows(README, "configs/tiny.py")  # the demo
  assert _shows(README, "configs/phase2.py:tiny", "--config.init_from=")  # its phase 2
  assert _shows(README, "--config.data.source=text", "--config.init_from=")  # HF recipe


def test_the_site_shows_them_too():
  assert _shows(DOCS["docs/getting-started.md"], "configs/tiny.py")
  assert _shows(DOCS["docs/getting-started.md"], "configs/phase2.py:tiny", "--config.init_from=")
  assert _shows(DOCS["docs/pretraining.md"], "--config.data.source=text", "--config.init_from=")


def test_every_page_is_read():
  assert {"README.md", "docs/index.md", "docs/getting-started.md", "docs/finetuning/ner.md",
          "docs/performance.md"} <= set(PAGES)
  assert len([p for p, _ in RUN_COMMANDS if p in DOCS]) >= 15
  assert len([p for p, _ in MODULE_COMMANDS if p in DOCS]) >= 40
  assert len([p for p, _ in SCRIPT_COMMANDS if p in DOCS]) >= 20


@pytest.mark.parametrize("path,command", RUN_COMMANDS, ids=[f"{p}:{' '.join(c)[:60]}" for p, c in RUN_COMMANDS])
def test_run_commands_use_configs_and_keys_that_exist(path, command):
  flags = dict(arg.split("=", 1) for arg in command[2:] if arg.startswith("--") and "=" in arg)
  path, _, arg = flags["--config"].partition(":")
  if path == "configs/NAME.py":
    return  # the usage pattern itself
  config = importlib.import_module(f"configs.{pathlib.Path(path).stem}").get_config(arg or None)
  keys = [k.removeprefix("--config.") for k in flags if k.startswith("--config.")]
  assert keys or "--workdir" in flags
  assert [k for k in keys if k != "KEY" and not _has_key(config, k)] == []


@pytest.mark.parametrize("path,command", MODULE_COMMANDS,
                         ids=[f"{p}:{c}:{','.join(f)[:50]}" for p, (c, f) in MODULE_COMMANDS])
def test_module_commands_use_flags_the_command_takes(path, command):
  name, flags = command
  assert name in doc_commands.command_flags(), f"{path}: python -m {name} is no jbert command"
  assert doc_commands.unknown_flags(name, flags) == [], f"{path}: {name}"


@pytest.mark.parametrize("path,command", SCRIPT_COMMANDS,
                         ids=[f"{p}:{c}:{','.join(f)[:50]}" for p, (c, f) in SCRIPT_COMMANDS])
def test_bench_and_tpu_commands_exist_and_use_defined_flags(path, command):
  script, flags = command
  assert (REPO / script).is_file(), f"{path}: {script}"
  assert [f for f in flags if f not in doc_commands.defined_flags()] == [], f"{path}: {script}"


def test_a_flag_no_command_takes_is_found():
  assert doc_commands.unknown_flags("jbert.embed", ["model", "nopacking", "packing", "verbosity", "modle"]) == ["modle"]
  assert doc_commands.unknown_flags("jbert.serve", ["model", "port", "verbosity"]) == ["verbosity"]  # argparse
  assert doc_commands.module_commands("`python -m jbert.distributed --num_processes=2 -- run.py --workdir=W`") == [
      ("jbert.distributed", ["num_processes"])]


def test_files_the_pages_name_exist():
  named = {(path, m) for path, text in PAGES.items()
           for m in re.findall(r"(?<![\w/.$~-])((?:configs|bench|tpu|tests|jbert|docs)/[\w/.-]*\w\.(?:py|sh|md))",
                               text)}
  assert len(named) > 50
  assert sorted(f"{path}: {m}" for path, m in named if not (REPO / m).exists()) == []


def _slug(heading: str) -> str:
  """A heading's anchor as GitHub and MyST (myst_heading_anchors) make it."""
  return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_links_reach_pages_and_headings():
  """The README is not part of the site, so Sphinx does not check its links: every relative link names a file of
  the repository, and an anchor a heading of that file."""
  links = re.findall(r"\]\(([^)\s]+)\)", README)
  local = [link for link in links if "://" not in link]
  assert len(local) >= 10
  missing = []
  for link in local:
    path, _, anchor = link.partition("#")
    target = REPO / path
    if not target.is_file():
      missing.append(link)
    elif anchor and anchor not in {_slug(h) for h in re.findall(r"^#+ (.+)$", target.read_text(encoding="utf-8"),
                                                                  re.M)}:
      missing.append(link)
  assert missing == []


def test_data_table_keys_exist():
  text = DOCS["docs/corpora.md"]
  table = text[text.index("| source | input | a document is |"):]
  table = table[:table.index("\n\n")]
  named = set(re.findall(r"`data\.(\w+)`", table)) | set(re.findall(r"\(\+ `(\w+)`", table))
  named |= set(re.findall(r", `(tfds_\w+)`", table))
  assert {"tfds_name", "files", "text_files", "synthetic_dir", "tfds_split", "tfds_text_key", "tfds_data_dir"} <= named
  defaults = data_config.default_pretrain_config()
  assert [k for k in named if k not in defaults] == []


def test_aot_memory_table_is_the_one_in_tpu_readme():
  def table(text):
    start = text.index("| config | topology | mesh | attention (train / eval) | per-chip memory | fits |")
    rows = [line.strip() for line in text[start:].splitlines()]
    return rows[:rows.index("")] if "" in rows else rows
  assert table(DOCS["docs/performance.md"]) == table((REPO / "tpu" / "README.md").read_text(encoding="utf-8"))
  assert len(table(DOCS["docs/performance.md"])) == 20  # ModernBERT-base: 6 rows of them
