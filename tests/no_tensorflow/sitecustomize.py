"""On PYTHONPATH (tests/gcs_emulator.HIDE_TENSORFLOW): this interpreter cannot find TensorFlow, exactly as an
install without it cannot (`importlib.util.find_spec("tensorflow")` is None, `import tensorflow` raises
ModuleNotFoundError, nothing in sys.modules), while the test venv keeps it for the tests that need it. etils then
opens gs:// through gcsfs rather than TensorFlow's file system, and TFDS runs without TensorFlow, as a plain
`pip install jbert` has them."""
import importlib.machinery
import sys


class _PathFinderWithoutTensorFlow(importlib.machinery.PathFinder):
  """sys.path's finder, blind to the `tensorflow` package (not to tensorflow_datasets and the like)."""

  @classmethod
  def find_spec(cls, fullname, path=None, target=None):
    if fullname.partition(".")[0] == "tensorflow":
      return None
    return super().find_spec(fullname, path, target)


sys.meta_path[:] = [_PathFinderWithoutTensorFlow if finder is importlib.machinery.PathFinder else finder
                    for finder in sys.meta_path]
