"""The host `TPUEmbeddingV2`'s configuration of stacked tables: one
`TableConfig` per stacked table (TensorFlow's padded shape, the
SparseCore's optimizer, an initializer that places each table's rows), and
one per user table over its stacked table's rows, which the host engine's
parts train; and the trackable that saves the layouts."""

import copy

import tensorflow as tf
from tensorflow.python.tpu import tpu_embedding_v3_utils  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.trackable import base as trackable  # pylint: disable=g-direct-tensorflow-import

from tfemb import resolution
from tfemb.sparsecore import custom
from tfemb.sparsecore import layout as layout_lib


class StackedInitializer:
  """The initial value of a stacked table: each table's own initializer,
  its rows at their stacked rows, padding zero."""

  def __init__(self, stacking, tables):
    self._stacking = stacking
    self._tables = tables

  def __call__(self, shape, dtype=tf.float32, **unused_kwargs):
    value = tf.zeros(shape, dtype)
    for table in self._tables:
      rows = layout_lib.stacked_rows(
          self._stacking, table.name,
          tf.range(table.vocabulary_size, dtype=tf.int64))
      block = table.initializer((table.vocabulary_size, table.dim),
                                dtype=dtype)
      block = tf.pad(block, [[0, 0], [0, shape[1] - table.dim]])
      value = tf.tensor_scatter_nd_update(value, rows[:, None], block)
    return value



def stacked_config(config, stacking):
  """`(stacked tables, trained)`: one TableConfig per stacked table
  (padded shape, the SparseCore's optimizer, a stacked initializer), the
  variables' configs; and the configuration the host engine's parts
  train, with one table per user table over its stacked table's rows (so
  each table's lookup is a kernel of its own; the update of the tables of
  one stacked table is one kernel, `tfemb.host.tables.update_groups`),
  each feature looking its table up by stacked row."""
  by_name = {t.name: t for t in config.tables}
  stacked_tables, trained = [], {}
  for name, stacked in stacking.stacked_tables.items():
    members = [by_name[n] for n in stacked.table_names]
    table = copy.copy(members[0])
    table.name = name
    table.vocabulary_size, table.dim = stacked.shape
    table.optimizer = [custom.host_optimizer(m) for m in members][0]
    table.initializer = StackedInitializer(stacking, members)
    stacked_tables.append(table)
    for member in members:
      part = copy.copy(table)
      part.name = member.name
      part.stacked_table_name = name
      trained[member.name] = part
  tables = [trained[t.name] for t in config.tables]
  features = []
  for feature in config.features:
    stacked_feature = copy.copy(feature)
    stacked_feature.table = trained[feature.table.name]
    features.append(stacked_feature)
  return stacked_tables, resolution.Resolved(
      config.structure, config.paths, features, config.table_index, tables,
      tables)


class LayoutsTrackable(tpu_embedding_v3_utils.SparseCoreLayoutsTrackable):
  """TensorFlow's trackable of the layouts, its tensor made as it is saved
  (a SavedModel traces its saver into a graph, which cannot capture the
  eager constant)."""

  def __init__(self, serialized: bytes):
    super().__init__(tf.constant(serialized))
    self._serialized = serialized

  def _serialize_to_tensors(self):
    return {trackable.VARIABLE_VALUE_KEY: tf.constant(self._serialized)}
