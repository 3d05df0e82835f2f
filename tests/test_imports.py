"""No import circle between the files of jbert/, function-level imports included (issue 32): a module that needs
another's piece and is needed by it means the piece belongs a floor lower."""
import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "jbert"


def _modules() -> dict[str, pathlib.Path]:
  modules = {}
  for path in PACKAGE.rglob("*.py"):
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
  return modules


def import_graph() -> dict[str, set[str]]:
  """module -> the jbert modules it imports anywhere in its file (`from pkg import mod` names the module)."""
  modules = _modules()
  graph = {name: set() for name in modules}
  for name, path in modules.items():
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      if isinstance(node, ast.Import):
        for alias in node.names:
          target = alias.name
          while target and target not in modules:
            target = target.rpartition(".")[0]
          if target:
            graph[name].add(target)
      elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module":
        # importlib by name (jbert/__init__.py's lazy names): a constant argument is an import.
        if node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value in modules:
          graph[name].add(node.args[0].value)
      elif isinstance(node, ast.Dict) and node.values and all(
          isinstance(v, ast.Constant) and v.value in modules for v in node.values):
        graph[name].update(v.value for v in node.values)  # a table of modules imported by name (_EXPORTS)
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:  # relative: from the package, `level - 1` floors up
          floors = package.split(".")
          base = ".".join(floors[:len(floors) - node.level + 1] + ([base] if base else []))
        if base.split(".")[0] != "jbert":
          continue
        for alias in node.names:
          graph[name].add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    graph[name].discard(name)
  return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return found


def test_the_checker_finds_circles_and_only_them():
  assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
  assert circles({"a": {"b"}, "b": set()}) == []


def test_no_module_of_jbert_imports_itself_through_others():
  graph = import_graph()
  assert "jbert.tasks.base" in graph["jbert.tasks.classification.task"]  # the graph sees the imports at all
  assert {"jbert.inference", "jbert.model.registry"} <= graph["jbert"]  # and those made by name
  assert circles(graph) == []


def script_graph(folder: str) -> dict[str, set[str]]:
  """script -> the scripts of the same folder it imports anywhere in its file (bench/ and tpu/ scripts import each
  other by bare name, their folder on sys.path)."""
  paths = {p.stem: p for p in (PACKAGE.parent / folder).glob("*.py")}
  graph = {name: set() for name in paths}
  for name, path in paths.items():
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      if isinstance(node, ast.Import):
        graph[name].update(a.name.split(".")[0] for a in node.names if a.name.split(".")[0] in paths)
      elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in paths:
        graph[name].add(node.module.split(".")[0])
    graph[name].discard(name)
  return graph


def test_no_script_of_bench_or_tpu_imports_itself_through_others():
  bench = script_graph("bench")
  assert {"device_parts", "device_shapes"} <= bench["device_check"] | bench["device_parts"]  # sees the imports
  assert circles(bench) == [] and circles(script_graph("tpu")) == []


ROOT = PACKAGE.parent
SCRIPT_FOLDERS = ("bench", "tpu")  # scripts importing each other by bare name, their folder on sys.path


def repository_modules() -> dict[str, pathlib.Path]:
  """Every Python file that imports others: jbert's modules, configs/ (`configs.NAME`), run.py (`run`) and the
  scripts of bench/ and tpu/ (`bench.NAME`, `tpu.NAME`)."""
  modules = dict(_modules())
  modules["configs"] = ROOT / "configs" / "__init__.py"
  modules.update({f"configs.{p.stem}": p for p in (ROOT / "configs").glob("*.py") if p.stem != "__init__"})
  modules["run"] = ROOT / "run.py"
  for folder in SCRIPT_FOLDERS:
    modules.update({f"{folder}.{p.stem}": p for p in (ROOT / folder).glob("*.py")})
  return modules


def repository_graph() -> dict[str, set[str]]:
  """module -> the modules of `repository_modules` it imports anywhere in its file (function-level imports and
  importlib calls with a constant name included)."""
  modules = repository_modules()

  def known(target: str, folder: str | None) -> str | None:
    if folder and target.split(".")[0] in {n.split(".")[1] for n in modules if n.startswith(folder + ".")}:
      target = f"{folder}.{target}"  # a bare name of the script's own folder
    while target and target not in modules:
      target = target.rpartition(".")[0]
    return target or None

  graph = {name: set() for name in modules}
  for name, path in modules.items():
    folder = name.split(".")[0] if name.split(".")[0] in SCRIPT_FOLDERS else None
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      targets = []
      if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          floors = package.split(".")
          base = ".".join(floors[:len(floors) - node.level + 1] + ([base] if base else []))
        targets = [f"{base}.{a.name}" for a in node.names]
      elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module":
        targets = [node.args[0].value] if node.args and isinstance(node.args[0], ast.Constant) else []
      elif isinstance(node, ast.Dict) and node.values and all(
          isinstance(v, ast.Constant) and v.value in modules for v in node.values):
        targets = [v.value for v in node.values]
      graph[name].update(t for t in (known(t, folder) for t in targets) if t)
    graph[name].discard(name)
  return graph


def test_no_circle_anywhere_in_the_repository_and_jbert_imports_nothing_above_it():
  graph = repository_graph()
  # The graph sees each kind of file's imports at all.
  assert {"configs.base", "jbert.tasks"} <= graph["configs.electra"] and "jbert.errors" in graph["run"]
  assert "bench.timing" in graph["bench.inference"] and "bench.inference" in graph["bench.roofline"]
  assert "configs.finetune" in graph["bench.finetune"] and "jbert.train.trainer" in graph["run"]
  assert circles(graph) == []
  # jbert is the floor everything else stands on: an installed package has no configs/, run.py, bench/ or tpu/.
  above = {name: sorted(t for t in targets if not t.startswith("jbert"))
           for name, targets in graph.items() if name.split(".")[0] == "jbert"}
  assert {name: targets for name, targets in above.items() if targets} == {}


def test_the_repository_checker_finds_a_circle_through_configs(tmp_path):
  graph = repository_graph()
  graph["jbert.tasks"] = graph["jbert.tasks"] | {"configs.finetune"}  # as jbert/glue.py once imported configs
  assert any("configs.finetune" in c and "jbert.tasks" in c for c in circles(graph))
