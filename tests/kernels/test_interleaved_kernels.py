"""The fused kernels on a table whose slots sit beside its parameters.

One variable of [rows, (1 + slots) x dim] (the parameters first, then each
slot in the optimizer's order) instead of one per slot, reached through a
column view of its parameters (`tfemb.interleaved_tables.ColumnView`), as
the host engine holds it. Expected numbers come from the numpy reference
(`tests/reference.py`), row by row.
"""

import numpy as np
import pytest
import tensorflow as tf

import helpers
import reference
import tfemb
from tfemb import interleaved_tables
from tfemb.kernels import fused_ops

VOCAB, DIM = 9, 5
CASES = helpers.LAZY_OPTIMIZERS


def _table(case):
  return tfemb.TableConfig(VOCAB, DIM, optimizer=helpers.optimizer(case),
                           name="t")


def _parameters(storage):
  """The parameters' view of `storage`: its first DIM columns."""
  return {"parameters": interleaved_tables.ColumnView(storage, 0, DIM, "t",
                                                      True)}


def _start(case, rng):
  """Parameters and slots (slots > 0 where the rules take roots of them)."""
  table = _table(case)
  params = rng.normal(size=(VOCAB, DIM)).astype(np.float32) * 0.3
  slots = {n: rng.uniform(0.1, 0.9, size=(VOCAB, DIM)).astype(np.float32)
           for n in table.optimizer._slot_names()}  # pylint: disable=protected-access
  return table, params, slots


@pytest.mark.parametrize("case", CASES)
def test_update_of_interleaved_slots_follows_the_rule(case):
  rng = np.random.default_rng(CASES.index(case))
  table, params, slots = _start(case, rng)
  names = list(slots)
  storage = tf.Variable(np.concatenate([params] + [slots[n] for n in names],
                                       axis=1))
  ids = np.array([6, 0, 3, 8], np.int64)
  grads = rng.normal(size=(len(ids), DIM)).astype(np.float32) * 0.2
  lr = table.optimizer.learning_rate

  fused_ops.apply_rows(table, _parameters(storage), tf.constant(ids),
                        tf.constant(grads), tf.constant(lr, tf.float32))

  want_w = params.astype(np.float64)
  want_s = {n: s.astype(np.float64) for n, s in slots.items()}
  kind, p = helpers.reference_optimizer(case)
  for i, g in zip(ids, grads):
    w, s = reference.update_row(kind, p, want_w[i],
                                g.astype(np.float64),
                                {n: want_s[n][i] for n in names}, lr)
    want_w[i] = w
    for n in names:
      want_s[n][i] = s[n]
  got = storage.numpy()
  np.testing.assert_allclose(got[:, :DIM], want_w, rtol=1e-5, atol=1e-6)
  for k, n in enumerate(names):
    np.testing.assert_allclose(got[:, DIM * (k + 1):DIM * (k + 2)], want_s[n],
                               rtol=1e-5, atol=1e-6, err_msg=n)


def test_lookup_reads_the_parameter_columns_of_a_wider_variable():
  rng = np.random.default_rng(7)
  storage_np = rng.normal(size=(VOCAB, 3 * DIM)).astype(np.float32)
  storage = tf.Variable(storage_np)
  table = tfemb.TableConfig(VOCAB, DIM, name="t")
  a = np.array([4, 1, 4, 7], np.int64)
  b = np.array([1, 0], np.int64)

  unique, positions, rows = fused_ops.dedup_gather(
      table, _parameters(storage)["parameters"],
      [tf.constant(a), tf.constant(b)], ["a", "b"])

  np.testing.assert_array_equal(unique, [4, 1, 7, 0])  # first occurrences
  np.testing.assert_array_equal(positions, [0, 1, 0, 2, 1, 3])
  np.testing.assert_array_equal(rows, storage_np[np.concatenate([a, b]),
                                                 :DIM])


def test_a_variable_of_another_width_is_refused_and_left_alone():
  table = _table("adam")
  storage_np = np.ones((VOCAB, 2 * DIM), np.float32)  # Adam needs 3 x dim
  storage = tf.Variable(storage_np)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"Table \W*t\W*.*expected \[rows, 15\]"):
    fused_ops.apply_rows(table, _parameters(storage),
                          tf.constant([1], tf.int64),
                          tf.ones((1, DIM)), tf.constant(0.1))
  np.testing.assert_array_equal(storage.numpy(), storage_np)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"Table \W*t\W*.*shape \[9, 5\], got \[9,15\]"):
    fused_ops.dedup_gather(table, tf.Variable(np.ones((VOCAB, 3 * DIM),
                                                       np.float32)),
                            [tf.constant([1], tf.int64)], ["f"])
