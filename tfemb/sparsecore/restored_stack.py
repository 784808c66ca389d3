"""A checkpoint's stacked values, restored as the tables are created.

When a checkpoint restore is pending for a stacked variable (TensorFlow's
restore-on-create), each table of the stack gets its rows of the restored
stacked value as its own variable's initial value (`RestoredTable`), read
from the checkpoint once for all of them (`RestoredValue`).
"""

import tensorflow as tf

from tfemb.sparsecore import stacked_blocks


class RestoredValue:
  """A checkpoint's value of a stacked variable (or slot), restored as the
  tables are created: TensorFlow's restore-on-create initializer
  `restored`, read once for all of the stack's tables."""

  def __init__(self, restored, shape):
    self._restored = restored
    self._shape = list(shape)
    self._value = None

  def __call__(self, dtype) -> tf.Tensor:
    if self._value is None:
      self._value = tf.convert_to_tensor(
          self._restored(self._shape, dtype=dtype))
    return self._value

  def release(self):
    """Frees the value once every table is created."""
    self._value = None


class RestoredTable:
  """The initial value of a table's own variable: its rows of a
  `RestoredValue` of its stacked variable."""

  def __init__(self, stacking, table_name: str, restored: RestoredValue):
    self._stacking = stacking
    self._table_name = table_name
    self._restored = restored

  def __call__(self, shape, dtype=tf.float32, **unused_kwargs):
    del shape  # the table's own: its rows of the stacked value
    stacking = self._stacking
    stacked_name = stacking.tables[self._table_name].stacked_table_name
    names = stacking.stacked_tables[stacked_name].table_names
    rows = stacked_blocks.rows_per_shard(stacking, stacked_name)
    return stacked_blocks.part(self._restored(dtype), rows,
                               stacking.num_sparse_cores,
                               names.index(self._table_name))
