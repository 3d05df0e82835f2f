"""Sphinx configuration of jbert's documentation site (MyST Markdown, as jax, flax and optax).

Build: `pip install -e .[docs] && sphinx-build docs docs/_build/html`; the test suite builds it with -W
(tests/test_docs.py), so a broken link, a page outside every toctree or a stale API name fails a test.
"""
import pathlib
import sys

DOCS = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))  # jbert_docs: the generated flag tables and the API check
sys.path.insert(0, str(DOCS.parent))  # the checkout's jbert and run.py, whatever is installed

project = "jbert"
author = "jbert contributors"
copyright = "jbert contributors"  # pylint: disable=redefined-builtin

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "jbert_docs"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store"]

# Headings become link targets (`[text](page.md#a-heading)`), checked at build time like the pages themselves.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]
# A link to a file of the repository outside docs/ (tpu/README.md, configs/...) is no Sphinx document:
# the pages name such files in code spans instead, so every link that remains is checked.

autodoc_typehints = "description"
autodoc_member_order = "bysource"
autodoc_default_options = {"show-inheritance": False}
# Flax modules carry dataclass fields and jax pytrees that autodoc should not chase into.
autodoc_mock_imports = []

html_theme = "furo"
html_title = "jbert"
