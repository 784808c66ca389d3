"""`StackedVariable`: a stacked table as TensorFlow lays it out, over the
variables of its tables.

The host `TPUEmbeddingV2` keeps each table of a stack in a variable of its
own (`tfemb.sparsecore.trained_config`). A `StackedVariable` is
TensorFlow's stacked variable (or one of its slots) over them
(`tfemb.sparsecore.stacked_blocks` lays the rows out): read and assigned
whole, in TensorFlow's layout, and saved in a checkpoint under
TensorFlow's key as one tensor of the stacked shape, written slice by
slice straight from the tables' variables (no copy of the stack; a table
whose slots sit beside its parameters is split for the save, as
`tfemb.interleaved_tables` saves it). A checkpoint restores into it from a
stacked tensor saved whole or in slices; TensorFlow's classes restore its
value as they restore a variable. What it shares with an interleaved
table's column views is `tfemb.variable_view.VariableView`.
"""

from typing import Any, List, Sequence, Tuple

import tensorflow as tf
from tensorflow.python.distribute import device_util  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.trackable import base as trackable
from tensorflow.python.training.saving import saveable_object  # pylint: disable=g-direct-tensorflow-import

from tfemb import replicas
from tfemb import tf_internals
from tfemb import variable_view
from tfemb.sparsecore import stacked_blocks


class StackedVariable(variable_view.VariableView, trackable.Trackable):
  """A stacked variable `name` of its tables' variables `tables` (in the
  stack's order), each `[N * rows_per_shard[k], ...]`, laid out as
  `stacked_blocks.join` says: `[N * sum(rows_per_shard), ...]`.

  Reading it (`value`, `read_value`, `numpy`, `tf.convert_to_tensor`,
  indexing) gathers the blocks into one tensor; `assign` writes each
  table's blocks into its variable. Under a `MirroredStrategy`, `values`
  are the stacked variables of each replica's copies; with `chips` (under
  a TPU strategy, a host one here: each chip's device) they are the
  shards of rows each chip holds, as TensorFlow's sharded variable gives
  them, and `read_from_device` reads a chip's.
  """

  def __init__(self, name: str, tables: Sequence[Any],
               rows_per_shard: Sequence[int], num_shards: int,
               chips: Sequence[str] = ()):
    self._view_name = name
    self._tables = list(tables)
    self._rows = list(rows_per_shard)
    self._shards = num_shards
    self._chips = tuple(chips)
    inner = self._tables[0].shape[1:]
    self._shape = tf.TensorShape([num_shards * sum(self._rows)]).concatenate(
        inner)

  # --- what it is ---------------------------------------------------------

  @property
  def shape(self) -> tf.TensorShape:
    return self._shape

  def block_rows(self) -> List[Tuple[int, int]]:
    """`(table, rows)` of each block, in the stacked variable's row order:
    each shard holds a block of every table."""
    return [(k, rows) for _ in range(self._shards)
            for k, rows in enumerate(self._rows)]

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
    """One `StackedVariable` per copy of its tables' (mirrored) variables,
    or with `chips`, each chip's `ChipShard`."""
    if self._chips:
      return tuple(ChipShard(self, chip, len(self._chips))
                   for chip in range(len(self._chips)))
    copies = [replicas.copies(t) for t in self._tables]
    return tuple(StackedVariable(self._view_name, tables, self._rows,
                                 self._shards) for tables in zip(*copies))

  def read_from_device(self, device: str) -> tf.Tensor:
    """The rows the chip on `device` holds (TensorFlow's sharded
    variable's read of one device's shard)."""
    wanted = device_util.canonicalize(device)
    for chip, name in enumerate(self._chips):
      if device_util.canonicalize(name) == wanted:
        return self.values[chip].read_value()
    raise ValueError(f"{self.name}: no chip of its TPU is on {device}; its "
                     f"chips' devices are {list(self._chips)}.")

  def __repr__(self):
    return (f"<tfemb StackedVariable '{self.name}' shape={self.shape} "
            f"dtype={self.dtype.name}: {len(self._tables)} table(s) in "
            f"{self._shards} shard(s)>")

  # --- reading and writing ------------------------------------------------

  def value(self) -> tf.Tensor:
    return stacked_blocks.join(
        [tf.convert_to_tensor(t) for t in self._tables], self._rows,
        self._shards)

  def __getitem__(self, key):
    return self.value()[key]

  def _write_value(self, value: tf.Tensor):
    """`assign`'s write: each table's blocks into its variable."""
    parts = stacked_blocks.split(value, self._rows, self._shards)
    ops = [table.assign(part, read_value=False)
           for table, part in zip(self._tables, parts)]
    return tf.group([op for op in ops if op is not None])

  # --- checkpoints: TensorFlow's key, one tensor saved in slices ----------

  def _gather_saveables_for_checkpoint(self):
    return {trackable.VARIABLE_VALUE_KEY: self._saveable}

  def _saveable(self, name: str):
    return _StackedSaveable(self, name)

  def saved_values(self) -> List[tf.Tensor]:
    """Each table's value as a save writes it: eagerly, a table whose
    slots sit beside its parameters is split for the save
    (`ColumnView.saved_value`), any other read once."""
    return [t.saved_value() if isinstance(t, variable_view.SavedValue)
            else tf.convert_to_tensor(t) for t in self._tables]

  def restore_blocks(self, blocks: Sequence[tf.Tensor]):
    """Writes the blocks a restore read (in row order) into the tables."""
    n = len(self._tables)
    ops = [table.assign(tf.concat(list(blocks[k::n]), axis=0),
                        read_value=False)
           for k, table in enumerate(self._tables)]  # blocks: shard by shard
    return tf.group([op for op in ops if op is not None])


class ChipShard:
  """The rows of a stacked variable that chip `chip` of `chips` holds (a
  contiguous `1 / chips` of them, the chip's SparseCores' shards), read
  as a TPU's sharded variable's shard reads."""

  def __init__(self, stacked: StackedVariable, chip: int, chips: int):
    self._stacked = stacked
    self._rows = stacked.shape[0] // chips
    self._start = chip * self._rows
    self.name = f"{stacked.name}/chip_{chip}"

  @property
  def shape(self) -> tf.TensorShape:
    return tf.TensorShape([self._rows]).concatenate(self._stacked.shape[1:])

  @property
  def dtype(self) -> tf.DType:
    return self._stacked.dtype

  def value(self) -> tf.Tensor:
    return self._stacked.value()[self._start:self._start + self._rows]

  read_value = value

  def numpy(self):
    return self.value().numpy()

  def __array__(self, dtype=None):
    return self.numpy() if dtype is None else self.numpy().astype(dtype)


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
