"""On PYTHONPATH (tests/gcs_emulator.HIDE_TENSORFLOW): this interpreter cannot find TensorFlow, exactly as an
install without it cannot (`importlib.util.find_spec("tensorflow")` is None, `import tensorflow` raises
ModuleNotFoundError, nothing in sys.modules), while the test venv keeps it for the tests that need it. etils then
opens gs:// through gcsfs rather than TensorFlow's file system, and TFDS runs without TensorFlow, as a plain
`pip install jbert` has them. $JBERT_TEST_HIDE_PACKAGES (comma-separated top-level names) hides others instead,
e.g. `tensorflow,gcsfs` for an install that lacks gcsfs too."""
import importlib.machinery
import os
import sys

HIDDEN = frozenset(os.environ.get("JBERT_TEST_HIDE_PACKAGES", "tensorflow").split(","))


class _PathFinderWithoutHidden(importlib.machinery.PathFinder):
  """sys.path's finder, blind to the HIDDEN packages (`tensorflow`, not tensorflow_datasets and the like)."""

  @classmethod
  def find_spec(cls, fullname, path=None, target=None):
    if fullname.partition(".")[0] in HIDDEN:
      return None
    return super().find_spec(fullname, path, target)


sys.meta_path[:] = [_PathFinderWithoutHidden if finder is importlib.machinery.PathFinder else finder
                    for finder in sys.meta_path]
