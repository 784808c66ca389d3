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
"""

from typing import List

import numpy as np
import tensorflow as tf


def _assert(condition, message) -> List[tf.Operation]:
  """One Assert op; eagerly it raises InvalidArgumentError at once."""
  return [tf.raw_ops.Assert(condition=condition, data=[message])]


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
  return _assert(dynamic[0] if len(dynamic) == 1 else
                 tf.reduce_all(dynamic), message)


def id_range(path, ids, vocabulary_size) -> List[tf.Operation]:
  """Every id in `[0, vocabulary_size)`."""
  message = (f"Feature {path!r}: ids must be in [0, {vocabulary_size}) "
             "(the table's vocabulary_size).")
  # As unsigned numbers, negative ids are above any vocabulary size.
  return _assert(
      tf.reduce_all(tf.cast(ids, tf.uint64) < vocabulary_size), message)


def input_structure(path, table_name, x) -> List[tf.Operation]:
  """What TensorFlow's own ops require of a sparse or ragged tensor: every
  SparseTensor index in `[0, dense_shape)`, in each dimension; ragged row
  splits that start at 0, never decrease and end at the number of values.
  Nothing for a dense tensor."""
  where = f"Feature {path!r} (table {table_name!r})"
  if isinstance(x, tf.SparseTensor):
    parts, check = (x.indices, x.dense_shape), _sparse_inside
    static = [tf.get_static_value(p) for p in parts]
    message = (f"{where}: every SparseTensor index must be in [0, "
               "dense_shape) in each dimension (as tf.sparse ops require); "
               "an index outside would be looked up in another example.")
  elif isinstance(x, tf.RaggedTensor):
    parts, check = (x.row_splits, tf.shape(x.values)[0]), _splits_valid
    static = [tf.get_static_value(x.row_splits), x.values.shape[0]]
    message = (f"{where}: the RaggedTensor's row_splits must start at 0, "
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
  return _assert(check(*parts), message)


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


def sparse_order(path, x: tf.SparseTensor) -> List[tf.Operation]:
  """Indices in row-major order with no duplicates (`tf.sparse.reorder`)."""
  strides = tf.math.cumprod(x.dense_shape, exclusive=True, reverse=True)
  linear = tf.reduce_sum(x.indices * strides, axis=1)
  return _assert(
      tf.reduce_all(linear[1:] > linear[:-1]),
      f"Feature {path!r}: the SparseTensor's indices must be sorted in "
      "row-major order with no duplicates; use tf.sparse.reorder (and merge "
      "duplicate entries).")


def weights_match(path, x, w) -> List[tf.Operation]:
  """Weights laid out exactly as the ids (same indices or row splits)."""
  message = (f"Feature {path!r}: weights must have the same shape as the ids "
             "(the same sparse indices or ragged row splits).")
  if isinstance(x, tf.SparseTensor):
    pairs = [(tf.shape(w.indices, tf.int64), tf.shape(x.indices, tf.int64)),
             (w.dense_shape, x.dense_shape)]
  else:
    pairs = [(tf.shape(w.row_splits, tf.int64),
              tf.shape(x.row_splits, tf.int64)),
             (tf.shape(w.values, tf.int64), tf.shape(x.values, tf.int64))]
  return _assert_equal(pairs, message)


def gradient_rows(path, grad, rows) -> List[tf.Operation]:
  """A feature's gradient has one row of `dim` per activation row."""
  grad_rows = grad.shape[0]
  if grad_rows is None:
    grad_rows = tf.shape(grad, out_type=tf.int64)[0]
  return _assert_equal(
      [(grad_rows, tf.cast(rows, tf.int64))],
      f"Feature {path!r}: the gradient must have the shape of its dequeued "
      "activations.")


def all_finite(x) -> tf.Tensor:
  """True iff every element of `x` is finite: x * 0 is 0 for a finite x and
  NaN for NaN or +-Inf, so the sum is NaN exactly when one is not finite
  (a multiply and a sum: cheaper than CheckNumerics or IsFinite + All)."""
  return tf.math.is_finite(tf.reduce_sum(x * 0.0))


def finite_gradients(table_name, grads) -> List[tf.Operation]:
  return _assert(
      all_finite(grads),
      f"Table {table_name!r}: non-finite (NaN or Inf) embedding gradient; no "
      "table was updated.")
