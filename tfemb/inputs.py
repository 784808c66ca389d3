"""From one feature's input tensor to a flat list of lookups.

Every input kind (dense, `tf.SparseTensor`, `tf.RaggedTensor`) becomes a
`Lookup`: for each id kept after sequence truncation, the output row it adds
to (`segments`) and the factor it is added with (`scales`, which folds the
per-id weight and the table's combiner). The forward pass is then
`out[segment] += scale * table[id]`, and the backward pass sends
`scale * d_out[segment]` to row `id`. Shapes follow TensorFlow's
`TPUEmbedding` (`dequeue`) or, with `serving=True`, its
`TPUEmbeddingForServing` (direct lookups); they differ only for dense inputs.
"""

from typing import NamedTuple, Optional, Tuple

import tensorflow as tf

from tfemb import input_dtypes
from tfemb import shapes
from tfemb import validation


class Lookup(NamedTuple):
  """One feature's ids, ready to gather and combine."""
  ids: tf.Tensor  # int64 [n] (else: `to_lookup`'s `global_part`)
  segments: Optional[tf.Tensor]  # int64 [n]; None: id i goes to row i
  scales: Optional[tf.Tensor]  # float32 [n]; None: every scale is 1
  num_segments: tf.Tensor  # int64 scalar: rows of the flat output
  output_shape: tf.Tensor  # int64 [k]: activation shape without dim
  static_shape: tf.TensorShape  # what is known of output_shape statically
  checks: Tuple[tf.Operation, ...] = ()  # input checks the step depends on
  # Checks the activations and every write wait for, but not the lookup:
  # it only reads, beside them (the SparseCore's id limits).
  gate: Tuple[tf.Operation, ...] = ()
  # The cast the ids are still due before they are widened to int64 (a
  # replica's dense ids for the global batch: `to_lookup`'s `global_part`).
  due_cast: Optional[tf.DType] = None


def input_shape_error(path, x, serving=False) -> Optional[str]:
  """TF's rank rules for one input; returns the error message or None.

  Direct (serving) lookups take what TensorFlow's serving class takes:
  dense ids of any shape (a scalar included), one id per entry, and sparse
  ids of rank 1 (all combined into one activation) and above.
  """
  return shape_error(path, tf.TensorShape(x.shape), shapes.kind_of(x),
                     serving)


def shape_error(path, shape: tf.TensorShape, kind: str,
                serving=False) -> Optional[str]:
  """`input_shape_error` for an input of this static shape and kind."""
  if kind == "dense":
    if not serving and shape.rank is not None and shape.rank < 1:
      return (f"Only rank 1 and above dense tensor is supported, find rank "
              f"{shape.rank} dense tensor for input {path}")
    if (not serving and shape.rank is not None and shape.rank > 1 and
        shape[-1] is not None and shape[-1] != 1):
      return ("Rank 2 or above dense tensor should have last dimension as 1 "
              "as the last dimension will always be reduced. Instead got "
              f"dense tensor as shape {shape.as_list()} for input {path}")
  elif kind == "sparse":
    if shape.rank is not None and shape.rank < (1 if serving else 2):
      return (f"Only rank 2 and above sparse tensor is supported, find rank "
              f"{shape.rank} sparse tensor for input {path}")
  elif shape.rank != 2:
    return (f"Only rank 2 ragged tensor is supported, find rank {shape.rank} "
            f"ragged tensor for input {path}")
  return None


def serving_only(shape: tf.TensorShape, kind: str) -> bool:
  """True for an input that the TPU's rules refuse and TensorFlow's serving
  class takes: a scalar id, dense ids whose last dimension is known and not
  1, a rank-1 SparseTensor. The Keras layer off the TPU looks these up with
  the serving class's rules, as tensorflow-recommenders' layer (which looks
  up with that class there) does; any other input keeps the TPU's rules."""
  shape = tf.TensorShape(shape)
  return (shape_error("", shape, kind) is not None and
          shape_error("", shape, kind, serving=True) is None)


def _combiner_scales(weights, segments, num_segments, combiner):
  """Per-id factor: the weight, divided as `mean` or `sqrtn` ask."""
  if combiner == "sum":
    return weights
  if combiner == "mean":
    total = tf.math.unsorted_segment_sum(weights, segments, num_segments)
  else:  # sqrtn
    total = tf.sqrt(
        tf.math.unsorted_segment_sum(weights * weights, segments,
                                     num_segments))
  return tf.math.divide_no_nan(weights, tf.gather(total, segments))


def _positions_in_rows(row_ids, row_starts):
  """Index of each value within its row, for sorted row ids."""
  n = tf.shape(row_ids, out_type=tf.int64)[0]
  return tf.range(n, dtype=tf.int64) - tf.gather(row_starts, row_ids)


def _sequence(ids, row_ids, positions, rows, length, weights):
  """Keeps the first `length` ids of each row, one output slot per id."""
  keep = positions < length
  ids = tf.boolean_mask(ids, keep)
  segments = tf.boolean_mask(row_ids * length + positions, keep)
  scales = None if weights is None else tf.boolean_mask(weights, keep)
  return ids, segments, scales, rows * length


def dense_lookup(x, serving) -> Lookup:
  ids = tf.reshape(x, [-1])
  shape = tf.shape(x, out_type=tf.int64)
  static = x.shape
  if not serving and x.shape.rank != 1:
    shape, static = shape[:-1], static[:-1]
  return Lookup(ids, None, None, tf.size(ids, out_type=tf.int64), shape,
                static)


def sparse_lookup(x, w, feature) -> Lookup:
  combiner = feature.table.combiner
  dense_shape = x.dense_shape
  weights = None if w is None else w.values
  if shapes.is_sequence(feature, x.shape.rank):
    length = tf.constant(feature.max_sequence_length, tf.int64)
    rows = dense_shape[0]
    ids, segments, scales, num = _sequence(x.values, x.indices[:, 0],
                                           x.indices[:, 1], rows, length,
                                           weights)
    return Lookup(ids, segments, scales, num, tf.stack([rows, length]),
                  tf.TensorShape([x.shape[0], feature.max_sequence_length]))
  outer = dense_shape[:-1]
  strides = tf.math.cumprod(outer, exclusive=True, reverse=True)
  segments = tf.reduce_sum(x.indices[:, :-1] * strides, axis=1)
  num = tf.reduce_prod(outer)
  if weights is None:
    weights = tf.ones_like(x.values, dtype=tf.float32)
  scales = _combiner_scales(weights, segments, num, combiner)
  return Lookup(x.values, segments, scales, num, outer, x.shape[:-1])


def ragged_lookup(path, x, w, feature, output_shape) -> Lookup:
  """`output_shape`: the activation shape asked for (unknown: none); more
  elements than rows make each row a sequence."""
  combiner = feature.table.combiner
  rows = x.nrows(out_type=tf.int64)
  row_ids = tf.cast(x.value_rowids(), tf.int64)
  weights = None if w is None else w.values
  batch = x.shape[0]
  length = None
  if output_shape:
    total = output_shape.num_elements()
    if batch is not None and total != batch:
      if total > batch and total % batch == 0:
        length = total // batch
      else:
        raise ValueError(
            f"Feature {path!r}: "  # TensorFlow's message, naming the feature
            "Output shape set in the FeatureConfig should be the factor of "
            "the input data batch size. But instead got output shape "
            f"{output_shape}, input data batch size {batch}")
  elif feature.max_sequence_length > 0:
    length = feature.max_sequence_length
  if length is not None:
    positions = _positions_in_rows(row_ids,
                                   tf.cast(x.row_starts(), tf.int64))
    ids, segments, scales, num = _sequence(x.values, row_ids, positions,
                                           rows, tf.constant(length, tf.int64),
                                           weights)
    return Lookup(ids, segments, scales, num,
                  tf.stack([rows, tf.constant(length, tf.int64)]),
                  tf.TensorShape([batch, length]))
  if weights is None:
    weights = tf.ones_like(x.values, dtype=tf.float32)
  scales = _combiner_scales(weights, row_ids, rows, combiner)
  return Lookup(x.values, row_ids, scales, rows, tf.reshape(rows, [1]),
                tf.TensorShape([batch]))


def as_input(x):
  if isinstance(x, (tf.Tensor, tf.SparseTensor, tf.RaggedTensor)):
    return x
  return tf.convert_to_tensor(x)  # numpy arrays, lists, variables


def structure_checked(path, x, table_name):
  """`(x, checks)`: TensorFlow's own requirements of a sparse or ragged
  input (`validation.input_structure`), and `x` rebuilt so that every op on
  its indices, splits or values waits for them. Whatever
  validate_weights_and_indices says: they decide each id's example."""
  checks = validation.input_structure(path, table_name, x)
  return (_after(checks, x) if checks else x), checks


def _after(checks, x):
  """Sparse or ragged `x` whose indices, splits and values come after
  `checks` (its dense_shape as it was: it carries the static shape)."""
  with tf.control_dependencies(checks):
    if isinstance(x, tf.SparseTensor):
      return tf.SparseTensor(tf.identity(x.indices), tf.identity(x.values),
                             x.dense_shape)
    return tf.RaggedTensor.from_row_splits(
        tf.identity(x.values), tf.identity(x.row_splits), validate=False)


def to_lookup(path, x, w, feature, dtypes: input_dtypes.InputDtypes,
              serving=False, fixed_shape=None, global_part=False) -> Lookup:
  """Validates one feature's input (and weights) and flattens it.

  `dtypes`: what the engine's entry point does with ids and weights of
  other dtypes (cast or refuse, as TensorFlow's engine of its generation).
  `fixed_shape`: the activation shape the TPU protocol has fixed for the
  feature (its FeatureConfig's, `build`'s or the first enqueue's). As on
  a TPU, a ragged feature whose fixed shape has a second dimension (e.g.
  from `build`) is a sequence of that length. `global_part`: a replica's
  part of the global batch's lookup (`tfemb.host.global_batch`), which
  widens every replica's ids to int64 at once, and casts dense ones as
  `dtypes` casts them (`Lookup.due_cast`): here they are left as they are
  (a refusal is still raised here).
  """
  x = as_input(x)
  w = None if w is None else as_input(w)
  kind = shapes.kind_of(x)
  where = validation.feature(path, feature.table.name)
  if w is not None:
    # The messages of TensorFlow's serving class (direct lookups) and of
    # its TPU enqueue (training batches).
    if kind == "dense":
      raise ValueError(
          f"Weight specified for {path}, but input is dense." if serving else
          f"Weight specified for dense input {path}, which is not allowed. "
          "Weight will always be 1 in this case.")
    if shapes.kind_of(w) != kind:
      raise ValueError(
          f"Weight for {path} is of type {type(w)} but it does not match "
          f"type of the input which is {type(x)}." if serving else
          f"Weight for {path} is type {type(w)} which does not match type "
          f"input which is {type(x).__name__}.")
    if feature.max_sequence_length > 0 and (
        serving or kind == "ragged" or shapes.is_sequence(feature, x.shape.rank)):
      raise ValueError(
          f"Weight specified for {path}, but this is a sequence feature.")
    w = dtypes.cast_weights(where, w, kind)
  due_cast = None
  if global_part and kind == "dense":
    due_cast = dtypes.deferred_id_cast(where, x)
  else:
    x = dtypes.cast_ids(where, x, kind)
  error = input_shape_error(path, x, serving)
  if error:
    raise ValueError(error)
  output_shape = feature.output_shape
  if (not output_shape and kind == "ragged" and fixed_shape is not None and
      feature.max_sequence_length == 0 and (fixed_shape.rank or 0) > 1):
    output_shape = fixed_shape
  x, checks = structure_checked(path, x, feature.table.name)
  if feature.validate_weights_and_indices and kind != "dense":
    if kind == "sparse":
      checks += validation.sparse_order(path, feature.table.name, x)
    if w is not None:
      checks += validation.weights_match(path, feature.table.name, x, w)
      with tf.control_dependencies(checks):
        values = tf.identity(w.values)
      w = (tf.SparseTensor(w.indices, values, w.dense_shape)
           if kind == "sparse" else w.with_values(values))
  if kind == "dense":
    if feature.max_sequence_length > 0:
      raise ValueError(
          f"Feature {path} is a sequence feature but a dense tensor "
          "was passed.")
    lookup = dense_lookup(x, serving)
  elif kind == "sparse":
    lookup = sparse_lookup(x, w, feature)
  else:
    lookup = ragged_lookup(path, x, w, feature, output_shape)
  ids = lookup.ids if global_part else tf.cast(lookup.ids, tf.int64)
  if output_shape:
    # The activations are reshaped to it: the input's rows must fill it.
    rows = (validation.size_as_run(lookup.ids) if lookup.segments is None
            else lookup.num_segments)  # a count of values, not of a shape
    checks += validation.rows(path, feature.table.name, rows,
                              output_shape.num_elements(),
                              f"output_shape {output_shape.as_list()}")
    configured = tf.constant(output_shape.as_list(), tf.int64)
    lookup = lookup._replace(output_shape=configured,
                             static_shape=output_shape)
  return lookup._replace(ids=ids, checks=tuple(checks), due_cast=due_cast)
