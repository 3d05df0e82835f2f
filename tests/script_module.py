"""Imports a script of the checkout (bench/, tpu/) as a module: they are run by path, not installed."""
import importlib.util
import os
import pathlib
import sys
import types

from absl import app  # noqa: F401  (its flags, e.g. --pdb, defined before any script's)
from absl import flags


_LOADERS = ("importlib._bootstrap", "importlib._bootstrap_external")


def load(relative_path: str) -> types.ModuleType:
  """The script as a module, with the absl flags it defines moved into a FlagValues of its own.

  Scripts define their flags on absl's global FLAGS at import, as scripts do; two scripts with a flag of the
  same name (`--preset`, `--steps`) could then not be imported into one test process.
  """
  path = pathlib.Path(__file__).resolve().parents[1] / relative_path
  if str(path.parent) not in sys.path:  # as `python bench/X.py` would: the script's folder imports (bench/timing)
    sys.path.append(str(path.parent))
  spec = importlib.util.spec_from_file_location(path.stem + "_under_test", path)
  module = importlib.util.module_from_spec(spec)
  own = flags.FlagValues()
  # A flag whose name another module of this process already defined (`--workdir` of jbert.glue and run.py) goes
  # straight into `own`; the script's other flags are moved there once it has run.
  define = flags.FlagValues.__setitem__

  def redirect(flag_values, name, flag):
    taken = flag_values is flags.FLAGS and name in flags.FLAGS and flags.FLAGS[name] is not flag
    define(own if taken else flag_values, name, flag)

  before = set(flags.FLAGS)
  flags.FlagValues.__setitem__ = redirect
  try:
    spec.loader.exec_module(module)
  finally:
    flags.FlagValues.__setitem__ = define
  # The scripts of the same folder it imports (bench/distill.py imports bench/finetune_e2e.py) are the script's.
  # Compared as strings: resolving every loaded module's path took ~0.5 s a call, 9 s of each worker's collection.
  siblings = [m for m in list(sys.modules.values())
              if os.path.dirname(getattr(m, "__file__", None) or "/") == str(path.parent)]
  for name in sorted(set(flags.FLAGS) - before):
    # Libraries the script imports first (grain, orbax, absl.app) define flags too: those stay global, where the
    # library reads them. absl names the caller of DEFINE_* as a flag's module: importlib's loader for the script.
    if flags.FLAGS.find_module_defining_flag(name) not in (
        None, module.__name__, *_LOADERS, *(m.__name__ for m in siblings)):
      continue
    flag = flags.FLAGS[name]
    delattr(flags.FLAGS, name)
    own[name] = flag
  own.mark_as_parsed()
  for value in (v for m in (module, *siblings) for v in vars(m).values()):
    if isinstance(value, flags.FlagHolder) and value.name in own:
      value._flagvalues = own  # pylint: disable=protected-access
  return module
