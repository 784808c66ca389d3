"""Serving: TensorFlow's `TPUEmbeddingForServing` and
`serving_embedding_lookup`, taking tfemb's configs too.

Both are thin. The configs are converted by `tfemb.to_tensorflow` (shared
tables stay shared) and TensorFlow's own class and function do the rest, so
the lookups, the variables and the checkpoints are TensorFlow's: a
checkpoint of `tfemb.TPUEmbedding` or of TensorFlow's TPU engine restores
into `tfemb.TPUEmbeddingForServing` as into TensorFlow's class.

Tables are found by the `TableConfig` objects the user holds:
`embedding_tables[table]` works with the user's tfemb `TableConfig`, and
`serving_embedding_lookup`'s `tables` may be keyed by the user's configs
(tfemb's or TensorFlow's) or be any engine's `embedding_tables`.
"""

from typing import Any, Dict, Optional

import tensorflow as tf
from tensorflow.python.trackable import data_structures  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.util import nest  # pylint: disable=g-direct-tensorflow-import

from tfemb import tf_conversion
from tfemb.host.by_table import ByTableConfig

_tf_embedding = tf.tpu.experimental.embedding


def _table_pairs(feature_config, converted):
  """(the user's TableConfig, its converted one), once per table."""
  pairs = []
  for user, ours in zip(nest.flatten(feature_config), nest.flatten(converted)):
    if not any(user.table is u for u, _ in pairs):
      pairs.append((user.table, ours.table))
  return pairs


class TPUEmbeddingForServing(_tf_embedding.TPUEmbeddingForServing):
  """`tf.tpu.experimental.embedding.TPUEmbeddingForServing`, also with
  tfemb's `FeatureConfig`s and optimizers.

  TensorFlow's class, given the configs converted by `tfemb.to_tensorflow`
  (the user's objects are not changed). `embedding_tables` is keyed by the
  converted `TableConfig`s and also accepts the user's own (and table
  names). As TensorFlow's, it refuses to be created under a `TPUStrategy`.
  """

  def __init__(self,
               feature_config: Any,
               optimizer: Optional[Any],
               experimental_sparsecore_restore_info: Optional[Dict[str,
                                                                   Any]] = None):
    converted, tf_optimizer = tf_conversion.to_tensorflow(
        (feature_config, optimizer))
    pairs = _table_pairs(feature_config, converted)
    super().__init__(converted, tf_optimizer,
                     experimental_sparsecore_restore_info)
    # Not trackable state: the checkpoint holds TensorFlow's object graph.
    self._user_tables = data_structures.NoDependency(
        [user for user, _ in pairs])  # keeps the ids below valid
    self._aliases = data_structures.NoDependency(
        {id(user): ours for user, ours in pairs})

  @property
  def variables(self) -> Dict[str, Dict[str, tf.Variable]]:
    """`{table name: {"parameters": .., slot: ..}}`, as TensorFlow 2.21's
    class has it (older releases lack the property)."""
    self._maybe_build()
    return self._variables

  @property
  def embedding_tables(self) -> Dict[Any, tf.Variable]:
    """The tables, keyed by TensorFlow's `TableConfig`s; the user's
    `TableConfig`s and the tables' names are accepted as keys too."""
    return ByTableConfig(super().embedding_tables, self._aliases)


def serving_embedding_lookup(inputs: Any, weights: Optional[Any],
                             tables: Dict[Any, tf.Variable],
                             feature_config: Any) -> Any:
  """`tf.tpu.experimental.embedding.serving_embedding_lookup`, also with
  tfemb's `FeatureConfig`s.

  Args:
    inputs: a nested structure of Tensors, SparseTensors or RaggedTensors
      whose paths are a subset of `feature_config`'s.
    weights: None, or per-id weights with the structure of `inputs`.
    tables: the tables, keyed by the `TableConfig`s of `feature_config` (the
      user's objects) or by their converted copies: a plain dict, or
      `embedding_tables` of `tfemb.TPUEmbedding`, `TPUEmbeddingV0` or
      either `TPUEmbeddingForServing`.
    feature_config: a nested structure of `FeatureConfig`s, tfemb's or
      TensorFlow's.

  Returns:
    TensorFlow's lookups, with the structure of `inputs`.
  """
  converted = tf_conversion.to_tensorflow(feature_config)
  by_converted = {}
  for user, ours in _table_pairs(feature_config, converted):
    for key in (user, ours):
      if key in tables:
        by_converted[ours] = tables[key]
        break
  # A table missing here raises TensorFlow's KeyError if a feature needs it.
  return _tf_embedding.serving_embedding_lookup(
      inputs, weights, by_converted, _features_of(inputs, converted))


def _features_of(inputs: Any, feature_config: Any) -> Any:
  """`feature_config`'s features at the paths of `inputs`, shaped like
  `inputs`: TensorFlow 2.21 takes a superset of the inputs' paths, older
  releases only the same structure. Paths not in `feature_config` are left
  to TensorFlow's error."""
  features = dict(nest.flatten_with_joined_string_paths(feature_config))
  paths = [path for path, _ in nest.flatten_with_joined_string_paths(inputs)]
  if not set(paths) <= features.keys():
    return feature_config
  return nest.pack_sequence_as(inputs, [features[path] for path in paths])
