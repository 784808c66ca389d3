"""Interleaved tables: a table's slots beside its parameters, in one variable.

A step looks a table's rows up and then updates them with their slots. With
the parameters and each slot in variables of their own, the update goes to
1 + slots other places in memory for every row; with all of them side by
side in one `[rows, (1 + slots) x dim]` variable, the storage (the
parameters first, then the slots in the optimizer's order), each row is one
place, and a lookup's read of it can leave the page translation and the
neighbouring lines for the update. That counts in a training step's order,
where every table is looked up before any is updated and a row's lines are
gone from the caches when its update comes (`experiments/layout.py --order`
measures it).

Everyone else still sees TensorFlow's variables: the parameters and each
slot are a `ColumnView` of their columns of the storage, a `tf.Variable` of
`[rows, dim]` with TensorFlow's name, read, assigned, differentiated
(through `tf.gather`) and checkpointed under the same keys as a plain
variable, so checkpoints move to and from TensorFlow's classes unchanged.
A SavedModel holds the storage and, as variables of their own, the views'
values (so twice the table's bytes); functions read the views with
TensorFlow's ops only, so exported graphs load without tfemb.

A checkpoint save would read every view, and columns cannot be read
without a copy (TensorFlow's saver takes all of a checkpoint's tensors at
once): that would need the tables' bytes a second time. Instead a save
splits each table (`kernel_ops.split_columns`): its rows move into one
contiguous block per view, the saver writes slices of the blocks, and the
rows move back when the save is over, so saving takes no more memory than
with separate variables.
Restores write the views in place (`kernel_ops.write_columns`).

Here, all of the layout:

* `wanted`: which tables take it. It is the default for the tables that
  can; the option `interleaved_slots=False` (`tfemb.options`) for the
  engine that creates them keeps every table in variables of its own.
* `create`: a table's storage and its views, as the host engine's
  `TableStore` (`tfemb.host.variables`) creates a table's variables.
* `ColumnView`, with its checkpoint save and restore and its SavedModel
  export; `assign_value` and `assigned`, its assignment's checks and
  result, which the SparseCore's stacked views share
  (`tfemb.sparsecore.stacked_variables`).

Its kernels are the fused kernels' entry points in `tfemb.kernels.ops`
that know the layout: `read_columns`, `write_columns`, `split_columns` and
`rejoin_columns` (a view's eager reads, writes and checkpoint save), and
`dedup_gather`, `apply_rows` and `check_rows`, which take the whole row of
the storage behind a view (their `row_width` and `interleaved`
attributes). Their C++ is in `tfemb/kernels/`: `column_split.cc` (and
`column_split.h`) the save's split (`TfembSplitColumns`,
`TfembRejoinColumns`); `embedding_kernels.cc` the columns' reads and
writes (`TfembReadColumns`, `TfembWriteColumns`) and the whole-row lookup
and update (`TfembDedupGather`, `TfembApplyRows`, `TfembCheckRows`).
"""

from typing import Any, Callable, Dict, Optional, Sequence

import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.trackable import base as trackable
from tensorflow.python.training.saving import saveable_object  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.types import core  # pylint: disable=g-direct-tensorflow-import

from tfemb import initialization
from tfemb import optimizers
from tfemb import options
from tfemb.kernels import build as kernel_build
from tfemb.kernels import ops as kernel_ops
from tfemb import tf_internals


def wanted(table, partitioned: bool,
           opts: Optional[options.Options] = None) -> bool:
  """Whether `table` is created interleaved (called under the strategy).

  Tables with slots, on a single-replica CPU host (no distribution
  strategy, no parameter-server sharding, no GPU), trained by a lazy rule
  through the fused kernels, with TensorFlow's own slot creation, when
  `opts` (default: the current options) has `interleaved_slots` and
  `fused_kernels` on.
  """
  opts = options.get() if opts is None else opts
  opt = table.optimizer
  return (opts.interleaved_slots and optimizers.is_optimizer(opt) and
          bool(optimizers.identify(opt).slots) and
          opt.slot_variable_creation_fn is None and
          getattr(opt, "lazy_adam", True) and not partitioned and
          not tf.distribute.has_strategy() and
          not tf.config.list_logical_devices("GPU") and
          kernel_build.load(opts) is not None)


def create(table, names: Sequence[str], initializers: Sequence[Any],
           track: Callable[..., tf.Variable],
           opts: options.Options) -> Dict[str, "ColumnView"]:
  """The variables of `table`, a table `wanted`: its storage, and over it a
  view for the parameters and one for each slot.

  Args:
    table: the resolved `TableConfig`.
    names: its optimizer's slots, in its order (their columns' order).
    initializers: theirs, in the same order.
    track: `track(name, initializer, make, trainable=True)`: the owner's
      child `name`, made when TensorFlow's tracking asks for it (with a
      checkpoint's value as its initializer when a restore of it is
      pending) by `make(name, dtype, initializer, trainable, blocks)`
      (`blocks`: the rows of each block of its initialization, or None).
    opts: the engine's options (for the storage's huge pages).

  Returns:
    The views by slot name, then "parameters" (a table's variables).
  """
  table_shape = (table.vocabulary_size, table.dim)
  width = (1 + len(names)) * table.dim
  # No child of the owner: a checkpoint holds the views, a SavedModel the
  # storage too (`tfemb.serving.savedmodel`).
  storage = tf.Variable(
      initialization.uninitialized((table.vocabulary_size, width),
                                   tf.float32),
      shape=(table.vocabulary_size, width), dtype=tf.float32,
      trainable=False, name=table.name + "/interleaved")
  kernel_ops.advise_huge_pages(storage, opts)
  # A view's columns, by the name TensorFlow gives the variable.
  column = {table.name: 0}
  column.update({f"{table.name}/{n}": k + 1 for k, n in enumerate(names)})

  def view(name, dtype, initializer, trainable, blocks):
    variable = ColumnView(storage, column[name] * table.dim, table.dim, name,
                          trainable)
    if blocks:
      initialization.fill_in_blocks(variable.assign_rows, table_shape,
                                    dtype, initializer, blocks)
    else:
      variable.assign(initializer(table_shape, dtype=dtype),
                      read_value=False)
    if initialization.is_restored(initializer):  # not restored again
      tf_internals.mark_restored(variable, initializer.restore_uid)
    return variable

  parameters = track(table.name, table.initializer, view)
  views = {name: track(f"{table.name}/{name}", init, view, trainable=False)
           for name, init in zip(names, initializers)}
  views["parameters"] = parameters
  return views


# --- ColumnView: columns of the storage, as a variable of their own ---------


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


class ColumnView(tf.Variable, core.Tensor):
  """Columns `[begin, begin + dim)` of `storage`, as a `[rows, dim]` variable.

  Eager reads copy just these columns (in a function, stock ops read the
  storage, then the columns); `assign` writes them in place
  (`ResourceStridedSliceAssign`); `tf.gather` / `sparse_read` gather the
  rows and keep these columns, with the gradient of a gather of a
  `[rows, dim]` variable; the scatter methods of `tf.Variable`
  (`scatter_update`, `scatter_add`, ..., `scatter_nd_update`, ...) write
  the elements they name, in place, by TensorFlow's element scatters on
  the storage.
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
    """The variable that holds the whole table (for the fused kernels)."""
    return self._storage

  def _should_act_as_resource_variable(self):
    """Watched by tapes and captured by functions through `handle`."""

  @property
  def handle(self):
    return self._storage.handle

  @property
  def name(self) -> str:
    return self._view_name + ":0"

  @property
  def _shared_name(self) -> str:
    return self._view_name

  @property
  def dtype(self):
    return self._storage.dtype

  @property
  def shape(self) -> tf.TensorShape:
    return tf.TensorShape([self._storage.shape[0], self._dim])

  def get_shape(self) -> tf.TensorShape:
    return self.shape

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
      return kernel_ops.read_columns(self._storage, self._begin, self._dim)
    return self._storage.read_value()[:, self._begin:self._begin + self._dim]

  def read_value(self) -> tf.Tensor:
    return self.value()

  read_value_no_copy = read_value

  def numpy(self):
    return self.value().numpy()

  def __array__(self, dtype=None, copy=None):
    # numpy 2's protocol: the columns live inside a wider table, so an array
    # of them is always a copy; `copy=False` asks for none and is refused.
    if copy is False:
      raise ValueError(f"{self.name}: a column view's values are always "
                       "copied out of its table; use copy=None or True.")
    return self.numpy() if dtype is None else self.numpy().astype(dtype)

  def _dense_var_to_tensor(self, dtype=None, name=None, as_ref=False):
    del name, as_ref
    if dtype is not None and dtype != self.dtype:
      raise ValueError(f"{self.name} is {self.dtype.name}, not {dtype}")
    return self.value()

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
      kernel_ops.rejoin_columns(self._storage)

  def _write(self, value, start: int):
    """`value` into rows [start, start + len(value)): eagerly by tfemb's op
    (in place; TensorFlow's strided-slice assign copies the whole storage
    once it has been read sparsely), in a function by TensorFlow's."""
    if tf.executing_eagerly():
      return kernel_ops.write_columns(self._storage, self._begin, value, start)
    n = value.shape[0]
    end = None if n is None else start + int(n)
    return self._storage[start:end,
                         self._begin:self._begin + self._dim].assign(value)

  # --- writing ------------------------------------------------------------

  def assign_rows(self, start: int, rows):
    """Writes `rows` into rows [start, start + len(rows)), in place."""
    return self._write(tf.convert_to_tensor(rows, self.dtype), start)

  def assign(self, value, use_locking=None, name=None, read_value=True):
    del use_locking, name
    return assigned(self, self._write(assign_value(self, value), 0),
                    read_value)

  def assign_add(self, delta, use_locking=None, name=None, read_value=True):
    return self.assign(self.value() + delta, read_value=read_value)

  def assign_sub(self, delta, use_locking=None, name=None, read_value=True):
    return self.assign(self.value() - delta, read_value=read_value)

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
    saving needs no second copy of the table (`kernel_ops.split_columns`).
    In a function (a SavedModel's), a read."""
    if not tf.executing_eagerly():
      return self.value()
    parts = int(self._storage.shape[1]) // self._dim
    blocks = kernel_ops.split_columns(self._storage, parts)
    return blocks[self._begin // self._dim]

  def _restore_from_tensors(self, restored_tensors):
    return self.assign(restored_tensors[trackable.VARIABLE_VALUE_KEY],
                       read_value=False)

  def _copy_trackable_to_cpu(self, object_map):
    """An async save's copy (`tf.train.CheckpointOptions(
    experimental_enable_async_checkpoint=True)`): a `[rows, dim]` variable
    made at the first such save, into which every save copies the columns
    (tfemb's op: no copy of the whole storage) before training goes on; the
    save's thread writes the copy, as it does for TensorFlow's variables."""
    if self not in object_map:
      object_map[self] = resource_variable_ops.UninitializedVariable(
          trainable=self.trainable, shape=self.shape, dtype=self.dtype,
          name=self._shared_name)
    object_map[self].assign(
        kernel_ops.read_columns(self._storage, self._begin, self._dim))


def assign_value(variable, value) -> tf.Tensor:
  """`value` to assign to a view-like `variable`: of its dtype, and of its
  shape, or refused as `tf.Variable.assign` refuses it."""
  value = tf.convert_to_tensor(value, variable.dtype)
  if not value.shape.is_compatible_with(variable.shape):
    raise ValueError(f"Cannot assign a value of shape {value.shape} to "
                     f"{variable.name} of shape {variable.shape}.")
  return value


def assigned(variable, op, read_value: bool):
  """What `assign` returns once `op` wrote it: the new value, or `op`."""
  if read_value:
    with tf.control_dependencies([op]):
      return variable.value()
  return op


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
