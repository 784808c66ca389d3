"""tests/reference.py is the only source of expected numbers: no test module
works a formula out inline.

The rule, checked on the source (ast) of every module under tests/ but
tests/reference.py. A statement computes an expectation inline when it

1. calls one of numpy's functions the formulas of docs/numerics.md are
   written with (`np.sqrt`, `np.power`, ...; `FORMULA_FUNCTIONS`), anywhere
   in the module; or
2. assigns to an expectation (a name starting with `expect` or `want`, or
   an element or attribute of one) a value computed with a product, a
   quotient, a power or a matrix product (`*`, `/`, `//`, `**`, `@`), as a
   learning rate times a gradient, a combiner's division or a square is; or
3. updates an expectation in place (`want[i] -= ...`, `expected += ...`).

What rule 2 leaves alone: sums and differences alone (a fill value plus a
slot's initial value, row ids plus an offset), arithmetic inside an index
or a slice (`expected[r, c:c + 1]`), and `/` with a string (a path). An
expectation that needs more is a function of tests/reference.py, which
follows the docs' formulas.
"""

import ast
import pathlib
import re

TESTS = pathlib.Path(__file__).resolve().parent
REFERENCE = TESTS / "reference.py"

FORMULA_FUNCTIONS = frozenset({
    "sqrt", "power", "float_power", "exp", "log", "square", "reciprocal"})
EXPECTATION = re.compile(r"^_?(expect|want)", re.IGNORECASE)
PRODUCTS = (ast.Mult, ast.Div, ast.FloorDiv, ast.Pow, ast.MatMult)


def _names(target):
  """The names an assignment target writes to (`want[i]` writes `want`)."""
  if isinstance(target, ast.Name):
    return [target.id]
  if isinstance(target, (ast.Subscript, ast.Attribute, ast.Starred)):
    return _names(target.value)
  if isinstance(target, (ast.Tuple, ast.List)):
    return [n for e in target.elts for n in _names(e)]
  return []


def _is_text(node):
  return isinstance(node, ast.JoinedStr) or (
      isinstance(node, ast.Constant) and isinstance(node.value, str))


def _has_product(node):
  """Rule 2's arithmetic in `node`, outside indices and lambdas."""
  if isinstance(node, ast.Subscript):
    return _has_product(node.value)
  if isinstance(node, ast.Lambda):
    return False
  if (isinstance(node, ast.BinOp) and isinstance(node.op, PRODUCTS) and
      not (isinstance(node.op, ast.Div) and
           (_is_text(node.left) or _is_text(node.right)))):
    return True
  return any(_has_product(c) for c in ast.iter_child_nodes(node))


def inline_expectations(source):
  """[(line, why)]: each statement of `source` the rule flags."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and node.func.attr in FORMULA_FUNCTIONS
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in ("np", "numpy")):
      found.append((node.lineno, f"calls np.{node.func.attr}"))
    if not isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
      continue
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    if not any(EXPECTATION.match(n) for t in targets for n in _names(t)):
      continue
    if isinstance(node, ast.AugAssign):
      found.append((node.lineno, "updates an expectation in place"))
    elif node.value is not None and _has_product(node.value):
      found.append((node.lineno, "computes an expectation with * / ** @"))
  return found


def test_no_test_module_computes_an_expectation_inline():
  flagged = [f"{path.relative_to(TESTS)}:{line}: {why}"
             for path in sorted(TESTS.rglob("*.py")) if path != REFERENCE
             for line, why in inline_expectations(path.read_text())]
  assert not flagged, (
      "expected numbers come from tests/reference.py (a documented numpy "
      "function of docs/numerics.md's formulas):\n" + "\n".join(flagged))


def test_the_rule_flags_an_inline_custom_optimizer():
  """The row-norm CustomOptimizer's expectation as it was written inline."""
  planted = """
for i, g in _summed(ids, coef).items():
  r = int(layout.stacked_rows_numpy(stacking, "t", np.array([i]))[0])
  seen[r] += (g * g).sum()
  w[i] -= 0.1 * g / np.sqrt(seen[r])
"""
  assert inline_expectations(planted) == [(5, "calls np.sqrt")]


def test_the_rule_flags_inline_sgd_steps():
  planted = """
want = init - 0.5 * grad
expected = init.copy()
expected[1] -= 0.5
wanted: float = lr * 2
want_loss = np.mean((labels - pred) ** 2)
"""
  assert [line for line, _ in inline_expectations(planted)] == [2, 4, 5, 6]


def test_the_rule_leaves_what_is_no_formula():
  kept = """
want = reference.Table(init, "sgd", {})
want.apply(reference.row_gradients(zip(ids, coef)), 0.5)
expected = value + (0.0 if name == "parameters" else 0.5)
expected[r, c] = scatter(expected[r, c:c + 1], [d])[0]
expected = np.load(tmp_path / "single" / "final.npz")
rows = table * 0.5  # not an expectation's name
"""
  assert not inline_expectations(kept)
