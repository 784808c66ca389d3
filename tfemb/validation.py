"""Checks of inputs and gradients that run with the step (docs/numerics.md,
"Errors").

Each function returns assertion ops whose message names the feature or
table and what was expected; eagerly they raise at once. The engine makes
every table update of a step depend on every check of that step, so a
failing check leaves every table and slot unchanged.

Per feature, `FeatureConfig(validate_weights_and_indices=False)` (TF's own
flag) turns off the id range, sparse index order and weight shape checks
for speed. Then, on TensorFlow's ops, an id >= vocabulary_size still fails
in the CPU gather (with TensorFlow's message, which does not name the
feature) but reads zeros on a GPU, and a negative id or a mismatched weight
is not caught. The fused CPU kernels (`tfemb.kernels`) check the id range
of every training lookup themselves, whatever the flag. The structure of
the input itself (`input_structure`: sparse indices inside the dense
shape, valid ragged row splits) is checked whatever the flag: a tensor
TensorFlow's own ops refuse would otherwise put an id into another
example.

Each check is one `Assert` op on a condition computed with a few cheap ops
(not `tf.debugging.assert_*`, whose graph form wraps the assertion in a
conditional, a function call per check and step), and checks whose answer
the static shapes already give add no op at all.

The Assert op prints its message escaped (a quote as \\'), so the messages
of a step's checks (and of the fused kernels, alike) name features and
tables in backticks (`feature` and `table` below) and hold no quote.
"""

from typing import List

import numpy as np
import tensorflow as tf


def feature(path, table_name=None) -> str:
  """How a check's message names a feature (and its table)."""
  named = f"Feature `{path}`"
  return named if table_name is None else f"{named} (table `{table_name}`)"


def table(name) -> str:
  """How a check's message names a table."""
  return f"Table `{name}`"


def assertion(condition, message) -> List[tf.Operation]:
  """One Assert op; eagerly it raises InvalidArgumentError at once."""
  return [tf.raw_ops.Assert(condition=condition, data=[message])]


def size_as_run(ids):
  """The number of `ids` (integers) as the batch runs: a number where their
  static shape says it (a tensor of that shape holds as many), else a
  tensor. In a tf.function, Grappler's shape inference ties the size of a
  tensor of unknown shape to the shape later ops require of it (the
  reshape of its rows to the activations' static shape), then folds
  `tf.size` to that number, the check to True, and the reshape away: a
  wrong batch would pass unseen. The number of positions where
  `ids == ids` (all of them) is the size of a `tf.where`, which it cannot
  fold."""
  if ids.shape.is_fully_defined():
    return ids.shape.num_elements()
  return tf.shape(tf.where(tf.equal(ids, ids)), tf.int64)[0]


def _assert_equal(pairs, message) -> List[tf.Operation]:
  """Each pair equal: checked now where both are static (a ValueError, as
  `tf.debugging.assert_equal` raises), else by one Assert op."""
  dynamic = []
  for a, b in pairs:
    a_value, b_value = tf.get_static_value(a), tf.get_static_value(b)
    if a_value is None or b_value is None:
      dynamic.append(tf.reduce_all(tf.equal(tf.cast(a, tf.int64),
                                            tf.cast(b, tf.int64))))
    elif not np.array_equal(a_value, b_value):
      raise ValueError(message)
  if not dynamic:
    return []
  return assertion(dynamic[0] if len(dynamic) == 1 else
                 tf.reduce_all(dynamic), message)


def id_range(path, table_name, ids, vocabulary_size) -> List[tf.Operation]:
  """Every id in `[0, vocabulary_size)`."""
  message = (f"{feature(path, table_name)}: ids must be in [0, "
             f"{vocabulary_size}) (the vocabulary_size of the table).")
  # As unsigned numbers, negative ids are above any vocabulary size.
  return assertion(
      tf.reduce_all(tf.cast(ids, tf.uint64) < vocabulary_size), message)


def input_structure(path, table_name, x) -> List[tf.Operation]:
  """What TensorFlow's own ops require of a sparse or ragged tensor: every
  SparseTensor index in `[0, dense_shape)`, in each dimension; ragged row
  splits that start at 0, never decrease and end at the number of values.
  Nothing for a dense tensor."""
  where = feature(path, table_name)
  if isinstance(x, tf.SparseTensor):
    parts, check = (x.indices, x.dense_shape), _sparse_inside
    static = [tf.get_static_value(p) for p in parts]
    message = (f"{where}: every SparseTensor index must be in [0, "
               "dense_shape) in each dimension (as tf.sparse ops require); "
               "an index outside would be looked up in another example.")
  elif isinstance(x, tf.RaggedTensor):
    parts, check = (x.row_splits, tf.shape(x.values)[0]), _splits_valid
    static = [tf.get_static_value(x.row_splits), x.values.shape[0]]
    message = (f"{where}: the row_splits of a RaggedTensor must start at 0, "
               "never decrease and end at the number of values (as "
               "tf.RaggedTensor.from_row_splits(validate=True) requires).")
  else:
    return []
  if not tf.executing_eagerly() and all(v is not None for v in static):
    # Known while tracing (constants): later ops' static shapes may
    # already disagree, and the trace would fail with TensorFlow's message.
    with tf.init_scope():  # eagerly, outside the graph
      valid = bool(check(*[tf.constant(v) for v in static]))
    if not valid:
      raise ValueError(message)
    return []
  return assertion(check(*parts), message)


def _sparse_inside(indices, dense_shape) -> tf.Tensor:
  # As unsigned numbers, negative indices are above any dimension.
  return tf.reduce_all(
      tf.cast(indices, tf.uint64) < tf.cast(dense_shape, tf.uint64))


def _splits_valid(splits, num_values) -> tf.Tensor:
  # Slices, not splits[0] and splits[-1]: empty splits must fail here.
  return tf.reduce_all(tf.stack([
      tf.size(splits) > 0,
      tf.reduce_all(tf.equal(splits[:1], 0)),
      tf.reduce_all(tf.equal(splits[-1:], tf.cast(num_values, splits.dtype))),
      tf.reduce_all(splits[1:] >= splits[:-1])]))


def rows(path, table_name, got, expected: int, what: str
         ) -> List[tf.Operation]:
  """An input of `expected` rows (`got`: its count, a number or a tensor),
  as `what` asks: checked now where static (a ValueError), else by one
  Assert op."""
  message = (f"{feature(path, table_name)}: the input must have {expected} "
             f"rows ({what})")
  static = tf.get_static_value(got)
  if static is None:
    return assertion(tf.equal(tf.cast(got, tf.int64), expected),
                     message + ".")
  if int(static) != expected:
    raise ValueError(f"{message}; got {int(static)}.")
  return []


def sparse_order(path, table_name, x: tf.SparseTensor) -> List[tf.Operation]:
  """Indices in row-major order with no duplicates (`tf.sparse.reorder`)."""
  strides = tf.math.cumprod(x.dense_shape, exclusive=True, reverse=True)
  linear = tf.reduce_sum(x.indices * strides, axis=1)
  return assertion(
      tf.reduce_all(linear[1:] > linear[:-1]),
      f"{feature(path, table_name)}: the indices of a SparseTensor must be "
      "sorted in "
      "row-major order with no duplicates; use tf.sparse.reorder (and merge "
      "duplicate entries).")


def weights_match(path, table_name, x, w) -> List[tf.Operation]:
  """Weights laid out exactly as the ids: the same sparse indices and dense
  shape, or the same ragged row splits (values, not only their shapes)."""
  message = (f"{feature(path, table_name)}: weights must have the same shape "
             "as the ids (the same sparse indices or ragged row splits).")
  if isinstance(x, tf.SparseTensor):
    pairs = [(tf.shape(w.indices, tf.int64), tf.shape(x.indices, tf.int64)),
             (w.dense_shape, x.dense_shape)]
    same = [(w.indices, x.indices)]
  else:
    pairs = [(tf.shape(w.row_splits, tf.int64),
              tf.shape(x.row_splits, tf.int64)),
             (tf.shape(w.values, tf.int64), tf.shape(x.values, tf.int64))]
    same = [(w.row_splits, x.row_splits)]
  checks = _assert_equal(pairs, message)  # also refuses other sizes now
  # The values, compared over the shorter length (no broadcasting error
  # when the sizes differ: the size check above fails then).
  for a, b in same:
    a, b = tf.reshape(tf.cast(a, tf.int64), [-1]), tf.reshape(
        tf.cast(b, tf.int64), [-1])
    n = tf.minimum(tf.size(a), tf.size(b))
    values = [tf.get_static_value(a), tf.get_static_value(b)]
    if all(v is not None for v in values):
      if values[0].shape == values[1].shape and not np.array_equal(*values):
        raise ValueError(message)
      continue
    checks += assertion(tf.reduce_all(tf.equal(a[:n], b[:n])), message)
  return checks


def gradient_rows(path, table_name, grad, rows) -> List[tf.Operation]:
  """A feature's gradient (or its pieces, a list) has one row of `dim` per
  activation row."""
  pieces = grad if isinstance(grad, list) else [grad]
  static = [p.shape[0] for p in pieces]
  if None not in static:
    grad_rows = sum(static)
  else:
    grad_rows = tf.add_n([tf.shape(p, out_type=tf.int64)[0] for p in pieces])
  return _assert_equal(
      [(grad_rows, tf.cast(rows, tf.int64))],
      f"{feature(path, table_name)}: the gradient must have the shape of its "
      "dequeued "
      "activations.")


def all_finite(x) -> tf.Tensor:
  """True iff every element of `x` is finite: x * 0 is 0 for a finite x and
  NaN for NaN or +-Inf, so the sum is NaN exactly when one is not finite
  (a multiply and a sum: cheaper than CheckNumerics or IsFinite + All)."""
  return tf.math.is_finite(tf.reduce_sum(x * 0.0))


def finite_gradients(table_name, grads) -> List[tf.Operation]:
  return assertion(
      all_finite(grads),
      f"{table(table_name)}: non-finite (NaN or Inf) embedding gradient; no "
      "table was updated.")
