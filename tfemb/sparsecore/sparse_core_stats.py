"""`TPUEmbeddingV2.compute_sparse_core_stats` on any CPU (docs/sparsecore.md,
"Id limits").

TensorFlow's own `compute_sparse_core_stats` runs the TPU host's
preprocessing ops, which the CPU wheel does not have; the same counts come
from `tfemb.sparsecore.id_counting`, on the tables stacked by TensorFlow's
own stacker (`tfemb.sparsecore.table_stacking`). `stacking_for` and
`feature_ids` also serve `tfemb.sparsecore.pipeline_report`.
"""

from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.python.util import nest  # pylint: disable=g-direct-tensorflow-import

from tfemb import resolution
from tfemb.sparsecore import id_counting
from tfemb.sparsecore import input_rules
from tfemb.sparsecore import table_stacking


def stacking_for(feature_config: Any, num_tpu_chips: int,
                 num_sc_per_chip: int = 4, optimizer: Optional[Any] = None,
                 sparse_core_embedding_config: Optional[Any] = None):
  """`(resolved config, Stacking)` as a TPU of `num_tpu_chips` chips would
  stack the tables of `feature_config`."""
  for name, value in (("num_tpu_chips", num_tpu_chips),
                      ("num_sc_per_chip", num_sc_per_chip)):
    if not isinstance(value, int) or value <= 0:
      raise ValueError(f"{name} must be a positive integer; got {value!r}.")
  config = resolution.resolve(feature_config, optimizer)
  stacking = table_stacking.stack(config.tables,
                                  list(zip(config.paths, config.features)),
                                  num_tpu_chips, num_sc_per_chip,
                                  sparse_core_embedding_config)
  return config, stacking


def _ids_of(path: str, x: Any, sample_count: int) -> Tuple[np.ndarray,
                                                           np.ndarray]:
  """(ids, samples) of one feature's input, as TensorFlow's COO
  conversion reads it."""
  if isinstance(x, tf.SparseTensor):
    values, samples = x.values, x.indices[:, 0]
  elif isinstance(x, tf.RaggedTensor):
    if x.nrows() != sample_count:
      raise ValueError(
          f"Feature {path!r}: a ragged input of {int(x.nrows())} rows; "
          f"output_shape has {sample_count} samples.")
    values, samples = x.flat_values, x.value_rowids()
  else:
    values = tf.reshape(x, [-1])
    samples = tf.range(tf.size(values, out_type=tf.int64))
  ids = values.numpy().astype(np.int64)
  samples = samples.numpy().astype(np.int64)
  if samples.size and (samples.min() < 0 or samples.max() >= sample_count):
    raise ValueError(
        f"Feature {path!r}: a sample index {int(samples.max())} outside the "
        f"{sample_count} samples of output_shape.")
  return ids, samples


def feature_ids(config, features: Any) -> List[id_counting.FeatureIds]:
  """One chip's batch `features` (the structure of the feature config) as
  `id_counting.FeatureIds`, under TensorFlow's V2 input rules."""
  try:
    nest.assert_same_structure(config.structure, features)
  except (ValueError, TypeError) as e:
    raise ValueError(f"features must have the structure of feature_config "
                     f"({config.paths}): {e}") from None
  out = []
  for path, feature, x in zip(config.paths, config.features,
                              nest.flatten(features)):
    x, _ = input_rules.prepare(path, feature, x, None)
    count = tf.TensorShape(feature.output_shape).num_elements()
    ids, samples = _ids_of(path, x, count)
    vocabulary = feature.table.vocabulary_size
    bad = (ids < 0) | (ids >= vocabulary)
    if bad.any():
      raise ValueError(f"Feature {path!r}: id {int(ids[bad][0])} outside "
                       f"[0, {vocabulary}) (table {feature.table.name!r}).")
    out.append(id_counting.FeatureIds(path, feature.table.name, ids,
                                      samples, count))
  return out


def compute_sparse_core_stats(features: Any, feature_config: Any,
                              num_tpu_chips: int, num_sc_per_chip: int = 4,
                              optimizer: Optional[Any] = None,
                              sparse_core_embedding_config: Optional[Any] = None
                              ) -> Tuple[Dict[str, tf.Tensor],
                                         Dict[str, tf.Tensor]]:
  """Per stacked table, the most ids and the most distinct ids one
  SparseCore partition gets from `features` (one chip's batch): TensorFlow's
  `(max_ids_per_table, max_unique_ids_per_table)`, int32 scalars."""
  config, stacking = stacking_for(feature_config, num_tpu_chips,
                                  num_sc_per_chip, optimizer,
                                  sparse_core_embedding_config)
  counts = id_counting.counts(stacking, feature_ids(config, features))
  return ({n: tf.constant(int(c.ids.max()), tf.int32)
           for n, c in counts.items()},
          {n: tf.constant(int(c.unique.max()), tf.int32)
           for n, c in counts.items()})
