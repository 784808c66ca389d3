"""Lossless conversion of tfemb configs to TensorFlow's own classes.

The TPU path hands TensorFlow's `TPUEmbedding` the same configuration as
`tf.tpu.experimental.embedding` objects. The installed TensorFlow may be
older than the 2.21 API tfemb has (`tfemb.tf_versions`): an argument its
class lacks is dropped only at its default; otherwise the conversion raises
(a `TensorFlowVersionError` naming the feature and the version that has
it) instead of losing it.
"""

from typing import Any

import tensorflow as tf

from tfemb import configs
from tfemb import optimizers
from tfemb import sparsecore_backports
from tfemb import tf_versions

_tf_embedding = tf.tpu.experimental.embedding


def _backported(obj):
  """TensorFlow's class for tfemb's copy of a 2.21 class (an older
  TensorFlow's `CustomOptimizer`, `CustomCombiner` or
  `SparseCoreEmbeddingConfig`); anything else as it is."""
  if not isinstance(obj, sparsecore_backports.CLASSES):
    return obj
  cls = type(obj)
  return tf_versions.construct(
      tf_versions.tensorflow_class(cls.__name__, repr(obj)),
      optimizers.constructor_args(obj), repr(obj), reference=cls)


def _optimizer(opt):
  """TensorFlow's class for a tfemb optimizer; anything else as it is."""
  if not optimizers.is_optimizer(opt):
    return _backported(opt)
  declaration = optimizers.identify(opt)
  if not isinstance(opt, declaration.cls):  # TensorFlow's own
    return opt
  return tf_versions.construct(declaration.tf_class,
                               optimizers.constructor_args(opt), repr(opt),
                               reference=declaration.cls)


def _quantization(config):
  if isinstance(config, configs.QuantizationConfig):
    return _tf_embedding.QuantizationConfig(config.num_buckets, config.lower,
                                            config.upper)
  return config


def _table(table, memo):
  if not isinstance(table, configs.TableConfig):
    return table
  if id(table) not in memo:
    # An unnamed table: its copy is made with a placeholder name and then
    # unnamed, because TensorFlow's constructor warns about a missing name,
    # which tfemb's TableConfig already did once; conversions happen per
    # call (e.g. `serving_embedding_lookup`) and must not repeat it.
    converted = tf_versions.construct(
        _tf_embedding.TableConfig,
        dict(vocabulary_size=table.vocabulary_size,
             dim=table.dim,
             initializer=table.initializer,
             optimizer=_optimizer(table.optimizer),
             combiner=_backported(table.combiner),
             name=table.name if table.name is not None else "",
             quantization_config=_quantization(table.quantization_config),
             layout=table.layout,
             dtype=table.dtype),
        f"Table {table.name!r}", reference=configs.TableConfig)
    converted.name = table.name
    memo[id(table)] = converted
  return memo[id(table)]


def _convert(obj, memo):
  if isinstance(obj, configs.FeatureConfig):
    return _tf_embedding.FeatureConfig(
        table=_table(obj.table, memo),
        max_sequence_length=obj.max_sequence_length,
        validate_weights_and_indices=obj.validate_weights_and_indices,
        output_shape=obj.output_shape,
        name=obj.name)
  if isinstance(obj, configs.TableConfig):
    return _table(obj, memo)
  if isinstance(obj, configs.QuantizationConfig):
    return _quantization(obj)
  return _optimizer(obj)


def to_tensorflow(structure: Any) -> Any:
  """Returns `structure` with every tfemb config or optimizer replaced by the
  equal `tf.tpu.experimental.embedding` object.

  `structure` is a nested structure (`tf.nest`) of `FeatureConfig`s, or one
  `TableConfig`, `FeatureConfig`, `QuantizationConfig`, optimizer or
  `SparseCoreEmbeddingConfig`. Tables shared by several features stay
  shared. TensorFlow objects pass through, `CustomOptimizer`,
  `CustomCombiner`, `RowIdInitializer` and `SparseCoreEmbeddingConfig`
  (TensorFlow's classes, `tfemb.sparsecore_configs`) among them where the
  installed TensorFlow has them with 2.21's arguments.
  """
  memo = {}
  return tf.nest.map_structure(lambda obj: _convert(obj, memo), structure)
