"""Sphinx extension of jbert's docs: flag tables read from the commands themselves, and the API page's check.

`{command-flags} jbert.embed` renders the flags a command accepts (name, default, help) from its absl flag
definitions or its argparse parser at build time, so the tables cannot drift from `--help`. The same reading
(`command_flags`) lets tests/test_readme.py check every `--flag` a page shows.

The API page must document exactly `jbert.__all__`: a public name missing from it, or a documented name that is
no longer public, is a build warning (an error under -W, as the test suite builds).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import pathlib
import sys

from docutils import nodes
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

LOG = logging.getLogger(__name__)
# run.py lives at the root of the checkout, beside docs/.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

# Every command a page may show, by how a user starts it: `python -m NAME`, or `python run.py` for "run".
COMMANDS = ("run", "jbert.data", "jbert.tokenizer", "jbert.convert", "jbert.embed", "jbert.fill_mask",
            "jbert.predict", "jbert.search", "jbert.serve", "jbert.glue", "jbert.distributed", "jbert.tfds_build")
# The module that defines a command's flags, where that is not the command's own name (`python -m PKG`).
_MODULES = {"jbert.data": "jbert.data.__main__", "jbert.tokenizer": "jbert.tokenizer.__main__",
            "jbert.search": "jbert.search.__main__", "jbert.serve": "jbert.serve.__main__"}
API_PAGE = "api"


@dataclasses.dataclass(frozen=True)
class Flag:
  name: str  # without dashes; a positional argument in capitals
  default: str
  help: str
  boolean: bool = False  # absl booleans also take --noNAME


class _Parsed(Exception):
  def __init__(self, parser: argparse.ArgumentParser):
    super().__init__()
    self.parser = parser


def _argparse_flags(module) -> list[Flag]:
  """The parser the command builds, caught as it parses (no command runs)."""
  def catch(parser, *unused_args, **unused_kwargs):
    raise _Parsed(parser)
  saved = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args
  argparse.ArgumentParser.parse_args = argparse.ArgumentParser.parse_known_args = catch
  try:
    (module.parse_args if hasattr(module, "parse_args") else module.main)([])
  except _Parsed as caught:
    parser = caught.parser
  else:
    raise RuntimeError(f"{module.__name__} parsed no arguments")
  finally:
    argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = saved
  out = []
  for action in parser._actions:  # pylint: disable=protected-access
    if isinstance(action, argparse._HelpAction):  # pylint: disable=protected-access
      continue
    name = action.option_strings[-1].lstrip("-") if action.option_strings else action.dest.upper()
    help_text = action.help or ""
    if action.choices:
      help_text = f"{help_text} One of: {', '.join(map(str, action.choices))}.".strip()
    default = "(required)" if action.required else repr(action.default) if action.option_strings else ""
    store_true = isinstance(action, argparse._StoreTrueAction)  # pylint: disable=protected-access
    out.append(Flag(name, default, help_text, store_true))
  return out


_CACHE: dict[str, list[Flag]] = {}


def command_flags(command: str) -> list[Flag]:
  """The flags `command` (one of COMMANDS) accepts, as its --help lists them, absl's own excepted."""
  if command in _CACHE:
    return _CACHE[command]
  from absl import flags  # pylint: disable=import-outside-toplevel
  name = _MODULES.get(command, command)
  module = importlib.import_module(name)
  private = [v for v in vars(module).values() if isinstance(v, flags.FlagValues) and v is not flags.FLAGS]
  if private:  # a command parsing with its own FlagValues (jbert.distributed, jbert.tokenizer)
    holder = private[0]
    found = [holder[n] for n in sorted(holder) if n not in ("flagfile", "undefok")]
  elif hasattr(module, "parse_args") or "argparse" in vars(module):
    _CACHE[command] = _argparse_flags(module)
    return _CACHE[command]
  else:
    found = flags.FLAGS.get_key_flags_for_module(name)
    # Commands are separate programs: two may define the same flag (run.py's and jbert.glue's --workdir), so
    # this process forgets a command's own definitions once read.
    for flag in list(flags.FLAGS.flags_by_module_dict().get(name, [])):
      if flag.name in flags.FLAGS:
        delattr(flags.FLAGS, flag.name)
  out = []
  for flag in sorted(found, key=lambda f: f.name):
    if flag.name in ("flagfile", "undefok", "helpfull", "helpshort", "helpxml", "help", "only_check_args",
                     "pdb", "pdb_post_mortem", "run_with_pdb", "run_with_profiling", "profile_file",
                     "use_cprofile_for_profiling"):
      continue
    default = flag.default_as_str if flag.default is not None else "None"
    out.append(Flag(flag.name, default.strip("'\""), flag.help or "", flag.flag_type() == "bool"))
  _CACHE[command] = out
  return out


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]], literal_cols: tuple[int, ...]) -> nodes.table:
  table = nodes.table()
  group = nodes.tgroup(cols=len(header))
  table += group
  for width in (2, 1, 6)[:len(header)]:
    group += nodes.colspec(colwidth=width)
  def row(cells, literal=()):
    r = nodes.row()
    for i, cell in enumerate(cells):
      entry = nodes.entry()
      entry += nodes.paragraph("", "", nodes.literal(cell, cell) if i in literal and cell else nodes.Text(cell))
      r += entry
    return r
  head = nodes.thead()
  head += row(header)
  body = nodes.tbody()
  for cells in rows:
    body += row(cells, literal_cols)
  group += head
  group += body
  return table


class CommandFlags(SphinxDirective):
  """`{command-flags} jbert.embed`: the command's flag table."""
  required_arguments = 1

  def run(self):
    command = self.arguments[0]
    if command not in COMMANDS:
      raise self.error(f"{command} is not a jbert command; known: {', '.join(COMMANDS)}")
    rows = []
    for flag in command_flags(command):
      prefix = "" if flag.name.isupper() else "--"
      rows.append((f"{prefix}{flag.name}", flag.default, flag.help))
    return [_table(("flag", "default", "what it sets"), rows, (0, 1))]


def _check_api(app, doctree):
  if app.env.docname != API_PAGE:
    return
  import jbert  # pylint: disable=import-outside-toplevel
  from sphinx import addnodes  # pylint: disable=import-outside-toplevel
  documented = {i.removeprefix("jbert.") for sig in doctree.findall(addnodes.desc_signature)
                for i in sig.get("ids", []) if i.count(".") == 1 and i.startswith("jbert.")}
  public = set(jbert.__all__)
  for name in sorted(public - documented):
    LOG.warning(f"jbert.{name} is in jbert.__all__ but not documented on the API page; add it to docs/api.md",
                location=API_PAGE)
  for name in sorted(documented - public):
    LOG.warning(f"jbert.{name} is documented on the API page but not in jbert.__all__; remove it from docs/api.md",
                location=API_PAGE)


def setup(app):
  app.add_directive("command-flags", CommandFlags)
  app.connect("doctree-read", _check_api)
  return {"parallel_read_safe": False, "parallel_write_safe": True}


if __name__ == "__main__":
  # `python docs/_ext/jbert_docs.py`: every command's flags as JSON, for tests/doc_commands.py, which reads them
  # in a process of their own (importing a command defines its flags in absl's global FLAGS).
  import json  # pylint: disable=import-outside-toplevel
  print(json.dumps({c: [dataclasses.asdict(f) for f in command_flags(c)] for c in sys.argv[1:] or COMMANDS}))
