"""Imports a script of the checkout (bench/, tpu/) as a module: they are run by path, not installed."""
import importlib.util
import pathlib
import types

from absl import flags


def load(relative_path: str) -> types.ModuleType:
  """The script as a module, with the absl flags it defines moved into a FlagValues of its own.

  Scripts define their flags on absl's global FLAGS at import, as scripts do; two scripts with a flag of the
  same name (`--preset`, `--steps`) could then not be imported into one test process.
  """
  path = pathlib.Path(__file__).resolve().parents[1] / relative_path
  spec = importlib.util.spec_from_file_location(path.stem + "_under_test", path)
  module = importlib.util.module_from_spec(spec)
  before = set(flags.FLAGS)
  spec.loader.exec_module(module)
  own = flags.FlagValues()
  for name in sorted(set(flags.FLAGS) - before):
    flag = flags.FLAGS[name]
    delattr(flags.FLAGS, name)
    own[name] = flag
  own.mark_as_parsed()
  for value in vars(module).values():
    if isinstance(value, flags.FlagHolder) and value.name in own:
      value._flagvalues = own  # pylint: disable=protected-access
  return module
