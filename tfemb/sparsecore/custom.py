"""The SparseCore's own numbers on the host: what `TPUEmbeddingV2` sends.

* `host_optimizer`: TF 2.21's `TPUEmbeddingV2.apply_gradients` passes
  neither the gradient clipping (`clipvalue`) nor the weight clipping
  (`clip_weight_min` / `clip_weight_max`) to the SparseCore ops, so the host
  trains with a copy of the optimizer without them (and says so once per
  table);
* `check_weight_decay`: TF's constructor refuses weight decay;
* `CustomTable`: a `CustomOptimizer`'s `custom_computation` on the touched
  rows of a table and its slots (TensorFlow's ops).
"""

import copy
from typing import Any, List

from absl import logging
import tensorflow as tf

from tfemb import optimizers
from tfemb import validation
from tfemb.host import step
from tfemb.host import tables as table_paths
from tfemb.host.paths import Pending
from tfemb.host.variables import gather_rows


def check_weight_decay(tables: List[Any]) -> None:
  """TensorFlow's `TPUEmbeddingV2.__init__`: no weight decay yet."""
  for table in tables:
    opt = table.optimizer
    if opt is None or optimizers.is_custom(opt):
      continue
    if (opt.weight_decay_factor is not None or
        opt.multiply_weight_decay_factor_by_learning_rate is not None):
      raise NotImplementedError(
          "weight_decay_factor and"
          " multiply_weight_decay_factor_by_learning_rate are not supported"
          f" yet. But found in table {table.name} setting.")


def host_optimizer(table) -> Any:
  """The table's optimizer as the SparseCore applies it: without gradient
  or weight clipping (a copy; the user's object is unchanged)."""
  opt = table.optimizer
  if opt is None or optimizers.is_custom(opt):
    return opt
  ignored = [name for name, value in (
      ("clipvalue", (opt.clip_gradient_min, opt.clip_gradient_max)),
      ("clip_weight_min", opt.clip_weight_min),
      ("clip_weight_max", opt.clip_weight_max)) if value not in (None, (None,
                                                                      None))]
  if not ignored:
    return opt
  logging.warning(
      "Table %r: %s has no effect on a SparseCore (TensorFlow's "
      "TPUEmbeddingV2 does not pass it to the SparseCore's update); the "
      "host ignores it too.", table.name, " and ".join(ignored))
  opt = copy.copy(opt)
  opt.clip_gradient_min = opt.clip_gradient_max = None
  opt.clip_weight_min = opt.clip_weight_max = None
  return opt


def value_now(x) -> tf.Tensor:
  """A float32 parameter's value for this step (a callable is called)."""
  return tf.cast(x() if callable(x) else x, tf.float32)


class CustomTable(table_paths.OpsTable):
  """A table trained by a `CustomOptimizer`: its `custom_computation(
  gradient, embedding_table, slot_variables, learning_rate,
  hyperparameters)` on the rows the step touched, each slot's rows beside
  them (a 1-D slot: one value per row), the step's checked learning rate
  and the hyperparameters (callables are called once per step).

  A `tfemb.host.paths.TablePath`: `OpsTable`'s lookup and row gradients,
  and its own `prepare`. As every path's `prepare`, it computes under the
  step's lock from the rows as they are now and writes nothing: the step
  writes the new rows and slots once every table's are computed and
  finite. In a graph, the check of their values waits for every op of the
  computation, so that a failing assert in it stops the step before any
  write."""

  def prepare(self, batch, ids, grads, lr, global_batch: bool) -> Pending:
    del batch, global_batch  # the rows are read again, under the lock
    names = optimizers.slot_names(self.table.optimizer)
    computed = []
    created = step.created_by(
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

