"""Table and feature configuration, as `tf.tpu.experimental.embedding` has it.

`TableConfig`, `FeatureConfig` and `QuantizationConfig` take the same
arguments, defaults and validation as TensorFlow 2.21's classes. They hold
data only; engines read them.
"""

import math
from typing import Any, Callable, List, Optional, Text, Union

from absl import logging
import tensorflow as tf
from tensorflow.python.ops import init_ops_v2

from tfemb import sparsecore_configs
from tfemb.sparsecore_configs import CustomCombiner

_COMBINERS = ("mean", "sum", "sqrtn")


class QuantizationConfig:
  """Simulated quantization of looked-up rows (before the combiner).

  `x = clip(x, lower, upper)`; `q = (upper - lower) / (num_buckets - 1)`;
  `x = floor((x - lower) / q + 0.5) * q + lower`. Table storage stays float32.

  Args:
    num_buckets: the number of levels (>= 2).
    lower: the lowest level; smaller values are clipped to it.
    upper: the highest level; larger values are clipped to it.
  """

  def __init__(self, num_buckets: int, lower: float, upper: float):
    if num_buckets < 2:
      raise ValueError(f"num_buckets is {num_buckets}, must be at least 2 for "
                       f"simulated quantization.")
    self.num_buckets = num_buckets
    self.lower = lower
    self.upper = upper

  def __eq__(self, other: Any) -> bool:
    return type(other) is type(self) and other.__dict__ == self.__dict__

  def __hash__(self) -> int:
    return hash((self.num_buckets, self.lower, self.upper))

  def __repr__(self):
    return (f"QuantizationConfig(num_buckets={self.num_buckets!r}, "
            f"lower={self.lower!r}, upper={self.upper!r})")


def default_initializer(dim: int):
  """TensorFlow's default: truncated normal, mean 0, stddev 1/sqrt(dim)."""
  return init_ops_v2.TruncatedNormal(mean=0.0, stddev=1 / math.sqrt(dim))


def _is_default_initializer(initializer, dim) -> bool:
  return (isinstance(initializer, init_ops_v2.TruncatedNormal) and
          initializer.mean == 0.0 and
          math.isclose(initializer.stddev, 1 / math.sqrt(dim)))


class TableConfig:
  """One embedding table: `vocabulary_size` rows of width `dim`.

  Several `FeatureConfig`s may share one `TableConfig`; they then share the
  table's rows, and the gradients of all of them are summed per row.

  Args:
    vocabulary_size: the number of rows (>= 1); ids are in
      `[0, vocabulary_size)`.
    dim: the width of a row (>= 1).
    initializer: called as `initializer(shape, dtype=...)` for the table's
      initial value; default: truncated normal, mean 0, standard deviation
      `1 / sqrt(dim)` (TensorFlow's).
    optimizer: this table's embedding optimizer (a `CustomOptimizer`:
      `TPUEmbeddingV2` only); None: the one given to the engine.
    combiner: how a feature's rows combine per example: "mean" (default),
      "sum" or "sqrtn" (docs/numerics.md, "Combiners"), or a
      `CustomCombiner` (TensorFlow's class; `TPUEmbeddingV2` only).
    name: the table's name, its variables' and checkpoint keys' name;
      None: `table_<i>`, by order of first use. Names must be unique.
    quantization_config: a `QuantizationConfig` for simulated quantization
      of looked-up rows (the table stays float32).
    layout: a SparseCore layout for the table, kept for TensorFlow's
      `TPUEmbeddingV2`; no effect on the host engine.
    dtype: the table's dtype: float32 (the host engine trains float32
      tables only) or int32.
  """

  def __init__(
      self,
      vocabulary_size: int,
      dim: int,
      initializer: Optional[Callable[[Any], None]] = None,
      optimizer: Optional[Any] = None,
      combiner: Union[Text, CustomCombiner] = "mean",
      name: Optional[Text] = None,
      quantization_config: QuantizationConfig = None,
      layout: Optional[Any] = None,
      dtype: tf.dtypes.DType = tf.float32,
  ):
    if not isinstance(vocabulary_size, int) or vocabulary_size < 1:
      raise ValueError(
          f"Argument `vocabulary_size` must be an int and must be >= 1. "
          f"Received: {vocabulary_size}")
    if not isinstance(dim, int) or dim < 1:
      raise ValueError(
          f"Argument `dim` (embedding dimension) "
          f"must be an int and must be >= 1. Received: {dim}")
    if (initializer is not None) and (not callable(initializer)):
      raise ValueError(
          f"Argument `initializer` must be a callable (or None). "
          f"Received: {initializer}")
    if initializer is None:
      initializer = default_initializer(dim)
    if isinstance(combiner, str):
      if combiner not in _COMBINERS:
        raise ValueError(
            f"String argument `combiner` must be in {_COMBINERS}. "
            f"Received: {combiner}")
    elif not sparsecore_configs.is_a(combiner, "CustomCombiner"):
      raise ValueError(
          f"Argument `combiner` should either be a str or a CustomCombiner. "
          f"Received: {type(combiner)}")
    if name is None:
      logging.warning(
          "Name of the table config must be specified for running on"
          " SparseCore. Different table configs must have unique names.")
    if dtype not in (tf.float32, tf.int32):
      raise ValueError(
          f"Argument `dtype` must be either float32 or int32. Received: {dtype}")
    self.vocabulary_size = vocabulary_size
    self.dim = dim
    self.initializer = initializer
    self.optimizer = optimizer
    self.combiner = combiner
    self.name = name
    self.quantization_config = quantization_config
    self.layout = layout
    self.dtype = dtype

  def __repr__(self):
    initializer = self.initializer
    if _is_default_initializer(initializer, self.dim):
      initializer = None
    return (f"TableConfig(vocabulary_size={self.vocabulary_size!r}, "
            f"dim={self.dim!r}, initializer={initializer!r}, "
            f"optimizer={self.optimizer!r}, combiner={self.combiner!r}, "
            f"name={self.name!r}, "
            f"quantization_config={self.quantization_config!r})")


class FeatureConfig:
  """One input feature, looked up in `table`.

  Args:
    table: the `TableConfig` (tfemb's or TensorFlow's) to look it up in.
    max_sequence_length: 0 (default): one combined row per example. More:
      a sequence feature, whose output is `[batch, max_sequence_length,
      dim]`, truncated or zero padded (docs/numerics.md, "Sequence
      features").
    validate_weights_and_indices: check ids against the vocabulary, sparse
      indices' order and weights' layout at every step (default). False
      skips those checks for speed (docs/numerics.md, "Errors").
    output_shape: the activation shape without the table dimension, fixed
      in advance (e.g. `[batch_size]`); None: from `build` or the inputs.
    name: the feature's name in the TPU configuration; no effect on the
      host.
  """

  def __init__(self,
               table: TableConfig,
               max_sequence_length: int = 0,
               validate_weights_and_indices: bool = True,
               output_shape: Optional[Union[List[int], tf.TensorShape]] = None,
               name: Optional[Text] = None):
    if not _is_table_config(table):
      raise ValueError(f"Argument `table` has invalid type {type(table)}. "
                       "Expected `tf.tpu.experimental.embedding.TableConfig`.")
    if not isinstance(max_sequence_length, int) or max_sequence_length < 0:
      raise ValueError(
          f"Argument `max_sequence_length` must be an int and must be >= 0. "
          f"Received: {max_sequence_length}")
    self.table = table
    self.max_sequence_length = max_sequence_length
    self.name = name
    self.output_shape = tf.TensorShape(output_shape)
    if not isinstance(validate_weights_and_indices, bool):
      raise ValueError(
          f"Argument `validate_weights_and_indices` must be a boolean. "
          f"Received: {validate_weights_and_indices}")
    self.validate_weights_and_indices = validate_weights_and_indices

  def __repr__(self):
    return (f"FeatureConfig(table={self.table!r}, "
            f"max_sequence_length={self.max_sequence_length!r}, "
            f"validate_weights_and_indices="
            f"{self.validate_weights_and_indices!r}, "
            f"output_shape={self.output_shape!r}, name={self.name!r})")


def _is_table_config(table) -> bool:
  return isinstance(table,
                    (TableConfig, tf.tpu.experimental.embedding.TableConfig))
