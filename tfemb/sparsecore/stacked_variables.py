"""`StackedVariable`: a stacked table as TensorFlow lays it out, over the
variables of its tables.

The host `TPUEmbeddingV2` keeps each table of a stack in a variable of its
own (`tfemb.sparsecore.trained_config`). TensorFlow's stacked variable is
made of blocks, shard by shard and, inside a shard, table by table; block
j of a table is rows [j * P, (j + 1) * P) of the table's variable. A
`StackedVariable` is that stacked variable (or one of its slots): read and
assigned whole, in TensorFlow's layout, and saved in a checkpoint under
TensorFlow's key as one tensor of the stacked shape, written slice by
slice straight from the tables' variables (no copy of the stack; a table
whose slots sit beside its parameters is split for the save, as
`tfemb.interleaved_tables` saves it). A checkpoint restores into it from a
stacked tensor saved whole or in slices; TensorFlow's classes restore its
value as they restore a variable. `join` and `split` make a stacked value
of its tables' values, and back.

`create` makes the tables' variables and the stacked variables of an
engine, restoring a checkpoint's stacked values as it creates them when a
restore is pending (`RestoredValue`, `RestoredTable`).
"""

import copy
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.trackable import autotrackable
from tensorflow.python.trackable import base as trackable
from tensorflow.python.training.saving import saveable_object  # pylint: disable=g-direct-tensorflow-import

from tfemb import initialization
from tfemb import interleaved_tables
from tfemb import optimizers
from tfemb import replicas
from tfemb.host import variables as variables_lib
from tfemb import tf_internals


def rows_per_shard(stacking, stacked_name: str) -> List[int]:
  """Per table of the stack (in its order), its rows in each SparseCore
  shard: P = its padded rows / N."""
  n = stacking.num_sparse_cores
  return [stacking.tables[t].padded_vocabulary_size // n
          for t in stacking.stacked_tables[stacked_name].table_names]


def join(values: Sequence[tf.Tensor], rows: Sequence[int],
         num_shards: int) -> tf.Tensor:
  """The stacked value of its tables' `values` (each `[N * rows[k], ...]`):
  shard by shard, each table's rows of the shard."""
  return tf.concat([value[s * r:(s + 1) * r] for s in range(num_shards)
                    for value, r in zip(values, rows)], axis=0)


def part(stacked: tf.Tensor, rows: Sequence[int], num_shards: int,
         k: int) -> tf.Tensor:
  """Table `k`'s value, from a `stacked` value: its rows of each shard."""
  per_shard, first = sum(rows), sum(rows[:k])
  return tf.concat([stacked[s * per_shard + first:s * per_shard + first +
                            rows[k]] for s in range(num_shards)], axis=0)


def split(stacked: tf.Tensor, rows: Sequence[int],
          num_shards: int) -> List[tf.Tensor]:
  """Each table's value, from a `stacked` value (`join`'s inverse)."""
  return [part(stacked, rows, num_shards, k) for k in range(len(rows))]


class StackedVariable(trackable.Trackable):
  """A stacked variable `name` of its tables' variables `tables` (in the
  stack's order), each `[N * rows_per_shard[k], ...]`, laid out as
  `join` says: `[N * sum(rows_per_shard), ...]`.

  Reading it (`value`, `read_value`, `numpy`, `tf.convert_to_tensor`,
  indexing) gathers the blocks into one tensor; `assign` writes each
  table's blocks into its variable. Under a `MirroredStrategy`, `values`
  are the stacked variables of each replica's copies.
  """

  def __init__(self, name: str, tables: Sequence[Any],
               rows_per_shard: Sequence[int], num_shards: int):
    self._name = name
    self._tables = list(tables)
    self._rows = list(rows_per_shard)
    self._shards = num_shards
    inner = self._tables[0].shape[1:]
    self._shape = tf.TensorShape([num_shards * sum(self._rows)]).concatenate(
        inner)

  # --- what it is ---------------------------------------------------------

  @property
  def name(self) -> str:
    return self._name + ":0"

  @property
  def shape(self) -> tf.TensorShape:
    return self._shape

  def block_rows(self) -> List[Tuple[int, int]]:
    """`(table, rows)` of each block, in the stacked variable's row order:
    each shard holds a block of every table."""
    return [(k, rows) for _ in range(self._shards)
            for k, rows in enumerate(self._rows)]

  def get_shape(self) -> tf.TensorShape:
    return self._shape

  @property
  def dtype(self) -> tf.DType:
    return self._tables[0].dtype

  @property
  def device(self) -> str:
    return self._tables[0].device

  @property
  def trainable(self) -> bool:
    return self._tables[0].trainable

  @property
  def tables(self) -> List[Any]:
    """The variables of its tables, in the stack's order."""
    return list(self._tables)

  @property
  def values(self):
    """One `StackedVariable` per copy of its tables' (mirrored) variables."""
    copies = [replicas.copies(t) for t in self._tables]
    return tuple(StackedVariable(self._name, tables, self._rows,
                                 self._shards) for tables in zip(*copies))

  def __repr__(self):
    return (f"<tfemb StackedVariable '{self.name}' shape={self.shape} "
            f"dtype={self.dtype.name}: {len(self._tables)} table(s) in "
            f"{self._shards} shard(s)>")

  # --- reading ------------------------------------------------------------

  def value(self) -> tf.Tensor:
    return join([tf.convert_to_tensor(t) for t in self._tables],
                self._rows, self._shards)

  def read_value(self) -> tf.Tensor:
    return self.value()

  def numpy(self) -> np.ndarray:
    return self.value().numpy()

  def __array__(self, dtype=None, copy=None):
    del copy  # always a copy: the blocks come from several variables
    return self.numpy() if dtype is None else self.numpy().astype(dtype)

  def __getitem__(self, key):
    return self.value()[key]

  def _dense_var_to_tensor(self, dtype=None, name=None, as_ref=False):
    del name, as_ref
    if dtype is not None and dtype != self.dtype:
      raise ValueError(f"{self.name} is {self.dtype.name}, not {dtype}")
    return self.value()

  # --- writing ------------------------------------------------------------

  def assign(self, value, use_locking=None, name=None, read_value=True):
    """Writes `value` (the stacked shape) into its tables' variables."""
    del use_locking, name
    parts = split(interleaved_tables.assign_value(self, value), self._rows,
                  self._shards)
    ops = [table.assign(part, read_value=False)
           for table, part in zip(self._tables, parts)]
    return interleaved_tables.assigned(
        self, tf.group([op for op in ops if op is not None]), read_value)

  def assign_add(self, delta, use_locking=None, name=None, read_value=True):
    return self.assign(self.value() + delta, read_value=read_value)

  def assign_sub(self, delta, use_locking=None, name=None, read_value=True):
    return self.assign(self.value() - delta, read_value=read_value)

  # --- checkpoints: TensorFlow's key, one tensor saved in slices ----------

  def _gather_saveables_for_checkpoint(self):
    return {trackable.VARIABLE_VALUE_KEY: self._saveable}

  def _saveable(self, name: str):
    return _StackedSaveable(self, name)

  def saved_values(self) -> List[tf.Tensor]:
    """Each table's value as a save writes it: eagerly, a table whose
    slots sit beside its parameters is split for the save
    (`ColumnView.saved_value`), any other read once."""
    return [t.saved_value() if hasattr(t, "saved_value")
            else tf.convert_to_tensor(t) for t in self._tables]

  def restore_blocks(self, blocks: Sequence[tf.Tensor]):
    """Writes the blocks a restore read (in row order) into the tables."""
    n = len(self._tables)
    ops = [table.assign(tf.concat(list(blocks[k::n]), axis=0),
                        read_value=False)
           for k, table in enumerate(self._tables)]  # blocks: shard by shard
    return tf.group([op for op in ops if op is not None])

  def _copy_trackable_to_cpu(self, object_map):
    """An async save's copy: a variable of the stacked value, written at
    each such save before training goes on."""
    if self not in object_map:
      object_map[self] = resource_variable_ops.UninitializedVariable(
          trainable=self.trainable, shape=self.shape, dtype=self.dtype,
          name=self._name)
    object_map[self].assign(self.value())


class _StackedSaveable(saveable_object.SaveableObject):
  """The save and restore of a `StackedVariable`: one slice per block."""

  def __init__(self, variable: StackedVariable, name: str):
    self._variable = variable
    self._values = None  # the tables' values, read once per save
    full = variable.shape.as_list()
    specs = []
    first = 0
    for k, rows in variable.block_rows():
      spec = tf.Variable.SaveSliceInfo(
          full_name=name, full_shape=full,
          var_offset=[first] + [0] * (len(full) - 1),
          var_shape=[rows] + full[1:]).spec
      specs.append(saveable_object.SaveSpec(
          self._block(len(specs), k, rows), spec, name, dtype=variable.dtype,
          device=variable.tables[k].device))
      first += rows
    super().__init__(variable, specs, name)

  def _block(self, index: int, table: int, rows: int):
    shard = index // len(self._variable.tables)

    def read():
      # Read once per save (a graph's save: once per graph).
      graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
      if self._values is None or self._values[0] is not graph:
        self._values = (graph, self._variable.saved_values())
      return self._values[1][table][shard * rows:(shard + 1) * rows]

    return read

  def restore(self, restored_tensors, restored_shapes):
    del restored_shapes
    return self._variable.restore_blocks(restored_tensors)


tf.register_tensor_conversion_function(StackedVariable,
                                      tf_internals.dense_var_to_tensor)


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
    return part(self._restored(dtype), rows_per_shard(stacking, stacked_name),
                stacking.num_sparse_cores, names.index(self._table_name))


def create(owner, holder, stacking, store, stacked_tables, trained):
  """The tables' variables and the stacked variables of the engine `owner`.

  `stacked_tables`: the stacked tables' configs, and `store` their
  `variables_lib.TableStore` (the engine's); `trained`: the configs of the
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
      for slot, default in zip(variables_lib.slot_names(table), defaults):
        name = f"{prefix}/{slot}"
        inits.append(RestoredTable(stacking, table.name, restored[name])
                     if name in restored else default)
    slot_initializers[table.name] = inits
    tables.append(table)
  own_variables = store.like(tables, slot_initializers).create(holder)
  for value in restored.values():
    value.release()

  stacked = {}
  n = stacking.num_sparse_cores
  for config in stacked_tables:
    names = stacking.stacked_tables[config.name].table_names
    rows = rows_per_shard(stacking, config.name)
    members = [own_variables[t] for t in names]
    views = {}
    for slot in ["parameters"] + variables_lib.slot_names(config):
      name = config.name if slot == "parameters" else f"{config.name}/{slot}"
      view = StackedVariable(name, [m[slot] for m in members], rows, n)
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
  """What creates the tables' own variables (`variables_lib.TableStore`
  makes them its children); the engine does not track it, so checkpoints
  hold the stacked variables only."""
