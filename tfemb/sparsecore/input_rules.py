"""TensorFlow 2.21's `TPUEmbeddingV2` input rules, before the host engine.

`TPUEmbeddingV2` (its `_convert_input_feature_to_coo`) takes per feature a
`tf.Tensor`, `tf.SparseTensor` or `tf.RaggedTensor`, with weights of the
same kind or None, and reads a dense tensor as one id per sample: any shape
whose size is the product of the feature's `output_shape`, each id with its
own weight (the first generation refuses dense weights). Each input is
brought here to what the host engine takes for it (docs/sparsecore.md).
"""

from typing import Any, Optional, Tuple

import tensorflow as tf

from tfemb import input_dtypes
from tfemb import validation

_KINDS = ((tf.SparseTensor, "SparseTensor"), (tf.RaggedTensor, "RaggedTensor"),
          (tf.Tensor, "Tensor"))


def _kind(x) -> Optional[str]:
  return next((name for cls, name in _KINDS if isinstance(x, cls)), None)


def _as_samples(x: tf.Tensor, size: int, sample_count: int) -> tf.Tensor:
  """`x` (`size` values) traced as `sample_count` values, for a graph that
  fails its size check before it uses them."""
  padded = tf.pad(x, [[0, max(0, sample_count - size)]])
  return tf.slice(padded, [0], [sample_count])


def _dense(path: str, x: tf.Tensor, w: Optional[tf.Tensor],
           sample_count: Optional[int]) -> Tuple[Any, Any]:
  """One id per sample: [sample_count] ids, or with weights a
  [sample_count, 1] SparseTensor of ids and one of weights (None: any
  number of samples)."""
  ids = tf.reshape(x, [-1])
  size = ids.shape[0]
  message = (f"{validation.feature(path)}: Dense tensor input should have "
             "values elements number the same as the sample count. But got "
             "{} elements for values and " + f"{sample_count} samples "
             "(the size of output_shape).")
  if sample_count is None:
    pass
  elif size is not None and size != sample_count and tf.executing_eagerly():
    raise ValueError(message.format(size))
  elif size is None or size != sample_count:
    # In a function TensorFlow checks when the batch runs, as its
    # preprocessing op does: Keras' symbolic build traces placeholders of
    # another size (sparse inputs made dense) that never run.
    check = validation.assertion(
        tf.equal(validation.size_as_run(ids), sample_count),
        message.format("another number of" if size is None else size))
    with tf.control_dependencies(check):
      ids = tf.identity(ids)
    if size is not None:  # of another size: the check fails if it runs
      ids = _as_samples(ids, size, sample_count)
  if w is None:
    return ids, None
  weights = tf.reshape(w, [-1])
  if size is not None and sample_count is not None and size != sample_count:
    weights = _as_samples(weights, size, sample_count)
    size = sample_count
  if weights.shape[0] is not None and size is not None and (
      weights.shape[0] != size):
    raise ValueError(
        f"Feature {path!r}: Values and weights should have same elements. "
        f"But got {size} elements for values and {weights.shape[0]} "
        "elements for weights.")
  rows = tf.range(tf.size(ids, out_type=tf.int64))
  indices = tf.stack([rows, tf.zeros_like(rows)], axis=1)
  dense_shape = tf.stack([tf.size(ids, out_type=tf.int64),
                          tf.constant(1, tf.int64)])
  return (tf.SparseTensor(indices, ids, dense_shape),
          tf.SparseTensor(indices, weights, dense_shape))


def prepare(path: str, feature: Any, x: Any, w: Any,
            any_batch: bool = False, cast_ids: bool = True) -> Tuple[Any, Any]:
  """`(ids, weights)` of one feature as the host engine takes them.
  `any_batch`: a dense input may hold any number of samples (a serving
  export's batch), not only `output_shape`'s. `cast_ids=False`: dense ids
  are left for `inputs.to_lookup` to cast (a replica's part of the global
  batch, cast once for every replica's: its `global_part`); ids no cast
  takes are refused here all the same.

  Casts the ids to int32 and the weights to float32, as TensorFlow does
  (`tfemb.input_dtypes.V2`). Raises TensorFlow's `TPUEmbeddingV2` errors,
  naming the feature: an input that is not a Tensor, SparseTensor or
  RaggedTensor (numpy arrays and lists included, as on a TPU), weights of
  another kind than the ids, string ids or weights (which no cast takes),
  or a dense input whose size is not the product of `output_shape`.
  """
  kind = _kind(x)
  if kind is None:
    raise ValueError(
        f"Feature {path!r}: Input of unknown type {type(x)}. Please only pass "
        "Tensor, SparseTensor or RaggedTensor as input to embedding lookup.")
  if w is not None and _kind(w) != kind:
    raise ValueError(f"Feature {path!r}: Expect weight to be {kind} type but "
                     f"got {type(w)}")
  # int32 ids, float32 weights, as TensorFlow casts them for the SparseCore.
  where = validation.feature(path, feature.table.name)
  if cast_ids or kind != "Tensor" or w is not None:
    x = input_dtypes.V2.cast_ids(where, x, kind.lower())
  else:
    input_dtypes.V2.deferred_id_cast(where, x)
  if w is not None:
    w = input_dtypes.V2.cast_weights(where, w, kind.lower())
  if kind != "Tensor":
    return x, w
  samples = (None if any_batch else
             tf.TensorShape(feature.output_shape).num_elements())
  return _dense(path, x, w, samples)
