"""The SparseCore's tables, on the TPU or the host: built from the
FeatureConfigs' output shapes, stacked, and keyed by the stacked table
names, as tensorflow-recommenders returns them; checkpoints have
TensorFlow's stacked layout. `StackedTables` gives an adapter of either
path these methods (it derives from nothing: each adapter keeps one line
of descent from `EngineAdapter`)."""

import tensorflow as tf
from tensorflow.python.util import nest  # pylint: disable=g-direct-tensorflow-import


def check_output_shapes(features) -> None:
  """Every feature has a fully defined per-replica `output_shape`."""
  for path, feature in nest.flatten_with_joined_string_paths(features):
    shape = feature.output_shape
    if not shape or any(d is None for d in tf.TensorShape(shape).as_list()):
      raise ValueError(
          f"Feature {path!r}: TPUEmbeddingV2 (SparseCore) needs a fully "
          "defined per-replica output_shape in its FeatureConfig at "
          f"construction (e.g. output_shape=[batch_size]), got {shape}.")


class StackedTables:
  """An adapter's tables where its engine is a `TPUEmbeddingV2` (tfemb's
  or TensorFlow's): `self.engine`'s stacked tables and variables."""


  def build(self, input_shape, batch_size):
    del input_shape, batch_size  # Shapes come from the FeatureConfigs.
    self.engine.build()

  def serving_tables(self):
    return self.engine.embedding_tables

  def embedding_tables(self):
    return self.engine.embedding_tables

  def embedding_variables(self):
    return self.engine.variables
