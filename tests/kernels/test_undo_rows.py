"""TfembApplyRows computes each update once, in place, all or nothing, and
keeps the rows as they were; TfembRestoreRows puts them back.

Two tables stacked in one variable (one part each) and Adagrad: where one
part's update would overflow, neither part changes; a finite update gives
the numpy reference's rows, and its undo rows are the old ones, which the
restore writes back unless told to keep the update. Separate slot variables
and an interleaved storage ([rows, (1 + slots) x dim]) alike.
"""

import numpy as np
import pytest
import tensorflow as tf

import reference
from tfemb.kernels import fused_ops

ROWS, DIM, LR = 10, 4, 0.1
ADAGRAD = dict(rule="Adagrad", hyperparameters=[],
               clip_gradient=[-np.inf, np.inf],
               clip_weight=[-np.inf, np.inf], weight_decay_factor=0.0,
               multiply_weight_decay_by_lr=False)
IDS = ([7, 1, 4], [0, 9])  # part "t", part "u": disjoint rows


def _start(seed):
  rng = np.random.default_rng(seed)
  w = rng.normal(size=(ROWS, DIM)).astype(np.float32)
  acc = rng.uniform(0.1, 1.0, size=(ROWS, DIM)).astype(np.float32)
  grads = [rng.normal(size=(len(i), DIM)).astype(np.float32) for i in IDS]
  return w, acc, grads


class _Table:
  """The stacked variable, with the accumulator beside it or apart."""

  def __init__(self, w, acc, interleaved):
    self.interleaved = interleaved
    if interleaved:
      self.vars = [tf.Variable(np.concatenate([w, acc], axis=1))]
    else:
      self.vars = [tf.Variable(w), tf.Variable(acc)]

  def inputs(self):
    return dict(parameters=self.vars[0].handle,
                slots=[v.handle for v in self.vars[1:]],
                interleaved=self.interleaved, table_names=["t", "u"])

  def values(self):
    """(parameters, accumulators) as numpy."""
    if self.interleaved:
      both = self.vars[0].numpy()
      return both[:, :DIM], both[:, DIM:]
    return self.vars[0].numpy(), self.vars[1].numpy()

  def apply(self, grads):
    lib = fused_ops._library()  # pylint: disable=protected-access
    finite, undo = lib.tfemb_apply_rows(
        ids=[tf.constant(i, tf.int64) for i in IDS],
        gradients=[tf.constant(g) for g in grads],
        learning_rate=tf.constant(LR), **self.inputs(), **ADAGRAD)
    return [bool(f) for f in finite], undo

  def restore(self, undo, keep):
    lib = fused_ops._library()  # pylint: disable=protected-access
    lib.tfemb_restore_rows(ids=[tf.constant(i, tf.int64) for i in IDS],
                           undo=undo, keep=tf.constant(keep), **self.inputs())


def _adagrad(w, acc, grads):
  """The reference's Adagrad (tests/reference.py) on the touched rows."""
  w, acc = w.astype(np.float64), acc.astype(np.float64)
  for ids, g in zip(IDS, grads):
    for i, row in zip(ids, g.astype(np.float64)):
      w[i], s = reference.update_row("adagrad", {}, w[i], row,
                                     {"accumulators": acc[i]}, LR)
      acc[i] = s["accumulators"]
  return w, acc


@pytest.fixture(params=[False, True], ids=["slot_variables", "interleaved"])
def interleaved(request):
  return request.param


def test_a_finite_update_is_the_rule_and_keeps_the_old_rows(interleaved):
  w, acc, grads = _start(0)
  table = _Table(w, acc, interleaved)
  finite, undo = table.apply(grads)
  assert finite == [True, True]
  want_w, want_acc = _adagrad(w, acc, grads)
  got_w, got_acc = table.values()
  np.testing.assert_allclose(got_w, want_w, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got_acc, want_acc, rtol=1e-5, atol=1e-6)
  touched = IDS[0] + IDS[1]  # the parts' rows, one after the other
  np.testing.assert_array_equal(
      undo.numpy(), np.concatenate([w[touched], acc[touched]], axis=1))


def test_restore_puts_back_the_old_rows_unless_kept(interleaved):
  w, acc, grads = _start(1)
  table = _Table(w, acc, interleaved)
  _, undo = table.apply(grads)
  updated = [v.copy() for v in table.values()]
  table.restore(undo, keep=True)
  for got, want in zip(table.values(), updated):
    np.testing.assert_array_equal(got, want)
  table.restore(undo, keep=False)
  for got, want in zip(table.values(), (w, acc)):
    np.testing.assert_array_equal(got, want)
  # Twice is the same (a restore after the op's own).
  table.restore(undo, keep=False)
  for got, want in zip(table.values(), (w, acc)):
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("bad_part", [0, 1])
def test_an_overflowing_part_leaves_both_parts_unchanged(interleaved,
                                                         bad_part):
  w, acc, grads = _start(2)
  grads[bad_part][-1, 2] = 1e30  # its square overflows the accumulator
  table = _Table(w, acc, interleaved)
  finite, undo = table.apply(grads)
  assert finite == [bad_part != 0, bad_part != 1]
  for got, want in zip(table.values(), (w, acc)):
    np.testing.assert_array_equal(got, want)
  assert undo.shape == (len(IDS[0]) + len(IDS[1]), 2 * DIM)
