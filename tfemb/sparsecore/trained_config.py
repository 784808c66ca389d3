"""What the host `TPUEmbeddingV2` trains: the configs of the stacked
tables, and of each table's own variable inside its stack.

TensorFlow keeps the tables of a stack in one variable (`tfemb.sparsecore.
table_stacking`): SparseCore shard s holds rows [s * T, (s + 1) * T), and
inside it each table's P = padded rows / N rows, table after table. The
host keeps each table's part in a variable of its own, `[N * P, padded
dim]`: its rows of shard 0, then of shard 1, and so on
(`table_stacking.table_rows`). So each table is trained as the first
generation trains a table (its own variable, lock and update, a lookup
waiting only for its own table's last update), and the stacked variable is
a view over its tables' (`tfemb.sparsecore.stacked_variable`), read,
assigned and saved in TensorFlow's layout.

* `stacked_config`: one `TableConfig` per stacked table (TensorFlow's
  padded shape and the SparseCore's optimizer; checkpoint checks), and the
  configuration the host trains: one table per user table, of its own
  variable's shape, with the stack's optimizer;
* `TableInitializer`: a table variable's initial value, from the table's
  initializer;
* `remap`: where a table's ids sit in its variable.
"""

import copy
import functools
from typing import Any, Callable

import tensorflow as tf

from tfemb import initialization
from tfemb import resolution
from tfemb.host import table_paths
from tfemb.sparsecore import applied_optimizer
from tfemb.sparsecore import table_stacking


def remap(stacking, table_name: str, vocabulary_size: int):
  """Where the ids of `table_name` sit in its own variable
  (`table_stacking.table_rows`), for the host engine's paths."""
  layout = stacking.tables[table_name]
  n = stacking.num_sparse_cores
  return table_paths.Remap(
      vocabulary_size,
      (layout.padded_vocabulary_size, n, layout.padded_vocabulary_size // n,
       0, layout.rotation),
      functools.partial(table_stacking.table_rows, stacking, table_name))


class TableInitializer(initialization.FillsInBlocks):
  """The initial value of a table's own variable: the table's initializer
  at the rows of its ids (`table_stacking.table_rows`), padding rows and columns
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
    rows = table_stacking.table_rows(
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
      firsts = table_stacking.table_rows_numpy(
          self._stacking, self._table.name, range(start, min(end, start + n)))
      for residue, first in enumerate(firsts):
        write_rows(int(first), block[residue::n])


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
    optimizer = [applied_optimizer.host_optimizer(m) for m in members][0]
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
      tables, [t.stacked_table_name for t in tables])
