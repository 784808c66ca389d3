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
3. updates an expectation in place (`want[i] -= ...`, `expected += ...`); or
4. writes a descent step, whatever the name: `x = x - <product>` or
   `x -= <product>` (`w = w - lr * g`, `w[i] -= lr * g`); or
5. averages, sums or accumulates squares in numpy: `np.mean(x ** 2)`,
   `(g * g).sum()`, `acc += g * g`, `acc = acc + g ** 2` (a loss, an
   Adagrad accumulator, a combiner's norm).

What the rules leave alone: sums and differences alone (a fill value plus a
slot's initial value, row ids plus an offset), arithmetic inside an index
or a slice (`expected[r, c:c + 1]`), `/` with a string (a path), a count
that grows by a product (`size += rows * 4`), and TensorFlow's reductions
(`tf.reduce_sum(a * a)`: a model's loss, which the code under test
differentiates). An expectation that needs more is a function of
tests/reference.py, which follows the docs' formulas.
"""

import ast
import pathlib
import re

TESTS = pathlib.Path(__file__).resolve().parent
REFERENCE = TESTS / "reference.py"

FORMULA_FUNCTIONS = frozenset({
    "sqrt", "power", "float_power", "exp", "log", "square", "reciprocal"})
# numpy's reductions, as functions (`np.mean(x)`) or methods (`x.mean()`).
REDUCTIONS = frozenset({"mean", "sum", "average", "nanmean", "nansum"})
NUMPY = ("np", "numpy")
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


def _is_square(node):
  """`x ** 2`, `x * x` (the same expression twice) or `np.square(x)`."""
  if isinstance(node, ast.BinOp):
    if isinstance(node.op, ast.Pow):
      return isinstance(node.right, ast.Constant) and node.right.value == 2
    return (isinstance(node.op, ast.Mult) and
            ast.dump(node.left) == ast.dump(node.right))
  return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and node.func.attr == "square")


def _has_square(node):
  """A square in `node`, outside indices and lambdas."""
  if isinstance(node, ast.Subscript):
    return _has_square(node.value)
  if isinstance(node, ast.Lambda):
    return False
  return _is_square(node) or any(
      _has_square(c) for c in ast.iter_child_nodes(node))


def _is_numpy(node):
  return isinstance(node, ast.Name) and node.id in NUMPY


def _reduced(node):
  """What a numpy reduction call reduces (`np.mean(x)`, `x.mean()`), or
  []: TensorFlow's (`tf.reduce_mean`) are no numpy reduction."""
  if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and node.func.attr in REDUCTIONS):
    return []
  if _is_numpy(node.func.value):
    return node.args[:1]
  return [node.func.value]


def _same_target(target, operand):
  """`operand` is the expression `target` assigns to (`w` and `w`, `w[i]`
  and `w[i]`; the one stores, the other loads)."""
  return ast.unparse(target) == ast.unparse(operand)


def _step(node):
  """Rules 4 and 5 on an assignment: why it writes an update inline, or
  None."""
  if isinstance(node, ast.AugAssign):
    if isinstance(node.op, ast.Sub) and _has_product(node.value):
      return "writes a descent step (x -= ...)"
    if isinstance(node.op, ast.Add) and _has_square(node.value):
      return "accumulates squares (x += ...)"
    return None
  if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.BinOp)):
    return None
  value = node.value
  for target in node.targets:
    if (isinstance(value.op, ast.Sub) and _same_target(target, value.left)
        and _has_product(value.right)):
      return "writes a descent step (x = x - ...)"
    if isinstance(value.op, ast.Add) and any(
        _same_target(target, mine) and _has_square(other)
        for mine, other in ((value.left, value.right),
                            (value.right, value.left))):
      return "accumulates squares (x = x + ...)"
  return None


def inline_expectations(source):
  """[(line, why)], by line: each statement of `source` the rule flags."""
  found = set()
  for node in ast.walk(ast.parse(source)):
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and node.func.attr in FORMULA_FUNCTIONS
        and _is_numpy(node.func.value)):
      found.add((node.lineno, f"calls np.{node.func.attr}"))
    if any(_has_square(r) for r in _reduced(node)):
      found.add((node.lineno, f"takes the {node.func.attr} of squares"))
    if not isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
      continue
    why = _step(node)
    if why:
      found.add((node.lineno, why))
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    if not any(EXPECTATION.match(n) for t in targets for n in _names(t)):
      continue
    if isinstance(node, ast.AugAssign):
      found.add((node.lineno, "updates an expectation in place"))
    elif node.value is not None and _has_product(node.value):
      found.add((node.lineno, "computes an expectation with * / ** @"))
  return sorted(found)


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
  assert inline_expectations(planted) == [
      (4, "accumulates squares (x += ...)"),
      (4, "takes the sum of squares"),
      (5, "calls np.sqrt"),
      (5, "writes a descent step (x -= ...)")]


def test_the_rule_flags_inline_sgd_steps():
  planted = """
want = init - 0.5 * grad
expected = init.copy()
expected[1] -= 0.5
wanted: float = lr * 2
want_loss = np.mean((labels - pred) ** 2)
w = w - lr * g
table[i] = table[i] - lr * grads[i]
small[1] -= 0.1 * 3
cw = cw - 0.1 * weight_grads
"""
  assert sorted({line for line, _ in inline_expectations(planted)}) == [
      2, 4, 5, 6, 7, 8, 9, 10]


def test_the_rule_flags_inline_means_and_sums_of_squares():
  planted = """
loss = np.mean(x ** 2)
loss = (x * x).mean()
norm = np.sum(np.asarray(w) ** 2)
norm = (w ** 2).sum()
mse = numpy.average((y - p) * (y - p))
acc += g * g
acc = acc + g ** 2
acc = g ** 2 + acc
"""
  assert sorted({line for line, _ in inline_expectations(planted)}) == [
      2, 3, 4, 5, 6, 7, 8, 9]


def test_the_rule_leaves_what_is_no_formula():
  kept = """
want = reference.Table(init, "sgd", {})
want.apply(reference.row_gradients(zip(ids, coef)), 0.5)
expected = value + (0.0 if name == "parameters" else 0.5)
expected[r, c] = scatter(expected[r, c:c + 1], [d])[0]
expected = np.load(tmp_path / "single" / "final.npz")
rows = table * 0.5  # not an expectation's name
built[stacked] += int(np.prod(v.shape)) * 4
offset = offset + 2 * n
w = init - lr * g
left -= 1
loss = tf.reduce_sum(a * a)
loss = tf.reduce_mean((pred - y) ** 2)
total = np.sum(a * b)
x = table[i * 2 - 1]
"""
  assert not inline_expectations(kept)
