"""The documentation site builds with warnings as errors, and what it promises to catch is caught: a broken
link, a page outside every toctree, an API page that has drifted from `jbert.__all__`."""
import pathlib
import re
import shutil
import subprocess
import sys

from tests import doc_commands

DOCS = doc_commands.DOCS


def _build(src: pathlib.Path, out: pathlib.Path) -> subprocess.CompletedProcess:
  # -E: no saved environment, so each build reads every page; the command the docs tell a contributor to run.
  return subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-E", "-q", "-b", "html", str(src),
                         str(out)], capture_output=True, text=True, timeout=600, check=False)


def test_the_site_builds_with_warnings_as_errors(tmp_path):
  proc = _build(DOCS, tmp_path / "html")
  assert proc.returncode == 0, proc.stderr[-4000:]
  html = tmp_path / "html"
  pages = {str(p.relative_to(html)) for p in html.rglob("*.html")}
  assert {"index.html", "getting-started.html", "pretraining.html", "corpora.html", "finetuning/index.html",
          "finetuning/question-answering.html", "finetuning/ner.html", "running.html", "search.html",
          "serving.html", "checkpoints.html", "tpu.html", "gpu.html", "performance.html", "ARCHITECTURE.html",
          "api.html", "commands.html", "changelog.html"} <= pages
  api = (html / "api.html").read_text(encoding="utf-8")
  import jbert  # pylint: disable=import-outside-toplevel
  assert all(f'id="jbert.{name}"' in api for name in jbert.__all__)
  commands = re.sub(r"<[^>]+>", "", (html / "commands.html").read_text(encoding="utf-8"))
  for command, flags in doc_commands.command_flags().items():  # every flag of every command, from the code
    section = commands[commands.index(f"python -m {command}" if command != "run" else "python run.py"):]
    assert all(f"--{flag}" in section or flag.isupper() for flag in flags), command


def test_a_broken_link_a_lost_page_and_a_stale_api_name_fail_the_build(tmp_path):
  src = tmp_path / "docs"
  src.mkdir()
  shutil.copy(DOCS / "conf.py", src)
  shutil.copytree(DOCS / "_ext", src / "_ext")
  (src / "index.md").write_text("# Site\n\n```{toctree}\napi\nguide\n```\n", encoding="utf-8")
  (src / "guide.md").write_text("# Guide\n\nSee [the recipe](recipes.md) and [the API](api.md#no-such-heading).\n",
                                encoding="utf-8")
  (src / "lost.md").write_text("# In no toctree\n", encoding="utf-8")
  api = (DOCS / "api.md").read_text(encoding="utf-8")
  assert ".. autofunction:: jbert.describe\n" in api
  (src / "api.md").write_text(api.replace(".. autofunction:: jbert.describe\n", ".. autofunction:: jbert.gone\n"),
                              encoding="utf-8")
  proc = _build(src, tmp_path / "html")
  assert proc.returncode != 0
  assert "recipes.md" in proc.stderr  # the broken link
  assert "no-such-heading" in proc.stderr  # a heading that is not there
  assert "lost.md" in proc.stderr and "toctree" in proc.stderr  # the page no one reaches
  assert "jbert.describe is in jbert.__all__ but not documented on the API page" in proc.stderr
  assert "failed to import 'gone' from module 'jbert'" in proc.stderr  # a name that is no longer public
