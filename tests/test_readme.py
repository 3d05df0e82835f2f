"""README checks: every `python run.py` command it shows names a config that loads and only keys that config
has; the keys its data table names exist; its AOT memory table is tpu/README.md's."""
import importlib
import pathlib
import re
import shlex
import sys

import ml_collections
import pytest

from jbert.data import config as data_config

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
README = (REPO / "README.md").read_text(encoding="utf-8")


def _run_commands() -> list[list[str]]:
  """The `python run.py ...` commands of the README's code blocks and inline code, continuation lines joined."""
  text = README.replace("\\\n", " ")
  found = re.findall(r"python run\.py [^`\n]*", text)
  return [shlex.split(c.split("#")[0].replace("[", "").replace("]", "").replace("...", "")) for c in found]


COMMANDS = _run_commands()


def _has_key(config: ml_collections.ConfigDict, key: str) -> bool:
  node = config
  for part in key.split("."):
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      return False
    node = node[part]
  return True


def test_readme_shows_the_commands_a_newcomer_needs():
  joined = [" ".join(c) for c in COMMANDS]
  assert any("configs/tiny.py" in c for c in joined)  # the demo
  assert any("configs/phase2.py:tiny" in c and "--config.init_from=" in c for c in joined)  # its phase 2
  assert any("--config.data.source=text" in c and "--config.init_from=" in c for c in joined)  # HF recipe


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c)[:60] for c in COMMANDS])
def test_run_commands_use_configs_and_keys_that_exist(command):
  flags = dict(arg.split("=", 1) for arg in command[2:] if "=" in arg)
  path, _, arg = flags["--config"].partition(":")
  if path == "configs/NAME.py":
    return  # the usage pattern itself
  config = importlib.import_module(f"configs.{pathlib.Path(path).stem}").get_config(arg or None)
  keys = [k.removeprefix("--config.") for k in flags if k.startswith("--config.")]
  assert keys or "--workdir" in flags
  assert [k for k in keys if k != "KEY" and not _has_key(config, k)] == []


def test_data_table_keys_exist():
  table = README[README.index("| source | input | a document is |"):]
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
  assert table(README) == table((REPO / "tpu" / "README.md").read_text(encoding="utf-8"))
  assert len(table(README)) == 14
