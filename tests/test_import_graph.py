"""The package's import graph has no cycle (imports inside functions count too), and no
registered method's module imports another registered method's module (shared pieces live in
shared modules)."""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "fedjax_het"


def _module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, pathlib.Path]:
  return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def import_graph() -> dict[str, set[str]]:
  """{module: the package's modules it imports}, from every import statement in its source.

  `from fedjax_het.x import y` is an edge to fedjax_het.x.y when that is a module, else to
  fedjax_het.x.
  """
  modules = _modules()
  graph = {name: set() for name in modules}
  for name, path in modules.items():
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
      targets = []
      if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
      elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        targets = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules
                   else node.module for alias in node.names]
      graph[name].update(t for t in targets if t in modules and t != name)
  return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One cycle of `graph` as [a, b, ..., a], or None (depth-first search)."""
  state: dict[str, int] = {}   # 1: on the current path, 2: done
  path: list[str] = []

  def visit(node):
    state[node] = 1
    path.append(node)
    for child in sorted(graph[node]):
      if state.get(child) == 1:
        return path[path.index(child):] + [child]
      if child not in state:
        found = visit(child)
        if found:
          return found
    path.pop()
    state[node] = 2
    return None

  for node in sorted(graph):
    if node not in state:
      found = visit(node)
      if found:
        return found
  return None


def test_find_cycle_finds_a_cycle_and_accepts_a_tree():
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
  assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_graph_sees_imports_inside_functions():
  graph = import_graph()
  # `train.build_experiment` imports the stream experiment inside the function.
  assert "fedjax_het.stream_experiment" in graph["fedjax_het.train"]
  assert "fedjax_het.algorithms.cil_replay" in graph["fedjax_het.algorithms.icarl_fl"]


def test_the_package_has_no_import_cycle():
  cycle = find_cycle(import_graph())
  assert cycle is None, " -> ".join(cycle)


def test_cil_holds_building_blocks_only():
  """`fedjax_het.cil` imports no method and no trainer: the methods build on it."""
  graph = import_graph()
  for name, imports in graph.items():
    if name.startswith("fedjax_het.cil"):
      assert not {i for i in imports if i.startswith(("fedjax_het.algorithms", "fedjax_het.train",
                                                      "fedjax_het.experiment",
                                                      "fedjax_het.stream_experiment"))}, name


def method_modules() -> dict[str, str]:
  """{module: registered method names}: the module that defines each registered `make`."""
  from fedjax_het import algorithms  # pylint: disable=import-outside-toplevel
  out: dict[str, str] = {}
  for name, method in algorithms.METHODS.items():
    module = method.make.__module__
    out[module] = f"{out[module]}, {name}" if module in out else name
  return out


def algorithms_imports(source: str, module: str) -> set[str]:
  """The `fedjax_het.algorithms` modules that `module`'s `source` imports, in any form.

  `import fedjax_het.algorithms.x`, `from fedjax_het.algorithms import x`,
  `from fedjax_het.algorithms.x import y` and the relative forms (`from . import x`,
  `from .x import y`), at the top or inside functions.
  """
  prefix = "fedjax_het.algorithms."
  package = module.split(".")[:-1]
  found = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = package[:len(package) - node.level + 1] if node.level else []
      base = ".".join(base + ([node.module] if node.module else []))
      names = [base] + [f"{base}.{alias.name}" for alias in node.names]
    else:
      continue
    found.update(".".join(name.split(".")[:3]) for name in names if name.startswith(prefix))
  return found


def test_algorithms_imports_reads_every_form():
  source = ("import fedjax_het.algorithms.a\n"
            "import fedjax_het.algorithms.b as bee\n"
            "from fedjax_het.algorithms import c, d as dee\n"
            "from fedjax_het.algorithms.e import thing\n"
            "def f():\n  from fedjax_het.algorithms import g\n"
            "from . import h\n"
            "from .i import thing\n"
            "from ..algorithms import j\n"
            "import fedjax_het.engine.local\n"
            "from fedjax_het import algorithms\n")
  assert algorithms_imports(source, "fedjax_het.algorithms.m") == {
      f"fedjax_het.algorithms.{m}" for m in "abcdeghij"}


def test_no_method_module_imports_another_method_module():
  """A method's module builds on shared modules (`common`, `cil_replay`, `fedavg_family`,
  `private_training`, `htfl_common`, ...), never on another registered method's module."""
  methods = method_modules()
  assert {"fedjax_het.algorithms.fedavg", "fedjax_het.algorithms.glfc",
          "fedjax_het.algorithms.solo"} <= set(methods)
  modules = _modules()
  found = []
  for module in sorted(methods):
    imports = algorithms_imports(modules[module].read_text(), module)
    for other in sorted(imports & set(methods) - {module}):
      found.append(f"{module} ({methods[module]}) imports {other} ({methods[other]})")
  assert not found, "\n".join(found)


#: The modules of `fedjax_het/algorithms/` that hold shared pieces, not a method.
SHARED_MODULES = {"common", "fedavg_family", "private_training", "htfl_common", "cil_replay"}
#: The modules that build a run from its config: none of them names a method.
RUN_MODULES = ("train.py", "experiment.py", "stream_experiment.py", "seed_stack.py",
               "run_contract.py", "config.py", "workdir.py")


def registrations(source: str) -> tuple[dict[str, str], list[str]]:
  """({method name: its module}, problems) of the registry's `source`: every `register` call
  must be a statement of the module's top level, `register("name", make=m.f,
  default_config=m.g, validate_config=m.h)` with the three functions from one module `m`
  (and `class_incremental=True` for a method of the task stream)."""
  tree = ast.parse(source)
  top = {id(s.value) for s in tree.body if isinstance(s, ast.Expr)}
  found, problems = {}, []
  for node in ast.walk(tree):
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "register"):
      continue
    keywords = {k.arg: k.value for k in node.keywords}
    functions = [keywords.get(k) for k in ("make", "default_config", "validate_config")]
    modules = {f.value.id for f in functions
               if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)}
    name = node.args[0].value if (len(node.args) == 1 and isinstance(node.args[0], ast.Constant)
                                  and isinstance(node.args[0].value, str)) else None
    flag = keywords.get("class_incremental")
    if (id(node) not in top or name is None or len(modules) != 1 or None in functions
        or set(keywords) - {"make", "default_config", "validate_config", "class_incremental"}
        or (flag is not None and not (isinstance(flag, ast.Constant) and flag.value is True))):
      problems.append(f"line {node.lineno}: {ast.unparse(node)}")
    else:
      found[name] = modules.pop()
  return found, problems


def test_registrations_refuses_a_loop_and_mixed_modules():
  found, problems = registrations(
      'register("a", make=a.make_a, default_config=a.default_config,\n'
      '         validate_config=a.validate_config)\n'
      'register("b", make=b.make, default_config=c.default_config, validate_config=b.check)\n'
      'for m in (d, e):\n'
      '  register(m.NAME, make=m.make, default_config=m.default_config,\n'
      '           validate_config=m.validate_config, class_incremental=m.CIL)\n')
  assert found == {"a": "a"}
  assert [p.split(":")[0] for p in problems] == ["line 3", "line 5"]


def test_every_method_module_registers_in_one_style():
  """Each method of `fedjax_het/algorithms/` is one `register(...)` call of the registry
  naming its module's functions (no loop over modules, no per-module flag, no special case
  in the run's modules); every module there but the shared ones registers at least one."""
  from fedjax_het import algorithms  # pylint: disable=import-outside-toplevel
  found, problems = registrations((PACKAGE / "algorithms" / "__init__.py").read_text())
  assert not problems, "\n".join(problems)
  assert set(found) == set(algorithms.METHODS)  # nothing registers a built-in elsewhere
  for name, module in found.items():
    method = algorithms.METHODS[name]
    assert {f.__module__ for f in (method.make, method.default_config, method.validate_config)
            } == {f"fedjax_het.algorithms.{module}"}, name
  on_disk = {p.stem for p in (PACKAGE / "algorithms").glob("*.py")} - {"__init__"}
  assert SHARED_MODULES <= on_disk
  assert set(found.values()) == on_disk - SHARED_MODULES
  for path in RUN_MODULES:
    tree = ast.parse((PACKAGE / path).read_text())
    named = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)} & set(found)
    assert not named, f"fedjax_het/{path} names the methods {sorted(named)}"
