"""An interleaved table's storage and its views, as `TableStore`
(`tfemb.host.table_store`) creates a table's variables."""

from typing import Any, Callable, Dict, Sequence

import tensorflow as tf

from tfemb import initialization
from tfemb import options
from tfemb import tf_internals
from tfemb.interleaved_tables.column_view import ColumnView
from tfemb.kernels import fused_ops


def create(table, names: Sequence[str], initializers: Sequence[Any],
           track: Callable[..., tf.Variable],
           opts: options.Options) -> Dict[str, ColumnView]:
  """The variables of `table`, a table `wanted`: its storage, and over it a
  view for the parameters and one for each slot.

  Args:
    table: the resolved `TableConfig`.
    names: its optimizer's slots, in its order (their columns' order).
    initializers: theirs, in the same order.
    track: `track(name, initializer, make, trainable=True)`: the owner's
      child `name`, made when TensorFlow's tracking asks for it (with a
      checkpoint's value as its initializer when a restore of it is
      pending) by `make(name, dtype, initializer, trainable, blocks)`
      (`blocks`: the rows of each block of its initialization, or None).
    opts: the engine's options (for the storage's huge pages).

  Returns:
    The views by slot name, then "parameters" (a table's variables).
  """
  table_shape = (table.vocabulary_size, table.dim)
  width = (1 + len(names)) * table.dim
  # No child of the owner: a checkpoint holds the views, a SavedModel the
  # storage too (`tfemb.serving.savedmodel`).
  storage = tf.Variable(
      initialization.uninitialized((table.vocabulary_size, width),
                                   tf.float32),
      shape=(table.vocabulary_size, width), dtype=tf.float32,
      trainable=False, name=table.name + "/interleaved")
  fused_ops.advise_huge_pages(storage, opts)
  # A view's columns, by the name TensorFlow gives the variable.
  column = {table.name: 0}
  column.update({f"{table.name}/{n}": k + 1 for k, n in enumerate(names)})

  def view(name, dtype, initializer, trainable, blocks):
    variable = ColumnView(storage, column[name] * table.dim, table.dim, name,
                          trainable)
    if blocks:
      initialization.fill_in_blocks(variable.assign_rows, table_shape,
                                    dtype, initializer, blocks)
    else:
      variable.assign(initializer(table_shape, dtype=dtype),
                      read_value=False)
    if initialization.is_restored(initializer):  # not restored again
      tf_internals.mark_restored(variable, initializer.restore_uid)
    return variable

  parameters = track(table.name, table.initializer, view)
  views = {name: track(f"{table.name}/{name}", init, view, trainable=False)
           for name, init in zip(names, initializers)}
  views["parameters"] = parameters
  return views
