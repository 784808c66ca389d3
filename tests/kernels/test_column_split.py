"""Saving an interleaved table without a second copy (`column_split.cc`).

A save splits the table's `[rows, parts x dim]` buffer into `[parts, rows,
dim]` blocks, moving the rows out (its pages given back), and the rows come
back when the blocks' last tensor is gone, or at once when anything else
touches the table first. Expected values are numpy's reshape of the table.
"""

import gc

import numpy as np
import pytest
import tensorflow as tf

import reference
import tfemb
from tfemb import interleaved_tables
from tfemb.kernels import fused_ops

PARTS, DIM = 3, 8
BIG = 98304  # rows: 9 MiB, at least three whole 2 MiB pages to give back


def _storage(rows, seed=0):
  values = np.random.default_rng(seed).normal(
      size=(rows, PARTS * DIM)).astype(np.float32)
  storage = tf.Variable(values)
  # As after training: sparse access puts the variable in copy-on-read mode
  # (its dense reads copy, so nothing aliases its buffer).
  tf.raw_ops.ResourceGather(resource=storage.handle, indices=[0],
                            dtype=tf.float32)
  return storage, values


def _blocks(values):
  rows = values.shape[0]
  return values.reshape(rows, PARTS, DIM).transpose(1, 0, 2)


def _buffer(storage):
  """The storage's buffer as TensorFlow's own read sees it (no rejoin)."""
  return tf.raw_ops.ReadVariableOp(resource=storage.handle,
                                   dtype=tf.float32).numpy()


@pytest.mark.parametrize("rows", [5, BIG])
def test_split_gives_the_parts_and_the_rows_come_back_at_the_end(rows):
  storage, values = _storage(rows)
  blocks = fused_ops.split_columns(storage, PARTS)
  np.testing.assert_array_equal(blocks.numpy(), _blocks(values))
  again = fused_ops.split_columns(storage, PARTS)  # a second view's call
  np.testing.assert_array_equal(again.numpy(), _blocks(values))
  del blocks, again
  gc.collect()
  np.testing.assert_array_equal(_buffer(storage), values)


def test_the_rows_move_out_while_the_blocks_live():
  storage, values = _storage(BIG)
  blocks = fused_ops.split_columns(storage, PARTS)
  during = _buffer(storage)
  assert np.count_nonzero(during) < values.size // 2  # pages given back
  del blocks
  np.testing.assert_array_equal(_buffer(storage), values)


def test_a_shared_buffer_is_copied_and_keeps_its_rows():
  values = np.random.default_rng(1).normal(
      size=(BIG, PARTS * DIM)).astype(np.float32)
  storage = tf.Variable(values)  # never read sparsely: reads alias it
  alias = storage.read_value()
  blocks = fused_ops.split_columns(storage, PARTS)
  np.testing.assert_array_equal(blocks.numpy(), _blocks(values))
  np.testing.assert_array_equal(_buffer(storage), values)
  np.testing.assert_array_equal(alias.numpy(), values)


def test_a_write_while_the_blocks_live_is_kept_after_their_end():
  storage, values = _storage(BIG)
  blocks = fused_ops.split_columns(storage, PARTS)
  new = np.full((4, DIM), 7.0, np.float32)
  fused_ops.write_columns(storage, DIM, new, row=10)  # rejoins first
  expected = values.copy()
  expected[10:14, DIM:2 * DIM] = new
  np.testing.assert_array_equal(_buffer(storage), expected)
  np.testing.assert_array_equal(blocks.numpy(), _blocks(values))  # as split
  del blocks
  np.testing.assert_array_equal(_buffer(storage), expected)


def test_a_read_while_the_blocks_live_sees_the_rows():
  storage, values = _storage(BIG)
  blocks = fused_ops.split_columns(storage, PARTS)
  np.testing.assert_array_equal(
      fused_ops.read_columns(storage, 2 * DIM, DIM).numpy(),
      values[:, 2 * DIM:])
  del blocks
  np.testing.assert_array_equal(_buffer(storage), values)


def test_write_columns_checks_the_range():
  storage, values = _storage(5)
  with pytest.raises(tf.errors.InvalidArgumentError, match="rows"):
    fused_ops.write_columns(storage, 2 * DIM, np.ones((5, DIM + 1),
                                                       np.float32))
  with pytest.raises(tf.errors.InvalidArgumentError, match="rows"):
    fused_ops.write_columns(storage, 0, np.ones((2, DIM), np.float32), row=4)
  np.testing.assert_array_equal(_buffer(storage), values)


def test_training_during_a_save_keeps_the_update():
  """A save's tensors still alive (e.g. held by an exception's traceback)
  while the table trains: the step sees the table's rows, and the end of
  the blocks does not undo the update."""
  start = np.arange(6 * 4, dtype=np.float32).reshape(6, 4) / 10
  table = tfemb.TableConfig(6, 4, name="t",
                            initializer=tf.constant_initializer(start))
  with tfemb.options.use(interleaved_slots=True):
    embedding = tfemb.TPUEmbedding(
        {"f": tfemb.FeatureConfig(table)},
        tfemb.Adagrad(learning_rate=0.5, initial_accumulator_value=1.0))
  embedding.build()
  view = embedding._variables["t"]["parameters"]  # pylint: disable=protected-access
  assert isinstance(view, interleaved_tables.ColumnView)
  saved = view._serialize_to_tensors()  # pylint: disable=protected-access
  held = next(iter(saved.values())).tensor  # what a save writes
  np.testing.assert_array_equal(held.numpy(), start)

  embedding.enqueue({"f": tf.constant([2, 2, 5])}, training=True)
  activations = embedding.dequeue()
  np.testing.assert_array_equal(activations["f"].numpy(), start[[2, 2, 5]])
  embedding.apply_gradients({"f": tf.ones([3, 4])})
  oracle = reference.Table(start, "adagrad",
                           {"initial_accumulator_value": 1.0})
  oracle.apply(reference.row_gradients(
      reference.contributions([[2], [2], [5]], "sum", np.ones((3, 4)))), 0.5)
  expected = oracle.w
  del saved, held
  gc.collect()
  np.testing.assert_allclose(view.numpy(), expected, rtol=1e-6)
  np.testing.assert_allclose(
      embedding._variables["t"]["accumulators"].numpy()[[2, 5]],  # pylint: disable=protected-access
      oracle.slots["accumulators"][[2, 5]])
