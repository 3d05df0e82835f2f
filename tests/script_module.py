"""Imports a script of the checkout (bench/, tpu/) as a module: they are run by path, not installed."""
import importlib.util
import pathlib
import types


def load(relative_path: str) -> types.ModuleType:
  path = pathlib.Path(__file__).resolve().parents[1] / relative_path
  spec = importlib.util.spec_from_file_location(path.stem + "_under_test", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
