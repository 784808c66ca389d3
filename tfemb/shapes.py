"""Activation shapes: every rule TensorFlow's embedding engines apply.

An activation's shape is `output_shape + [dim]`; the functions here give the
`output_shape` part, per feature, from what is known:

* `from_batch_size`: `build(per_replica_batch_size=...)`;
* `from_input_shape`: `build(per_replica_input_shapes=...)` and the TPU
  enqueue's inputs;
* `from_lookup_input`: what a lookup of one input tensor returns (the
  Keras layer's symbolic pass, direct lookups, training batches);

and `fix` / `check_fully_defined` keep the shapes fixed across calls as
TensorFlow's `TPUEmbedding` does (a known dimension never changes). A
feature's own `FeatureConfig.output_shape` always wins.
"""

from typing import Any, List, Optional, Sequence

import tensorflow as tf


def kind_of(x) -> str:
  """"dense", "sparse" or "ragged"."""
  if isinstance(x, tf.SparseTensor):
    return "sparse"
  if isinstance(x, tf.RaggedTensor):
    return "ragged"
  if isinstance(x, (tf.Tensor, tf.Variable)) or hasattr(x, "shape"):
    return "dense"
  raise ValueError(f"unsupported input type {type(x)}")


def is_sequence(feature, rank) -> bool:
  """TF's rule: a sequence lookup needs rank 2 input and no output_shape."""
  return (not feature.output_shape and feature.max_sequence_length > 0 and
          (rank is None or rank == 2))


def from_batch_size(batch_size: int, feature) -> tf.TensorShape:
  """`[batch]`, or `[batch, max_sequence_length]` for a sequence feature."""
  if not feature.output_shape and feature.max_sequence_length > 0:
    return tf.TensorShape([batch_size, feature.max_sequence_length])
  return tf.TensorShape([batch_size])


def from_input_shape(shape: tf.TensorShape, feature) -> tf.TensorShape:
  """TF's `_get_output_shapes_from_input_shapes`: the last dimension is
  reduced, and a rank-2 sequence input of width other than 1 becomes
  `[batch, max_sequence_length]`."""
  shape = tf.TensorShape(shape)
  if shape.rank is None or shape.rank < 1:
    raise ValueError(
        f"Received input tensor of shape {shape}. Rank must be 1 and above")
  if (shape.rank == 2 and shape[-1] != 1 and not feature.output_shape and
      feature.max_sequence_length > 0):
    return tf.TensorShape([shape[0], feature.max_sequence_length])
  return shape if shape.rank == 1 else shape[:-1]


def from_enqueued(x, feature) -> tf.TensorShape:
  """TF's TPU enqueue: the shape an input asks for, before the shape fixed
  by the FeatureConfig or `build` applies (`_get_input_shape_for_*`, then
  `_get_output_shapes_from_input_shapes`)."""
  shape = tf.TensorShape(x.shape)
  if (kind_of(x) != "dense" and shape.rank == 2 and
      not feature.output_shape and feature.max_sequence_length > 0):
    return tf.TensorShape([shape[0], feature.max_sequence_length])
  return shape if shape.rank == 1 else shape[:-1]


def from_lookup_input(shape: tf.TensorShape, kind: str, feature,
                      serving: bool = False) -> tf.TensorShape:
  """The static activation shape of looking up one input of this shape and
  kind. `serving`: a direct lookup (`TPUEmbeddingForServing`'s rules, where
  a dense input keeps its whole shape)."""
  shape = tf.TensorShape(shape)
  if feature.output_shape:
    return tf.TensorShape(feature.output_shape)
  if kind == "dense":
    if serving or shape.rank == 1:
      return shape
    return shape[:-1]
  if kind == "ragged":
    if feature.max_sequence_length > 0:
      return tf.TensorShape([shape[0], feature.max_sequence_length])
    return shape[:1]
  if is_sequence(feature, shape.rank):
    return tf.TensorShape([shape[0], feature.max_sequence_length])
  return shape[:-1]


def of_input(x, feature, serving: bool = False) -> tf.TensorShape:
  """`from_lookup_input` for an input tensor."""
  return from_lookup_input(tf.TensorShape(x.shape), kind_of(x), feature,
                           serving)


def fix(paths: Sequence[str], fixed: Sequence[tf.TensorShape],
        incoming: Sequence[Optional[tf.TensorShape]]) -> List[tf.TensorShape]:
  """The shapes after a call with `incoming`: TF's rule that a known
  dimension may not change between calls; unknown ones are filled in."""
  result = []
  for path, old, new in zip(paths, fixed, incoming):
    if new is not None and old and new and not (len(new) in (1, 2) and
                                                len(old) > len(new)):
      if len(old) != len(new) or any(
          a is not None and b is not None and a != b
          for a, b in zip(old.as_list(), new.as_list())):
        raise ValueError(
            f"Inconsistent shape founded for input feature {path}, "
            f"Output shape is set to be {old}, "
            f"But got incoming output shape {new}")
    result.append(old if old or new is None else new)
  return result


def check_fully_defined(paths: Sequence[str], fixed: Sequence[Any],
                        known_rank_only: bool = False) -> None:
  """TF's TPU rule: every feature's activation shape fully known."""
  for path, shape in zip(paths, fixed):
    shape = tf.TensorShape(shape)
    if known_rank_only and shape.rank is None:
      continue
    if not shape.is_fully_defined():
      raise ValueError(
          f"Input Feature {path} has output shape set as {shape} which is "
          "not fully defined. Please specify the fully defined shape in "
          "either FeatureConfig or for the build method (e.g. batch with "
          "drop_remainder=True), as a TPU requires.")
