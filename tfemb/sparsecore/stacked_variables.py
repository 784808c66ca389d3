"""The host `TPUEmbeddingV2`'s variables: each table's own, and the stacked
views over them that a checkpoint holds.

`create` makes the tables' variables (with the engine's `TableStore`) and
the stacked variables of an engine (`tfemb.sparsecore.stacked_variable`),
restoring a checkpoint's stacked values as it creates them when a restore
is pending (`tfemb.sparsecore.restored_stack`). `TablesHolder` is what
owns the tables' own variables, out of the checkpoint.
"""

import copy
from typing import Dict

import tensorflow as tf
from tensorflow.python.trackable import autotrackable

from tfemb import initialization
from tfemb import optimizers
from tfemb import tf_internals
from tfemb.host import table_store
from tfemb import tpu_strategies
from tfemb.sparsecore.restored_stack import RestoredTable
from tfemb.sparsecore.restored_stack import RestoredValue
from tfemb.sparsecore.stacked_blocks import rows_per_shard
from tfemb.sparsecore.stacked_variable import StackedVariable


def create(owner, holder, stacking, store, stacked_tables, trained):
  """The tables' variables and the stacked variables of the engine `owner`.

  `stacked_tables`: the stacked tables' configs, and `store` their
  `table_store.TableStore` (the engine's); `trained`: the configs of the
  tables' own variables (`trained_config.stacked_config`). Returns
  `(stacked, tables)`: `{stacked table: {"parameters": StackedVariable,
  slot: StackedVariable}}`, tracked by `owner` under TensorFlow's names
  (`<stacked table>`, `<stacked table>/<slot>`), and `{table:
  {"parameters": variable, slot: variable}}`, the tables' own variables
  (children of `holder`, a `TablesHolder` that checkpoints do not
  hold).

  A checkpoint restore pending for a stacked variable (restore-on-create)
  gives its tables' variables their initial values.
  """
  shapes = store.shapes
  restored: Dict[str, RestoredValue] = {}
  for name, shape in shapes.items():
    pending = _pending(owner, name)
    if pending is not None:
      restored[name] = RestoredValue(pending, shape)
  tables, slot_initializers = [], {}
  for table in trained.tables:
    prefix = table.stacked_table_name
    if prefix in restored:
      table = copy.copy(table)
      table.initializer = RestoredTable(stacking, table.name,
                                        restored[prefix])
    inits = []
    if table.optimizer is not None:
      defaults = optimizers.slot_initializers(table.optimizer)
      for slot, default in zip(table_store.slot_names(table), defaults):
        name = f"{prefix}/{slot}"
        inits.append(RestoredTable(stacking, table.name, restored[name])
                     if name in restored else default)
    slot_initializers[table.name] = inits
    tables.append(table)
  # Not trainable, as TensorFlow's SparseCore tables.
  own_variables = store.like(tables, slot_initializers,
                             trainable=False).create(holder)
  for value in restored.values():
    value.release()

  stacked = {}
  n = stacking.num_sparse_cores
  # Under a TPU's strategy (a host one here), a stacked variable's `values`
  # are its chips' shards, as TensorFlow's sharded variable gives them:
  # one per replica's device.
  chips = (tuple(store.strategy.extended.worker_devices)
           if tpu_strategies.is_tpu_strategy(store.strategy) else ())
  for config in stacked_tables:
    names = stacking.stacked_tables[config.name].table_names
    rows = rows_per_shard(stacking, config.name)
    members = [own_variables[t] for t in names]
    views = {}
    for slot in ["parameters"] + table_store.slot_names(config):
      name = config.name if slot == "parameters" else f"{config.name}/{slot}"
      view = StackedVariable(name, [m[slot] for m in members], rows, n,
                             chips)
      views[slot] = _track(owner, name, view)
    stacked[config.name] = views
  return stacked, own_variables


def _pending(owner, name: str):
  """TensorFlow's restore-on-create initial value of `owner`'s child
  `name`, or None when no restore of it is pending."""
  if not tf.executing_eagerly():
    return None
  return tf_internals.preload_simple_restoration(owner, name)


def _track(owner, name: str, view: StackedVariable) -> StackedVariable:
  """`view` as `owner`'s child `name`; a restore pending for it was done
  as its tables were created (their initial values), not again."""

  def getter(name, shape, dtype, initializer, **unused_kwargs):
    del name, shape, dtype
    if initialization.is_restored(initializer):
      tf_internals.mark_restored(view, initializer.restore_uid)
    return view

  return tf_internals.add_variable_with_custom_getter(
      owner, name=name, shape=view.shape, dtype=view.dtype, getter=getter,
      initializer=None, overwrite=True)


class TablesHolder(autotrackable.AutoTrackable):
  """What creates the tables' own variables (`table_store.TableStore`
  makes them its children); the engine does not track it, so checkpoints
  hold the stacked variables only."""
