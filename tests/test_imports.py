"""No import cycles in tfemb, read from the source.

The graph: one node per module of tfemb (a package is its `__init__.py`),
one edge per `import` or `from ... import` of a tfemb module, absolute or
relative, at module level or inside a function or class (an import moved
into a function still ties the two modules together: it hides a cycle, it
does not break it). An import's edge goes to the module it names:

* `import tfemb.a.b` -> `tfemb.a.b`;
* `from tfemb.a import b` -> `tfemb.a.b` if that module exists, else
  `tfemb.a` (`b` is a name defined in it);
* a name that is no module of tfemb -> the longest prefix that is one.

Packages. Importing `tfemb.a.b` makes Python run `tfemb/a/__init__.py`
(and `tfemb/__init__.py`) first; that implicit load is no edge. Counted, it
would put every package whose `__init__` re-exports its submodules in a
cycle with each of them, although Python always runs such an `__init__` to
its end (it imports the submodule, which finds its package being loaded
and needs nothing from it). Every import written in the source counts,
including one of a package's `__init__` (`from tfemb.a import name`, `from
. import name`, `import tfemb`): a submodule that takes a name from its
own package's `__init__` is a cycle, which works only while the `__init__`
happens to define the name before it imports the submodule.
"""

import ast
import pathlib
from typing import Dict, List, Mapping, Optional

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "tfemb"

Graph = Mapping[str, Mapping[str, int]]  # module -> {imported: line}


def _module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> Dict[str, pathlib.Path]:
  """Every module of tfemb by name (a package by its own name)."""
  return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _owner(name: str, known) -> str:
  """`name` if it is a module of tfemb, else its longest prefix that is."""
  while name not in known:
    name = name.rpartition(".")[0]
  return name


def imports(module: str, source: str, is_package: bool,
            known) -> Dict[str, int]:
  """The tfemb modules (in `known`) that `source`, the text of `module`,
  imports, each with the line of its first import."""
  package = module if is_package else module.rpartition(".")[0]
  found: Dict[str, int] = {}

  def add(name: str, line: int):
    if name == "tfemb" or name.startswith("tfemb."):
      found.setdefault(_owner(name, known), line)

  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      for alias in node.names:
        add(alias.name, node.lineno)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:  # relative: `.` is the package, `..` its parent
        prefix = package.rsplit(".", node.level - 1)[0]
        base = f"{prefix}.{base}" if base else prefix
      for alias in node.names:
        full = f"{base}.{alias.name}"
        add(full if full in known else base, node.lineno)
  found.pop(module, None)
  return found


def graph() -> Dict[str, Dict[str, int]]:
  known = modules()
  return {name: imports(name, path.read_text(), path.name == "__init__.py",
                        known)
          for name, path in known.items()}


def find_cycle(edges: Graph) -> Optional[List[str]]:
  """A cycle of `edges`, as `[a, b, ..., a]`, or None."""
  done, path, on_path = set(), [], {}

  def visit(node: str) -> Optional[List[str]]:
    on_path[node] = len(path)
    path.append(node)
    for target in sorted(edges.get(node, ())):
      if target in on_path:
        return path[on_path[target]:] + [target]
      if target not in done:
        cycle = visit(target)
        if cycle:
          return cycle
    path.pop()
    del on_path[node]
    done.add(node)
    return None

  for node in sorted(edges):
    if node not in done:
      cycle = visit(node)
      if cycle:
        return cycle
  return None


def describe(cycle: List[str], edges: Graph) -> str:
  """`a -> b (a, line 3) -> a (b, line 9)`."""
  steps = [cycle[0]] + [f"{b} ({a}, line {edges[a][b]})"
                        for a, b in zip(cycle, cycle[1:])]
  return " -> ".join(steps)


GRAPH = graph()


def test_no_import_cycles():
  cycle = find_cycle(GRAPH)
  assert cycle is None, "An import cycle: " + describe(cycle, GRAPH)


def test_the_reader_sees_every_kind_of_import():
  known = set(GRAPH) | {"tfemb.pkg", "tfemb.pkg.sub", "tfemb.pkg.other"}
  source = (
      "import os\n"
      "import tfemb.configs\n"
      "from tfemb import optimizers\n"
      "from tfemb.optimizers import SGD\n"
      "from . import other\n"
      "from . import NAME\n"
      "from .. import resolution\n"
      "def f():\n"
      "  from tfemb.host import step\n")
  assert imports("tfemb.pkg.sub", source, False, known) == {
      "tfemb.configs": 2, "tfemb.optimizers": 3, "tfemb.pkg.other": 5,
      "tfemb.pkg": 6, "tfemb.resolution": 7, "tfemb.host.step": 9}
  # In a package's `__init__`, `.` is the package itself.
  assert imports("tfemb.pkg", "from . import sub\n", True, known) == {
      "tfemb.pkg.sub": 1}


def test_the_graph_holds_tfembs_imports():
  assert "tfemb.resolution" in GRAPH["tfemb.host.step"]
  assert "tfemb.optimizers.parameters" in GRAPH["tfemb.optimizers"]
  # Imported inside a function (the Keras layer on first use).
  assert "tfemb.layers" in GRAPH["tfemb.patching"]


@pytest.mark.parametrize("edges, expected", [
    ({"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}}, ["a", "b", "c", "a"]),
    ({"a": {"a": 1}}, ["a", "a"]),
    ({"a": {"b": 1, "c": 1}, "b": {"d": 1}, "c": {"d": 1}, "d": {}}, None),
])
def test_the_cycle_finder(edges, expected):
  assert find_cycle(edges) == expected


def test_a_planted_cycle_is_found_and_named():
  # The rules finding their optimizer's declaration (the declarations
  # import the rules): the cycle there was before `update_rules.apply` took
  # the rule.
  planted = {name: dict(targets) for name, targets in GRAPH.items()}
  planted["tfemb.update_rules"]["tfemb.optimizers"] = 99
  cycle = find_cycle(planted)
  assert cycle is not None
  assert "tfemb.update_rules" in cycle and "tfemb.optimizers" in cycle
  assert "tfemb.optimizers (tfemb.update_rules, line 99)" in describe(
      cycle, planted)
