"""On PYTHONPATH (tests/gcs_emulator.HIDE_TENSORFLOW): `import tensorflow` fails in this interpreter, as in an
install without TensorFlow, while the test venv keeps it for the tests that need it. etils then opens gs://
through gcsfs rather than TensorFlow's file system, which is what a plain `pip install jbert` has."""
import sys

sys.modules["tensorflow"] = None  # `import tensorflow` raises ImportError; importlib.util.find_spec gives None
