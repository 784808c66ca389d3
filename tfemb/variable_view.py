"""A `tf.Variable`-like view over part of a larger storage.

Two of tfemb's variables are views: an interleaved table's `ColumnView`
(`tfemb.interleaved_tables`), some columns of one variable, and the
SparseCore's `StackedVariable` (`tfemb.sparsecore.stacked_variable`),
blocks of rows of several. `VariableView` is what they share, written once:
a variable's surface over a value that lives elsewhere (its name, its reads
as a tensor or an array, `assign` with `tf.Variable.assign`'s checks,
`assign_add` and `assign_sub`, an asynchronous checkpoint's copy), and the
interfaces other modules ask of a view:

* `saved_value()`: its value as a save writes it (`SavedValue`, which an
  inference export's other sources declare too);
* `interleaved_storage`: the one variable whose whole rows hold it (for
  the fused kernels and SavedModels; `storage_of`), None for a view of
  several variables.

A subclass gives `value()`, `shape`, `dtype`, `trainable`, `_view_name`
(TensorFlow's name, without ":0") and `_write_value(value)`.
"""

from typing import Any, Optional

import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops  # pylint: disable=g-direct-tensorflow-import


class SavedValue:
  """An object a save reads with `saved_value()` rather than as a
  variable: a `VariableView`, or an inference export's unstacked table
  (`tfemb.serving.sparsecore_export.UnstackedTable`)."""

  def saved_value(self) -> tf.Tensor:
    """The value, as the save writes it."""
    raise NotImplementedError


class VariableView(SavedValue):
  """A variable whose value is part of a larger storage (see the module's
  docstring): what a view is, its reads, its writes and its asynchronous
  checkpoint copy."""

  _view_name: str  # TensorFlow's name of the variable, without ":0"

  # --- what it is ---------------------------------------------------------

  @property
  def name(self) -> str:
    return self._view_name + ":0"

  def get_shape(self) -> tf.TensorShape:
    return self.shape

  @property
  def interleaved_storage(self) -> Optional[tf.Variable]:
    """The variable whose whole rows hold this view (an interleaved
    table's storage: the fused kernels take its rows, a SavedModel holds
    it); None for a view over several variables."""
    return None

  # --- reading ------------------------------------------------------------

  def value(self) -> tf.Tensor:
    raise NotImplementedError

  def read_value(self) -> tf.Tensor:
    return self.value()

  def numpy(self):
    return self.value().numpy()

  def __array__(self, dtype=None, copy=None):
    del copy  # always a copy: the values live in a larger storage
    return self.numpy() if dtype is None else self.numpy().astype(dtype)

  def _dense_var_to_tensor(self, dtype=None, name=None, as_ref=False):
    del name, as_ref
    if dtype is not None and dtype != self.dtype:
      raise ValueError(f"{self.name} is {self.dtype.name}, not {dtype}")
    return self.value()

  def saved_value(self) -> tf.Tensor:
    """The value as a checkpoint save writes it: a read, unless the view
    saves otherwise."""
    return self.value()

  # --- writing ------------------------------------------------------------

  def _write_value(self, value: tf.Tensor) -> Any:
    """Writes `value` (of the view's dtype and shape) into the storage;
    returns what a write returns (an op, or None eagerly)."""
    raise NotImplementedError

  def assign(self, value, use_locking=None, name=None, read_value=True):
    """Writes `value`, refused as `tf.Variable.assign` refuses it where its
    shape differs; returns the new value, or the write."""
    del use_locking, name
    value = tf.convert_to_tensor(value, self.dtype)
    if not value.shape.is_compatible_with(self.shape):
      raise ValueError(f"Cannot assign a value of shape {value.shape} to "
                       f"{self.name} of shape {self.shape}.")
    op = self._write_value(value)
    if read_value:
      with tf.control_dependencies([op]):
        return self.value()
    return op

  def assign_add(self, delta, use_locking=None, name=None, read_value=True):
    return self.assign(self.value() + delta, read_value=read_value)

  def assign_sub(self, delta, use_locking=None, name=None, read_value=True):
    return self.assign(self.value() - delta, read_value=read_value)

  # --- an asynchronous checkpoint's copy ----------------------------------

  def _copy_value(self) -> tf.Tensor:
    """What an asynchronous save copies: the value."""
    return self.value()

  def _copy_trackable_to_cpu(self, object_map):
    """An async save's copy (`tf.train.CheckpointOptions(
    experimental_enable_async_checkpoint=True)`): a variable of the view's
    shape made at the first such save, into which every save copies the
    value before training goes on; the save's thread writes the copy, as
    it does for TensorFlow's variables."""
    if self not in object_map:
      object_map[self] = resource_variable_ops.UninitializedVariable(
          trainable=self.trainable, shape=self.shape, dtype=self.dtype,
          name=self._view_name)
    object_map[self].assign(self._copy_value())


def storage_of(variable):
  """The variable whose whole rows hold `variable`: an interleaved view's
  storage (`VariableView.interleaved_storage`), else `variable` itself."""
  if isinstance(variable, VariableView):
    storage = variable.interleaved_storage
    if storage is not None:
      return storage
  return variable
