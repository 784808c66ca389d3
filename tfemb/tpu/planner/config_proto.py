"""The `TPUEmbeddingConfiguration` proto TensorFlow's `TPUEmbedding` sends.

`resolve` does what `TPUEmbedding.__init__` (TF 2.21, embedding hardware V1)
does to the configs under a `TPUStrategy` (`tfemb.resolution`: tables in
order of first use, unnamed tables named `table_<i>`, the global optimizer
for tables without one), with dynamic learning rates numbered in table
order; it changes none of the user's objects. `output_shapes` follows
`build` with a per-replica batch size (`tfemb.shapes`), and `config_proto`
mirrors `_create_config_proto`, `TableConfig._set_table_descriptor` and the
optimizers' `_set_optimization_parameters`.

One deliberate difference: TensorFlow assigns the optimizer's boolean
`low_dimensional_packing_status` to an enum field, which protobuf 7 (the
one TF 2.21 installs) refuses ("Expected an int, got a boolean"); the
protobuf 4 to 6 of older TensorFlow releases store it as 1 or 0. Here the
enum is set as TensorFlow meant it, with every protobuf: `ENABLED` (1) for
True, `UNSPECIFIED` (0) for False.
"""

from typing import Any, Callable, List, NamedTuple, Optional, Sequence

import tensorflow as tf
from tensorflow.core.protobuf.tpu import optimization_parameters_pb2
from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2
from tensorflow.python.util import nest  # pylint: disable=g-direct-tensorflow-import

from tfemb import optimizers
from tfemb import resolution
from tfemb import shapes as shapes_lib
from tfemb import tf_conversion

_Config = tpu_embedding_configuration_pb2.TPUEmbeddingConfiguration
_Accumulation = optimization_parameters_pb2.GradientAccumulationStatus
_Packing = optimization_parameters_pb2.LowDimensionalPackingStatus


class TensorFlowView(NamedTuple):
  """The configs as TensorFlow's `TPUEmbedding` sees them after `__init__`.

  `tables`, `table_names` and `optimizers` are parallel, in TensorFlow's table
  order; `features` and `paths` parallel, in `tf.nest` order.
  """
  paths: List[str]
  features: List[Any]  # tf.tpu.experimental.embedding.FeatureConfig
  tables: List[Any]  # tf.tpu.experimental.embedding.TableConfig
  table_names: List[str]
  optimizers: List[Any]  # tf.tpu.experimental.embedding optimizers
  dynamic_learning_rates: List[Callable[[], Any]]

  def table_id(self, feature) -> int:
    return next(i for i, t in enumerate(self.tables) if t is feature.table)


def resolve(feature_config: Any, optimizer: Optional[Any]) -> TensorFlowView:
  """The tables, their names and optimizers, as TensorFlow fixes them
  (`tfemb.resolution`), as TensorFlow's config objects."""
  resolved = resolution.resolve(feature_config, optimizer)
  for table in resolved.tables:
    if table.optimizer is None:
      raise ValueError(
          f"Table {table.name!r}: the TPU needs an embedding optimizer (SGD, "
          "Adagrad, AdagradMomentum, Adam or FTRL, on the table or given "
          "globally), got NoneType.")
    if optimizers.is_custom(table.optimizer):
      raise ValueError(
          f"Table {table.name!r}: a CustomOptimizer trains only on a "
          "SparseCore (TPUEmbeddingV2), which TPUEmbedding's configuration "
          "does not cover; plan it with `python -m tfemb.tpu sparsecore` "
          "(docs/sparsecore.md).")
  features = nest.flatten(tf_conversion.to_tensorflow(resolved.structure))
  tables = []
  for feature in features:
    if not any(feature.table is t for t in tables):
      tables.append(feature.table)
  return TensorFlowView(resolved.paths, features, tables,
                  [t.name for t in tables], [t.optimizer for t in tables],
                  resolution.dynamic_learning_rates(tables))


def output_shapes(
    resolved: TensorFlowView,
    per_replica_batch_size: Optional[int]) -> List[tf.TensorShape]:
  """Per feature, the activation shape without `dim` (TF's `build`).

  A feature's own `output_shape` wins; otherwise `[batch]`, or
  `[batch, max_sequence_length]` for a sequence feature.
  """
  incoming = [None] * len(resolved.features)
  if per_replica_batch_size is not None:
    incoming = [shapes_lib.from_batch_size(per_replica_batch_size, f)
                for f in resolved.features]
  fixed = shapes_lib.fix(resolved.paths,
                         [f.output_shape for f in resolved.features],
                         incoming)
  shapes_lib.check_fully_defined(resolved.paths, fixed)
  return fixed


def config_proto(resolved: TensorFlowView,
                 shapes: Sequence[tf.TensorShape],
                 num_replicas: int,
                 num_hosts: int,
                 num_cores_per_replica: Optional[int] = None,
                 pipeline_execution_with_tensor_core: bool = False) -> _Config:
  """The proto `TPUEmbedding.build` sends to the TPU for this topology."""
  config = _Config()
  for table, name, optimizer in zip(resolved.tables, resolved.table_names,
                                    resolved.optimizers):
    descriptor = config.table_descriptor.add()
    descriptor.name = name
    # TensorFlow pads small tables so that every host holds one id.
    descriptor.vocabulary_size = max(table.vocabulary_size, num_hosts)
    descriptor.dimension = table.dim
    _set_optimization_parameters(descriptor.optimization_parameters,
                                 optimizer, table.quantization_config,
                                 resolved.dynamic_learning_rates)
  for feature, shape in zip(resolved.features, shapes):
    descriptor = config.feature_descriptor.add()
    if feature.name:
      descriptor.name = feature.name
    descriptor.table_id = resolved.table_id(feature)
    descriptor.input_shape.extend(shape.as_list())
  config.mode = _Config.TRAINING
  config.num_hosts = num_hosts
  config.num_tensor_cores = num_replicas * (num_cores_per_replica or 1)
  config.sharding_strategy = _Config.DIV_DEFAULT
  config.pipeline_execution_with_tensor_core = (
      pipeline_execution_with_tensor_core)
  if num_cores_per_replica:
    config.spmd_sharding.enabled = True
    config.spmd_sharding.num_cores_per_replica = num_cores_per_replica
  return config


def _set_optimization_parameters(parameters, optimizer, quantization, rates):
  """`_set_table_descriptor`'s share, then the optimizer's, then the
  quantization's (the order TensorFlow writes them in)."""
  if callable(optimizer.learning_rate):
    parameters.learning_rate.dynamic.tag = rates.index(optimizer.learning_rate)
  else:
    parameters.learning_rate.constant = optimizer.learning_rate
  parameters.gradient_accumulation_status = (
      _Accumulation.ENABLED
      if optimizer.use_gradient_accumulation else _Accumulation.DISABLED)
  limits = ((parameters.clipping_limits, optimizer.clip_weight_min,
             optimizer.clip_weight_max),
            (parameters.gradient_clipping_limits, optimizer.clip_gradient_min,
             optimizer.clip_gradient_max))
  for clipping, lower, upper in limits:
    if lower is not None:
      clipping.lower.value = lower
    if upper is not None:
      clipping.upper.value = upper
  if optimizer.weight_decay_factor:
    parameters.weight_decay_factor = optimizer.weight_decay_factor
    if optimizer.multiply_weight_decay_factor_by_learning_rate:
      parameters.multiply_weight_decay_factor_by_learning_rate = True
  parameters.low_dimensional_packing_status = (
      _Packing.ENABLED
      if optimizer.low_dimensional_packing_status else _Packing.UNSPECIFIED)
  _set_optimizer_fields(parameters, optimizer)
  if quantization:
    parameters.simulated_quantization.enabled = True
    parameters.simulated_quantization.num_buckets = quantization.num_buckets
    limits = parameters.simulated_quantization.clipping_limits
    limits.lower.value = quantization.lower
    limits.upper.value = quantization.upper


def _set_optimizer_fields(parameters, optimizer):
  """The optimizer's own message, as its declaration says
  (`tfemb.optimizers`: `proto_message`, `proto_fields`)."""
  declaration = optimizers.identify(optimizer)
  message = getattr(parameters, declaration.proto_message)
  message.SetInParent()
  for field, source in declaration.proto_fields.items():
    setattr(message, field, source(optimizer) if callable(source) else
            getattr(optimizer, source))
