"""Lossless conversion of tfemb configs to TensorFlow's own classes.

The TPU path hands TensorFlow's `TPUEmbedding` the same configuration as
`tf.tpu.experimental.embedding` objects. A field TensorFlow's class cannot
take raises instead of being dropped.
"""

import inspect
from typing import Any, Dict

import tensorflow as tf

from tfemb import configs
from tfemb import optimizers

_tf_embedding = tf.tpu.experimental.embedding


def _call_with(cls, kwargs: Dict[str, Any], what: str):
  """Calls `cls(**kwargs)`, refusing to drop a non-default argument."""
  accepted = inspect.signature(cls.__init__).parameters
  for name, value in kwargs.items():
    if name not in accepted and value not in (None, False):
      raise ValueError(
          f"{what}: this TensorFlow's {cls.__name__} has no argument "
          f"{name!r} (value {value!r}); it cannot be converted losslessly.")
  return cls(**{k: v for k, v in kwargs.items() if k in accepted})


def _optimizer(opt):
  """TensorFlow's class for a tfemb optimizer; anything else as it is."""
  if not optimizers.is_optimizer(opt):
    return opt
  declaration = optimizers.identify(opt)
  if not isinstance(opt, declaration.cls):  # TensorFlow's own
    return opt
  return _call_with(declaration.tf_class, opt._constructor_args(), repr(opt))  # pylint: disable=protected-access


def _quantization(config):
  if isinstance(config, configs.QuantizationConfig):
    return _tf_embedding.QuantizationConfig(config.num_buckets, config.lower,
                                            config.upper)
  return config


def _table(table, memo):
  if not isinstance(table, configs.TableConfig):
    return table
  if id(table) not in memo:
    memo[id(table)] = _tf_embedding.TableConfig(
        vocabulary_size=table.vocabulary_size,
        dim=table.dim,
        initializer=table.initializer,
        optimizer=_optimizer(table.optimizer),
        combiner=table.combiner,
        name=table.name,
        quantization_config=_quantization(table.quantization_config),
        layout=table.layout,
        dtype=table.dtype)
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
  `TableConfig`, `FeatureConfig`, `QuantizationConfig` or optimizer. Tables
  shared by several features stay shared. TensorFlow objects pass through,
  `CustomOptimizer`, `CustomCombiner` and `RowIdInitializer` (TensorFlow's
  classes, `tfemb.sparsecore_configs`) among them.
  """
  memo = {}
  return tf.nest.map_structure(lambda obj: _convert(obj, memo), structure)
