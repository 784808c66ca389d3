"""A `CustomOptimizer`'s table on the host `TPUEmbeddingV2`.

* `CustomTable`: a `CustomOptimizer`'s `custom_computation` on the touched
  rows of a table and its slots (TensorFlow's ops), its hyperparameters'
  values for the step from `value_now`;
* `training_path`: a `CustomTable` for a table with a `CustomOptimizer`,
  else the host's usual path.
"""

from typing import List

import tensorflow as tf

from tfemb import optimizers
from tfemb import validation
from tfemb.host import commit
from tfemb.host import table_paths
from tfemb.host.paths import Pending
from tfemb.host.paths import TablePath
from tfemb.host.row_reads import gather_rows


def value_now(x) -> tf.Tensor:
  """A float32 parameter's value for this step (a callable is called)."""
  return tf.cast(x() if callable(x) else x, tf.float32)


class CustomTable(TablePath):
  """A table trained by a `CustomOptimizer`: its `custom_computation(
  gradient, embedding_table, slot_variables, learning_rate,
  hyperparameters)` on the rows the step touched, each slot's rows beside
  them (a 1-D slot: one value per row), the step's checked learning rate
  and the hyperparameters (callables are called once per step).

  A `tfemb.host.paths.TablePath` over an `OpsTable`: its lookup and row
  gradients, and its own `prepare` (and no staging: this `prepare`
  computes where the step runs). As every path's `prepare`, it computes under the
  step's lock from the rows as they are now and writes nothing: the step
  writes the new rows and slots once every table's are computed and
  finite. In a graph, the check of their values waits for every op of the
  computation, so that a failing assert in it stops the step before any
  write."""

  def __init__(self, table, variables, remap=None):
    self.table = table
    self.variables = variables
    self._rows = table_paths.OpsTable(table, variables, remap)

  def lookup(self, members):
    return self._rows.lookup(members)

  def feature_rows(self, batch):
    return self._rows.feature_rows(batch)

  def row_gradients(self, batch, entry_grads, raising):
    return self._rows.row_gradients(batch, entry_grads, raising)

  def prepare(self, batch, ids, grads, lr, global_batch: bool,
              staged: None = None) -> Pending:
    del batch, global_batch, staged  # the rows are read again, under the lock
    names = optimizers.slot_names(self.table.optimizer)
    computed = []
    created = commit.created_by(
        lambda: computed.extend(self._compute(names, ids, grads, lr)))
    finite = tf.reduce_all([validation.all_finite(v) for v in computed])
    with tf.control_dependencies(created):
      finite = tf.identity(finite)

    def write():
      for name, value in zip(names, computed[1:]):
        self.variables[name].scatter_update(tf.IndexedSlices(value, ids))
      self.variables["parameters"].scatter_update(
          tf.IndexedSlices(computed[0], ids))

    return Pending(finite, write)

  def _compute(self, names, ids, grads, lr) -> List[tf.Tensor]:
    """The new rows and slots of rows `ids`, checked against the rows'."""
    opt = self.table.optimizer
    rows = gather_rows(self.variables["parameters"], ids)
    slots = [gather_rows(self.variables[n], ids) for n in names]
    result = opt.custom_computation(
        grads, rows, slots, lr, [value_now(h) for h in opt.hyperparameters])
    result = list(result) if isinstance(result, (list, tuple)) else [result]
    expected = [rows] + slots
    if len(result) != len(expected):
      raise ValueError(
          f"Table {self.table.name!r}: custom_computation returned "
          f"{len(result)} tensor(s); expected {len(expected)} (the table's "
          f"rows, then the slots {names}).")
    checked = []
    for what, got, want in zip(["the table"] + names, result, expected):
      got = tf.convert_to_tensor(got)
      if got.dtype != want.dtype or not got.shape.is_compatible_with(
          want.shape):
        raise ValueError(
            f"Table {self.table.name!r}: custom_computation returned "
            f"{got.dtype.name} {got.shape} for {what}; expected "
            f"{want.dtype.name} {want.shape}.")
      # In a graph the rows are counted when the step runs: checked there,
      # before any table of the step is written.
      checked.append(_same_shape(got, want, self.table.name, what))
    return checked


def _same_shape(got: tf.Tensor, want: tf.Tensor, table: str,
                what: str) -> tf.Tensor:
  """`got`, once its run-time shape is `want`'s."""
  check = tf.debugging.assert_equal(
      tf.shape(got), tf.shape(want), summarize=8, message=(
          f"Table {table!r}: custom_computation returned a shape for {what} "
          f"other than the shape of its rows (x: returned, y: expected); no "
          "table was updated."))
  with tf.control_dependencies([check]):
    return tf.identity(got)


def training_path(table, variables, partitioned: bool, options, remap):
  """A `CustomTable` for a CustomOptimizer, else the host's usual path."""
  if optimizers.is_custom(table.optimizer):
    return CustomTable(table, variables, remap)
  return table_paths.training_path(table, variables, partitioned, options,
                                   remap)
