"""`EmbeddingConfigSpec`: TPUEstimator's embedding configuration, for tfemb.

Same arguments, defaults and validation as TensorFlow 2.15's
`tf.compat.v1.estimator.tpu.experimental.EmbeddingConfigSpec`; its methods
build what a TF2 training loop needs: tfemb `FeatureConfig`s, the optimizer,
the `tfemb.TPUEmbedding`, and the split of an input dict into ids and
weights (what TPUEstimator did with `weight_key`).

Fields without a host equivalent are handled as follows (never silently):
`clipping_limit` (TPUEstimator stored it but never used it): ignored, with a
warning; `profile_data_directory` and `hot_id_replication` (TPU speed-ups):
ignored, with a warning; `partition_strategy="mod"`: only TPUEstimator's
checkpoint layout depends on it, a warning points at `python -m
tfemb.migrate --partition-strategy mod`; TensorCore columns: an error.
"""

import collections
from typing import Any, Dict, Optional, Tuple

from absl import logging
from tensorflow.python.feature_column import feature_column as core_fc
from tensorflow.python.feature_column import feature_column_lib as core_fc_lib

from tfemb import mid_level
from tfemb.compat.v1 import config_conversion
from tfemb.compat.v1 import dict_configs
from tfemb.compat.v1 import feature_columns as columns_lib
from tfemb.compat.v1 import gradient_multiplier
from tfemb.compat.v1 import input_split
from tfemb.compat.v1 import optimization_parameters as params_lib
from tfemb.compat.v1 import optimizer_conversion

# What TPUEstimator's spec accepted (it could not tell CPU from TPU runs).
# pylint: disable=protected-access
_SUPPORTED_COLUMNS = (
    core_fc._NumericColumn, core_fc_lib.NumericColumn,
    core_fc._EmbeddingColumn, core_fc_lib.EmbeddingColumn,
    core_fc._SharedEmbeddingColumn) + columns_lib.TPU_EMBEDDING_COLUMNS
# pylint: enable=protected-access


class EmbeddingConfigSpec(
    collections.namedtuple("EmbeddingConfigSpec", [
        "feature_columns", "tensor_core_feature_columns",
        "optimization_parameters", "clipping_limit",
        "pipeline_execution_with_tensor_core",
        "experimental_gradient_multiplier_fn", "feature_to_config_dict",
        "table_to_config_dict", "partition_strategy", "profile_data_directory"
    ])):
  """TPUEstimator's `EmbeddingConfigSpec`, convertible to tfemb.

  Give either `feature_columns` (from `tf.compat.v1.tpu.experimental.
  embedding_column` / `shared_embedding_columns`) or both
  `feature_to_config_dict` and `table_to_config_dict` (of
  `tfemb.compat.v1.FeatureConfig` / `TableConfig`).

  ```python
  spec = tfemb.compat.v1.EmbeddingConfigSpec(
      feature_columns=columns,
      optimization_parameters=(
          tfemb.compat.v1.StochasticGradientDescentParameters(0.1)))
  embedding = spec.create_embedding()
  ids, weights, dense = spec.split_features(features)
  embedding.enqueue(ids, weights, training=True)
  ```
  """

  def __new__(cls,
              feature_columns=None,
              optimization_parameters=None,
              clipping_limit=None,
              pipeline_execution_with_tensor_core=False,
              experimental_gradient_multiplier_fn=None,
              feature_to_config_dict=None,
              table_to_config_dict=None,
              partition_strategy="div",
              profile_data_directory=None):
    if (not feature_columns and
        not (feature_to_config_dict and table_to_config_dict) or
        (feature_columns and
         (feature_to_config_dict and table_to_config_dict))):
      raise ValueError("Exactly one of `feature_columns` and the pair "
                       "`feature_to_config_dict` and `table_to_config_dict` "
                       "must be be specified.")
    if partition_strategy not in ("div", "mod"):
      raise ValueError("Invalid partition_strategy {}. Must be one of \"mod\" "
                       "or \"div\".".format(partition_strategy))
    tensor_core_columns = None
    embedding_core_columns = None
    if feature_columns:
      tensor_core_columns, embedding_core_columns = [], []
      for column in feature_columns:
        if columns_lib.is_tensor_core_column(column):
          tensor_core_columns.append(column)
        else:
          embedding_core_columns.append(column)
        if not isinstance(column, _SUPPORTED_COLUMNS):
          raise TypeError(
              "All feature columns must be supported types in {}. Got {}"
              .format([t.__name__ for t in _SUPPORTED_COLUMNS],
                      type(column)))
      if not isinstance(optimization_parameters, params_lib.SUPPORTED):
        raise ValueError(
            "optimization_parameters must be an instance of type {}. Got {}."
            .format([t.__name__ for t in params_lib.SUPPORTED],
                    type(optimization_parameters)))
    else:
      for feature, config in feature_to_config_dict.items():
        if not isinstance(config, dict_configs.FeatureConfig):
          raise TypeError(
              "Config for feature {} must be of type `FeatureConfig`. Got {}"
              .format(feature, type(config)))
        if config.table_id not in table_to_config_dict:
          raise ValueError("Feature {} refers to table {} which is not in the "
                           "table_to_config_dict.".format(
                               feature, config.table_id))
      for table, config in table_to_config_dict.items():
        if not isinstance(config, dict_configs.TableConfig):
          raise TypeError(
              "Config for table {} must be of type `TableConfig`. Got "
              "{}".format(table, type(config)))
    return super().__new__(
        cls,
        feature_columns=embedding_core_columns,
        tensor_core_feature_columns=tensor_core_columns,
        optimization_parameters=optimization_parameters,
        clipping_limit=clipping_limit,
        pipeline_execution_with_tensor_core=pipeline_execution_with_tensor_core,
        experimental_gradient_multiplier_fn=experimental_gradient_multiplier_fn,
        feature_to_config_dict=feature_to_config_dict,
        table_to_config_dict=table_to_config_dict,
        partition_strategy=partition_strategy,
        profile_data_directory=profile_data_directory)

  # --- conversion -----------------------------------------------------------

  def table_and_feature_dicts(self) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """`(table_to_config_dict, feature_to_config_dict)`, as TPUEstimator
    built them (from the feature columns if those were given)."""
    if self.tensor_core_feature_columns:
      names = [c.name for c in self.tensor_core_feature_columns]
      raise ValueError(
          f"Feature columns {names} use embedding_lookup_device="
          "'tpu_tensor_core': TPUEstimator trained them as dense variables "
          "with the model's optimizer, outside the TPU embedding engine. "
          "tfemb has no equivalent; use a Keras Embedding layer for them.")
    if self.feature_columns:
      return columns_lib.configs_from_feature_columns(self.feature_columns)
    return dict(self.table_to_config_dict), dict(self.feature_to_config_dict)

  def _warn_ignored_fields(self):
    if self.clipping_limit is not None:
      logging.warning(
          "EmbeddingConfigSpec.clipping_limit=%r is ignored, as TPUEstimator "
          "ignored it. Clip gradients with clip_gradient_min/max of the "
          "optimization parameters.", self.clipping_limit)
    if self.profile_data_directory:
      logging.warning(
          "EmbeddingConfigSpec.profile_data_directory only tuned the TPU's "
          "table partitioning; it has no effect in tfemb.")
    if self.partition_strategy == "mod":
      logging.warning(
          "partition_strategy='mod' changes no numbers; it only permuted the "
          "rows of TPUEstimator's checkpoints. Convert them with `python -m "
          "tfemb.migrate --partition-strategy mod`.")

  def feature_config(self, global_step: Optional[Any] = None):
    """`{feature name: tfemb.FeatureConfig}`; tables named as TPUEstimator
    named them (`tbl_<variable>` for feature columns).

    Args:
      global_step: a variable the training loop increments; needed when a
        table or column has a `learning_rate_fn` (called with it each step).
    """
    self._warn_ignored_fields()
    tables, features = self.table_and_feature_dicts()
    return config_conversion.to_feature_config(
        tables, features, self.optimization_parameters, global_step)

  def optimizer(self):
    """The tfemb optimizer for `optimization_parameters` (or None)."""
    if self.optimization_parameters is None:
      return None
    return optimizer_conversion.to_optimizer(self.optimization_parameters)

  def create_embedding(self, global_step: Optional[Any] = None):
    """A `tfemb.TPUEmbedding` for this spec.

    With `experimental_gradient_multiplier_fn`, its `apply_gradients`
    multiplies the gradients by `experimental_gradient_multiplier_fn(
    global_step)` first, as TPUEstimator did; `global_step` is then needed.
    """
    feature_config = self.feature_config(global_step)
    fn = self.experimental_gradient_multiplier_fn
    if fn is not None and global_step is None:
      raise ValueError(
          "experimental_gradient_multiplier_fn is called with the global "
          "step: pass global_step (a tf.Variable your training loop "
          "increments) to create_embedding.")
    embedding = mid_level.TPUEmbedding(feature_config, self.optimizer(),
                                       self.pipeline_execution_with_tensor_core)
    if fn is None:
      return embedding
    return gradient_multiplier.scale_gradients(embedding, fn, global_step)

  def split_features(self, features: Dict[str, Any]):
    """Splits an input dict as TPUEstimator did: `(ids, weights, rest)`.

    See `tfemb.compat.v1.input_split.split_features`.
    """
    _, feature_configs = self.table_and_feature_dicts()
    return input_split.split_features(features, feature_configs)
