"""`ColumnView`: columns of an interleaved table's storage, as a variable of
their own (`tfemb.interleaved_tables`): read, written in place, gathered
and scattered, saved in a checkpoint under a plain variable's key and
exported to a SavedModel. What it shares with the SparseCore's stacked
views is `tfemb.variable_view.VariableView`."""

import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.trackable import base as trackable
from tensorflow.python.training.saving import saveable_object  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.types import core  # pylint: disable=g-direct-tensorflow-import

from tfemb import tf_internals
from tfemb import variable_view
from tfemb.kernels import fused_ops


def _row_scatter(method: str):
  """tf.Variable's `scatter_<method>(sparse_delta)` for a ColumnView."""

  def scatter(self, sparse_delta, use_locking=False, name=None):
    del use_locking, name
    return self._scatter(method, sparse_delta)  # pylint: disable=protected-access

  scatter.__doc__ = f"`tf.Variable.scatter_{method}` on the view's columns."
  return scatter


def _element_scatter(method: str):
  """tf.Variable's `scatter_nd_<method>(indices, updates)` for a
  ColumnView."""

  def scatter_nd(self, indices, updates, name=None):
    del name
    return self._scatter_nd(method, indices, updates)  # pylint: disable=protected-access

  scatter_nd.__doc__ = (f"`tf.Variable.scatter_nd_{method}` on the view's "
                        "columns.")
  return scatter_nd


def _storage_attribute(attribute: str) -> property:
  """A ColumnView's property that is its storage's `attribute`."""
  return property(lambda self: getattr(self._storage, attribute),  # pylint: disable=protected-access
                  doc=f"The storage's `{attribute}`.")


class ColumnView(variable_view.VariableView, tf.Variable, core.Tensor):
  """Columns `[begin, begin + dim)` of `storage`, as a `[rows, dim]` variable.

  Eager reads copy just these columns (in a function, stock ops read the
  storage, then the columns); `assign` writes them in place
  (`ResourceStridedSliceAssign`); `tf.gather` / `sparse_read` gather the
  rows and keep these columns, with the gradient of a gather of a
  `[rows, dim]` variable; the scatter methods of `tf.Variable`
  (`scatter_update`, `scatter_add`, ..., `scatter_nd_update`, ...) write
  the elements they name, in place, by TensorFlow's element scatters on
  the storage. Its name, reads as a tensor or an array, `assign` and
  asynchronous checkpoint copy are a `VariableView`'s.

  `tf.Variable.__init__` does not run: it would create a variable of its
  own. The view keeps its storage and its columns instead, and answers
  from them what `tf.Variable`'s methods read (shape, dtype, handle,
  reads and writes).
  """

  def __init__(self, storage: tf.Variable, begin: int, dim: int, name: str,
               trainable: bool):  # pylint: disable=super-init-not-called
    self._storage = storage
    self._begin = begin
    self._dim = dim
    self._view_name = name
    self._trainable = trainable

  # --- what it is ---------------------------------------------------------

  @property
  def interleaved_storage(self) -> tf.Variable:
    """The variable that holds the whole table (for the fused kernels and
    a SavedModel)."""
    return self._storage

  def _should_act_as_resource_variable(self):
    """Watched by tapes and captured by functions through `handle`."""

  @property
  def handle(self):
    return self._storage.handle

  @property
  def _shared_name(self) -> str:
    return self._view_name

  @property
  def dtype(self):
    return self._storage.dtype

  @property
  def shape(self) -> tf.TensorShape:
    return tf.TensorShape([self._storage.shape[0], self._dim])

  def set_shape(self, shape):
    if not self.shape.is_compatible_with(shape):
      raise ValueError(f"{self.name} has shape {self.shape}, not {shape}")

  @property
  def _unique_id(self) -> str:
    """Distinct among the views of one storage (optimizers key on it)."""
    return f"{tf_internals.unique_id(self._storage)}/{self._begin}"

  @property
  def trainable(self) -> bool:
    return self._trainable

  # The storage's own: a view is placed, created and run with it.
  device = _storage_attribute("device")
  synchronization = _storage_attribute("synchronization")
  aggregation = _storage_attribute("aggregation")
  graph = _storage_attribute("graph")
  op = _storage_attribute("op")
  initializer = _storage_attribute("initializer")

  @property
  def constraint(self):
    return None

  def __repr__(self):
    return (f"<tfemb ColumnView '{self.name}' shape={self.shape} "
            f"columns [{self._begin}, {self._begin + self._dim}) of "
            f"{self._storage.shape}>")

  # --- reading ------------------------------------------------------------

  def value(self) -> tf.Tensor:
    """Eagerly, tfemb's op copies just the columns; in a function, stock
    ops (a read of the storage, then its columns), so that exported graphs
    load without tfemb."""
    resource_variable_ops.variable_accessed(self)  # for tapes and functions
    if tf.executing_eagerly():
      return fused_ops.read_columns(self._storage, self._begin, self._dim)
    return self._storage.read_value()[:, self._begin:self._begin + self._dim]

  read_value_no_copy = variable_view.VariableView.read_value

  def __array__(self, dtype=None, copy=None):
    # numpy 2's protocol: the columns live inside a wider table, so an array
    # of them is always a copy; `copy=False` asks for none and is refused.
    if copy is False:
      raise ValueError(f"{self.name}: a column view's values are always "
                       "copied out of its table; use copy=None or True.")
    return super().__array__(dtype)

  def sparse_read(self, indices, name=None):
    del name
    resource_variable_ops.variable_accessed(self)
    self._rejoin()
    return _gather_columns(self._storage.handle, tf.convert_to_tensor(indices),
                           self._begin, self._dim, self._storage.shape[0])

  def gather_nd(self, indices, name=None):
    return tf.gather_nd(self.value(), indices, name=name)

  def _rejoin(self):
    """Eagerly, the storage's rows back if a save has split them (tfemb's
    kernels do it themselves; TensorFlow's ops do not)."""
    if tf.executing_eagerly():
      fused_ops.rejoin_columns(self._storage)

  def _write(self, value, start: int):
    """`value` into rows [start, start + len(value)): eagerly by tfemb's op
    (in place; TensorFlow's strided-slice assign copies the whole storage
    once it has been read sparsely), in a function by TensorFlow's."""
    if tf.executing_eagerly():
      return fused_ops.write_columns(self._storage, self._begin, value, start)
    n = value.shape[0]
    end = None if n is None else start + int(n)
    return self._storage[start:end,
                         self._begin:self._begin + self._dim].assign(value)

  # --- writing ------------------------------------------------------------

  def assign_rows(self, start: int, rows):
    """Writes `rows` into rows [start, start + len(rows)), in place."""
    return self._write(tf.convert_to_tensor(rows, self.dtype), start)

  def _write_value(self, value: tf.Tensor):
    """`assign`'s write: every row."""
    return self._write(value, 0)

  # --- scatters: element updates of the storage at the view's columns ---

  def _scatter_nd(self, method: str, indices, updates):
    """`storage.scatter_nd_<method>` at view positions `indices` (their
    last axis 1: rows; 2: (row, column)), in place and by TensorFlow's ops,
    so that other columns of the storage are untouched."""
    indices = tf.convert_to_tensor(indices)
    updates = tf.convert_to_tensor(updates, self.dtype)
    depth = indices.shape[-1]
    if depth not in (1, 2):
      raise ValueError(f"{self.name}: scatter indices must end in 1 (rows) "
                       f"or 2 (row, column), got shape {indices.shape}")
    rows = tf.cast(indices[..., :1], tf.int64)
    if depth == 1:  # every column of each row
      shape = tf.concat([tf.shape(rows, out_type=tf.int64)[:-1], [self._dim]],
                        0)
      columns = tf.range(self._begin, self._begin + self._dim, dtype=tf.int64)
      positions = tf.stack([tf.broadcast_to(rows, shape),
                            tf.broadcast_to(columns, shape)], axis=-1)
    else:
      columns = tf.cast(indices[..., 1:], tf.int64) + self._begin
      positions = tf.concat([rows, columns], axis=-1)
    self._rejoin()
    getattr(self._storage, f"scatter_nd_{method}")(positions, updates)
    return self

  def _scatter(self, method: str, sparse_delta):
    if not isinstance(sparse_delta, tf.IndexedSlices):
      raise TypeError(f"{self.name}: sparse_delta must be an IndexedSlices, "
                      f"got {sparse_delta!r}")
    rows = tf.expand_dims(sparse_delta.indices, -1)
    if method in ("mul", "div"):  # no element scatter: read, then write
      old = tf.gather(self, sparse_delta.indices)
      new = (old * sparse_delta.values if method == "mul" else
             old / sparse_delta.values)
      return self._scatter_nd("update", rows, new)
    return self._scatter_nd(method, rows, sparse_delta.values)

  scatter_update = _row_scatter("update")
  scatter_add = _row_scatter("add")
  scatter_sub = _row_scatter("sub")
  scatter_max = _row_scatter("max")
  scatter_min = _row_scatter("min")
  scatter_mul = _row_scatter("mul")
  scatter_div = _row_scatter("div")
  batch_scatter_update = _row_scatter("update")  # rank-1 indices: the same
  scatter_nd_update = _element_scatter("update")
  scatter_nd_add = _element_scatter("add")
  scatter_nd_sub = _element_scatter("sub")
  scatter_nd_max = _element_scatter("max")
  scatter_nd_min = _element_scatter("min")

  # --- SavedModel: the storage is exported; the view maps onto its copy ---

  def _trackable_children(self, save_type=trackable.SaveType.CHECKPOINT,
                          **kwargs):
    del save_type, kwargs
    return {}  # its storage: its owner's child (`tfemb.serving.savedmodel`)

  def _deserialization_dependencies(self, children):
    del children
    return {"interleaved_storage": self._storage}  # exported first

  def _export_to_saved_model_graph(self, object_map, tensor_map, options,
                                   **kwargs):
    del tensor_map, options, kwargs
    object_map[self] = ColumnView(object_map[self._storage], self._begin,
                                  self._dim, self._view_name,
                                  self._trainable)
    return []

  def _write_object_proto(self, proto, options):
    """Saved as a variable of [rows, dim]: loaded, it holds the view's
    values then (the functions read the storage)."""
    resource_variable_ops.write_object_proto_for_resource_variable(
        self, proto, options)

  # --- checkpoints: the same key and value as a plain variable ------------

  def _serialize_to_tensors(self):
    """The value, read when a save writes it (a restore only asks what is
    saved): see `saved_value`."""
    spec = saveable_object.SaveSpec(
        self.saved_value, "", trackable.VARIABLE_VALUE_KEY, dtype=self.dtype,
        device=self._storage.device)
    return {trackable.VARIABLE_VALUE_KEY: spec}

  def saved_value(self) -> tf.Tensor:
    """Eagerly, a slice of the storage split into its parts: its rows move
    out for the save and come back when the save's tensors are gone, so
    saving needs no second copy of the table (`fused_ops.split_columns`).
    In a function (a SavedModel's), a read."""
    if not tf.executing_eagerly():
      return self.value()
    parts = int(self._storage.shape[1]) // self._dim
    blocks = fused_ops.split_columns(self._storage, parts)
    return blocks[self._begin // self._dim]

  def _restore_from_tensors(self, restored_tensors):
    return self.assign(restored_tensors[trackable.VARIABLE_VALUE_KEY],
                       read_value=False)

  def _copy_value(self) -> tf.Tensor:
    """An async save's copy of the columns (`VariableView.
    _copy_trackable_to_cpu`), by tfemb's op: no copy of the whole
    storage."""
    return fused_ops.read_columns(self._storage, self._begin, self._dim)


tf.register_tensor_conversion_function(ColumnView,
                                      tf_internals.dense_var_to_tensor)
tf_internals.overload_operators(ColumnView)


def _gather_columns(handle, ids, begin: int, dim: int, rows: int):
  """Rows `ids` of columns [begin, begin + dim) of the storage behind
  `handle`, by stock ops (a resource gather, then the columns). Its
  gradient with respect to the handle is that of a gather of a
  `[rows, dim]` variable: the view's, which a tape watching the view (its
  handle is the storage's) is asked for."""

  @tf.custom_gradient
  def gather(handle, ids):
    out = tf.raw_ops.ResourceGather(resource=handle, indices=ids,
                                    dtype=tf.float32)[:, begin:begin + dim]

    def grad(upstream):
      shape = tf.constant([rows, dim], tf.int64)
      # New tensors (not the forward's ids), as a function's outputs.
      return tf.IndexedSlices(tf.convert_to_tensor(upstream),
                              tf.identity(ids), shape), None

    return out, grad

  return gather(handle, ids)
