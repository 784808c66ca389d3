"""The host `TPUEmbeddingV2`'s tables: configs of the stacked tables, and
of each table's own variable inside its stack.

TensorFlow keeps the tables of a stack in one variable (`tfemb.sparsecore.
layout`): SparseCore shard s holds rows [s * T, (s + 1) * T), and inside
it each table's P = padded rows / N rows, table after table. The host keeps
each table's part in a variable of its own, `[N * P, padded dim]`: its
rows of shard 0, then of shard 1, and so on (`layout.table_rows`). So each
table is trained as the first generation trains a table (its own
variable, lock and update, a lookup waiting only for its own table's
last update), and the stacked variable is a view over its tables'
(`tfemb.sparsecore.stacked_variables`), read, assigned and saved in
TensorFlow's layout.

* `stacked_config`: one `TableConfig` per stacked table (TensorFlow's
  padded shape and the SparseCore's optimizer; checkpoint checks), and the
  configuration the host trains: one table per user table, of its own
  variable's shape, with the stack's optimizer; `remap`: where a table's
  ids sit in its variable.
* `join`, `split`: a stacked value from its tables' values, and back.
* `TableInitializer`, `RestoredTable`: a table variable's initial value,
  from the table's initializer or from a checkpoint's stacked value.
* `LayoutsTrackable`: the layouts a checkpoint holds, as TensorFlow saves
  them.
"""

import copy
import functools
from typing import Any, Callable, List, Sequence

import tensorflow as tf
from tensorflow.python.tpu import tpu_embedding_v3_utils  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.trackable import base as trackable  # pylint: disable=g-direct-tensorflow-import

from tfemb import initialization
from tfemb import resolution
from tfemb.host import tables as table_paths
from tfemb.sparsecore import custom
from tfemb.sparsecore import layout as layout_lib


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


def remap(stacking, table_name: str, vocabulary_size: int):
  """Where the ids of `table_name` sit in its own variable
  (`layout.table_rows`), for the host engine's paths."""
  layout = stacking.tables[table_name]
  n = stacking.num_sparse_cores
  return table_paths.Remap(
      vocabulary_size,
      (layout.padded_vocabulary_size, n, layout.padded_vocabulary_size // n,
       0, layout.rotation),
      functools.partial(layout_lib.table_rows, stacking, table_name))


class TableInitializer:
  """The initial value of a table's own variable: the table's initializer
  at the rows of its ids (`layout.table_rows`), padding rows and columns
  zero.

  Where the table's initializer draws its elements independently
  (`tfemb.initialization`), a big table is filled in place block by block
  (`fill_in_blocks`), as the first generation fills its tables."""

  def __init__(self, stacking, table):
    self._stacking = stacking
    self._table = table

  @property
  def elementwise(self) -> bool:
    """Whether blocks of rows make the table's values (or their law)."""
    return initialization.is_elementwise(self._table.initializer)

  def _ids(self, start: int, end: int, shape, dtype) -> tf.Tensor:
    """The values of ids [start, end), padded to the variable's width."""
    table = self._table
    value = initialization.from_row(table.initializer, start)(
        (end - start, table.dim), dtype=dtype)
    return tf.pad(value, [[0, 0], [0, shape[1] - table.dim]])

  def __call__(self, shape, dtype=tf.float32, **unused_kwargs):
    table = self._table
    rows = layout_lib.table_rows(
        self._stacking, table.name,
        tf.range(table.vocabulary_size, dtype=tf.int64))
    return tf.tensor_scatter_nd_update(
        tf.zeros(shape, dtype), rows[:, None],
        self._ids(0, table.vocabulary_size, shape, dtype))

  def fill_in_blocks(self, write_rows: Callable[[int, tf.Tensor], Any],
                     shape, dtype, rows_per_block: int):
    """Writes the value with `write_rows(first row, rows)`, about
    `rows_per_block` rows at a time: zeros, then blocks of ids. The ids of
    a block with one residue modulo the SparseCore count sit in
    consecutive rows (one shard's), so a block is one write per shard."""
    initialization.fill_in_blocks(write_rows, shape, dtype,
                                  tf.zeros_initializer(), rows_per_block)
    n = self._stacking.num_sparse_cores
    vocabulary = self._table.vocabulary_size
    ids_per_block = max(n, rows_per_block // n * n)
    for start in range(0, vocabulary, ids_per_block):
      end = min(vocabulary, start + ids_per_block)
      block = self._ids(start, end, shape, dtype)
      firsts = layout_lib.table_rows_numpy(
          self._stacking, self._table.name, range(start, min(end, start + n)))
      for residue, first in enumerate(firsts):
        write_rows(int(first), block[residue::n])


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


def stacked_config(config, stacking):
  """`(stacked tables, trained)`.

  `stacked tables`: one TableConfig per stacked table (TensorFlow's padded
  shape, the SparseCore's optimizer: the first table's, as TensorFlow
  stacks them), for the checks of checkpoints. `trained`: the
  configuration the host engine's parts train, with the user's features
  and one table per user table: its own variable's shape (`[N * P, padded
  dim]`), the stack's optimizer, a `TableInitializer`, and the stacked
  table's name (`stacked_table_name`). The user's configs are not
  changed."""
  by_name = {t.name: t for t in config.tables}
  stacked_tables, trained = [], {}
  for name, stacked in stacking.stacked_tables.items():
    members = [by_name[n] for n in stacked.table_names]
    # Every member's, for its warning of ignored options; the first's is
    # the stack's.
    optimizer = [custom.host_optimizer(m) for m in members][0]
    table = copy.copy(members[0])
    table.name = name
    table.vocabulary_size, table.dim = stacked.shape
    table.optimizer = optimizer
    stacked_tables.append(table)
    for member in members:
      layout = stacking.tables[member.name]
      own = copy.copy(member)
      own.vocabulary_size = layout.padded_vocabulary_size
      own.dim = layout.padded_dim
      own.optimizer = optimizer
      own.initializer = TableInitializer(stacking, member)
      own.stacked_table_name = name
      trained[member.name] = own
  tables = [trained[t.name] for t in config.tables]
  features = []
  for feature in config.features:
    own_feature = copy.copy(feature)
    own_feature.table = trained[feature.table.name]
    features.append(own_feature)
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
