"""The package's layering (docs/architecture.md, "Layers"), read from the
source: which tfemb module may import which.

Each rule is checked on the static imports of the modules (module level
and inside functions), followed transitively through tfemb's own modules;
a package's `__init__` counts only when it is imported itself.
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "tfemb"

# Plain configuration: no engine, no Keras.
CONFIGS = ("tfemb.configs", "tfemb.optimizers", "tfemb.resolution",
           "tfemb.options", "tfemb.shapes", "tfemb.update_rules",
           "tfemb.sparsecore_configs")
ENGINES = ("tfemb.host", "tfemb.mid_level", "tfemb.tpu", "tfemb.layers",
           "tfemb.kernels", "tfemb.compat", "tfemb.v0", "tfemb.serving")
KERAS = ("keras", "tf_keras", "tfemb.layers")


def _module_name(path: pathlib.Path) -> str:
  parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
  return ".".join(parts)


def _modules():
  return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


MODULES = _modules()


def _resolve(name: str) -> str:
  """`name` or the module that holds it (`from tfemb.x import Class`)."""
  while name and name not in MODULES and (name + ".__init__") not in MODULES:
    name = name.rpartition(".")[0]
  return name


def direct_imports(module: str):
  """Every module `module` imports by name (tfemb's and others')."""
  path = MODULES[module]
  package = module if path.name == "__init__.py" else module.rpartition(
      ".")[0]
  package = package.removesuffix(".__init__")
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      found.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        prefix = package.rsplit(".", node.level - 1)[0]
        base = f"{prefix}.{base}" if base else prefix
      for alias in node.names:
        full = f"{base}.{alias.name}"
        found.add(_resolve(full) if full.startswith("tfemb") else base)
  return {_resolve(n) if n.startswith("tfemb") else n for n in found}


def all_imports(module: str):
  """Direct imports, followed through tfemb's own modules."""
  seen, todo = set(), [module]
  while todo:
    current = todo.pop()
    for name in direct_imports(current):
      if name in seen:
        continue
      seen.add(name)
      key = name if name in MODULES else name + ".__init__"
      if key in MODULES:
        todo.append(key)
  return {n.removesuffix(".__init__") for n in seen}


def _under(name: str, prefixes) -> bool:
  return any(name == p or name.startswith(p + ".") for p in prefixes)


def _modules_under(prefix: str):
  return sorted(m for m in MODULES if _under(m.removesuffix(".__init__"),
                                             (prefix,)))


def _violations(modules, forbidden):
  return {m: sorted(n for n in all_imports(m) if _under(n, forbidden))
          for m in modules if any(_under(n, forbidden)
                                  for n in all_imports(m))}


def test_the_reader_sees_imports():
  """The rules below cannot pass vacuously: the reader finds imports."""
  assert "tfemb.host.engine" in all_imports("tfemb.mid_level")
  assert "tfemb.resolution" in all_imports("tfemb.host.engine")
  assert "tensorflow" in direct_imports("tfemb.host.engine")
  assert _violations(["tfemb.mid_level"], ("tfemb.tpu",))


@pytest.mark.parametrize("prefix", CONFIGS)
def test_configs_import_no_engine_and_no_keras(prefix):
  assert not _violations(_modules_under(prefix), ENGINES + KERAS)


def test_the_host_engine_never_imports_the_tpu_path_or_the_layer():
  modules = _modules_under("tfemb.host")
  assert modules
  assert not _violations(modules, ("tfemb.tpu", "tfemb.layers",
                                   "tfemb.mid_level", "tfemb.compat") + KERAS)


def test_the_tpu_path_never_imports_the_host_engine():
  modules = _modules_under("tfemb.tpu")
  assert modules
  assert not _violations(modules, ("tfemb.host", "tfemb.mid_level",
                                   "tfemb.kernels", "tfemb.layers"))


def test_compat_wraps_engines_instead_of_subclassing_them():
  """compat.v1 builds configs and wraps the engine it gets: no class there
  derives from an engine class."""
  for module in _modules_under("tfemb.compat"):
    tree = ast.parse(MODULES[module].read_text())
    for node in ast.walk(tree):
      if isinstance(node, ast.ClassDef):
        bases = [ast.unparse(b) for b in node.bases]
        assert not any("TPUEmbedding" in b or "HostEmbedding" in b or
                       "mid_level" in b for b in bases), (module, node.name)


def test_the_engines_reach_serving_only_through_savedmodel():
  """Serving is one package; the engines add to a SavedModel's object
  graph through `tfemb.serving.savedmodel` and use nothing else of it."""
  engines = _modules_under("tfemb.host") + _modules_under("tfemb.sparsecore")
  assert engines
  for module in engines:
    serving = {n for n in direct_imports(module)
               if _under(n, ("tfemb.serving",))}
    assert serving <= {"tfemb.serving.savedmodel"}, (module, serving)
  assert not [n for n in all_imports("tfemb.serving.savedmodel")
              if n.startswith("tfemb")]
  keras_users = [m for m in _modules_under("tfemb.serving")
                 if "tf.keras" in MODULES[m].read_text() or
                 _violations([m], KERAS)]
  assert keras_users == ["tfemb.serving.keras_export"], keras_users
