"""Initializing big tables in blocks of rows.

`tf.Variable(initial_value=initializer(shape))` builds the whole initial
value first: a truncated normal over a table makes two or three
table-sized temporaries (the samples, `* stddev`, `+ mean`) beside the
variable, and TensorFlow's CPU allocator keeps that memory for the life of
the process. For a 100M x 16 table that is 13-19 GB on top of its 6.4 GB.

A table whose initializer draws every element independently (TensorFlow's
unseeded `TruncatedNormal`, `RandomNormal`, `RandomUniform`, and scalar
`Constant`, `Zeros`, `Ones`, which every slot uses) is instead created
uninitialized and filled in place, `BLOCK_BYTES` of rows at a time, by
resource scatters: the values have the same distribution, and the peak
memory is the table plus one block. So is a table of TensorFlow's
`RowIdInitializer`, each block from its first row's id on: the values are
exactly TensorFlow's. Any other initializer (seeded, a callable) is called
once on the full shape, as TensorFlow does, so its values are exactly
TensorFlow's.

A checkpoint's value restored as a table is created is the variable's own
initial value for a plain variable (no copy); a column view of an
interleaved table (`tfemb.interleaved_tables`) is written from the whole
saved tensor, once: the peak is the storage plus that tensor. (Reading it
in blocks of rows through `ShardInfo` slices does not help: TensorFlow's
bundle reader reads the whole saved tensor for each slice of a tensor
saved unsliced.)
"""

import abc
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import init_ops_v2  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.trackable import base as trackable  # pylint: disable=g-direct-tensorflow-import

from tfemb.sparsecore_configs import RowIdInitializer

BLOCK_BYTES = 64 << 20  # rows initialized per scatter: 64 MiB of them

_RANDOM = (init_ops_v2.TruncatedNormal, init_ops_v2.RandomNormal,
           init_ops_v2.RandomUniform)
_CONSTANT = (init_ops_v2.Constant, init_ops_v2.Zeros, init_ops_v2.Ones)


class FillsInBlocks(abc.ABC):
  """An initializer that writes a big table's blocks of rows itself
  (`fill_in_blocks` hands it the table): the SparseCore's
  `tfemb.sparsecore.trained_config.TableInitializer`."""

  @property
  @abc.abstractmethod
  def elementwise(self) -> bool:
    """Whether blocks of rows make the table's values (or their law)."""

  @abc.abstractmethod
  def fill_in_blocks(self, write_rows: Callable[[int, tf.Tensor], Any],
                     shape, dtype, rows_per_block: int) -> None:
    """Writes the table's values with `write_rows(first row, rows)`, about
    `rows_per_block` rows at a time."""


def is_elementwise(initializer) -> bool:
  """True if rows written block by block make the initializer's table:
  rows of its law, or (`RowIdInitializer`) its very values."""
  if type(initializer) is RowIdInitializer:  # pylint: disable=unidiomatic-typecheck
    return True  # `from_row` gives each block its ids
  if isinstance(initializer, FillsInBlocks):  # fills itself (SparseCore)
    return initializer.elementwise
  if type(initializer) in _RANDOM:  # pylint: disable=unidiomatic-typecheck
    return initializer.seed is None
  if type(initializer) in _CONSTANT:  # pylint: disable=unidiomatic-typecheck
    return np.ndim(getattr(initializer, "value", 0)) == 0
  return False


def is_restored(initializer) -> bool:
  """True for the initial value TensorFlow passes when a checkpoint
  restores a variable as it is created."""
  return isinstance(initializer, trackable.CheckpointInitialValueCallable)


def block_rows(initializer, shape, dtype=tf.float32) -> Optional[int]:
  """Rows per block if `shape` should be filled in blocks, else None."""
  rows, dim = shape
  row_bytes = max(1, dim * tf.as_dtype(dtype).size)
  if (not tf.executing_eagerly() or rows * row_bytes <= BLOCK_BYTES or
      not is_elementwise(initializer)):
    return None
  return max(1, BLOCK_BYTES // row_bytes)


def uninitialized(shape, dtype) -> Callable[[], tf.Tensor]:
  """An initial value that allocates the table without writing it."""
  return lambda: tf.raw_ops.Empty(shape=shape, dtype=dtype, init=False)


def scatter_rows(variable: tf.Variable, start: int, rows: tf.Tensor):
  """Writes `rows` into rows [start, start + len(rows)) of `variable`."""
  end = start + int(rows.shape[0])
  variable.scatter_update(
      tf.IndexedSlices(rows, tf.range(start, end, dtype=tf.int64)))


def from_row(initializer, start: int):
  """The initializer of the rows from `start` on."""
  if type(initializer) is RowIdInitializer:  # pylint: disable=unidiomatic-typecheck
    return RowIdInitializer(offset=initializer.offset + start)
  return initializer


def fill_in_blocks(write_rows: Callable[[int, tf.Tensor], Any], shape, dtype,
                   initializer, rows_per_block: int):
  """Writes `initializer` values of a table of `shape`, one block of rows at
  a time, in place, with `write_rows(start, block)`: `scatter_rows` for a
  variable (which holds the only reference to its buffer), a column view's
  `assign_rows` (`tfemb.interleaved_tables`). A `FillsInBlocks`
  initializer (`tfemb.sparsecore.trained_config.TableInitializer`) writes
  its own blocks."""
  if isinstance(initializer, FillsInBlocks):
    initializer.fill_in_blocks(write_rows, shape, dtype, rows_per_block)
    return
  rows, dim = shape
  for start in range(0, rows, rows_per_block):
    end = min(rows, start + rows_per_block)
    block = from_row(initializer, start)((end - start, dim), dtype=dtype)
    write_rows(start, block)
