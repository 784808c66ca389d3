"""The tables and slots of the host engine, created as TensorFlow does.

`TableStore` creates every table's parameters and slots with the object
graph and names of TensorFlow's `TPUEmbedding` / `TPUEmbeddingForServing`
(children of the engine object named `<table>` and `<table>/<slot>`), so
checkpoints move between them. It initializes big tables in blocks of rows
(`tfemb.initialization`), keeps a table's slots beside its parameters in
one variable where the fused kernels train it (`tfemb.interleaved_tables`),
shards tables over parameter servers when asked, and refuses checkpoints of
another configuration. `gather_rows` reads rows in id order from any of
these variables.
"""

import contextlib
import functools
from typing import Any, Dict, List, Optional, Tuple

import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2
from tensorflow.python.distribute import sharded_variable  # pylint: disable=g-direct-tensorflow-import

from tfemb import initialization
from tfemb import interleaved_tables
from tfemb import optimizers
from tfemb import replicas
from tfemb.kernels import ops as kernel_ops
from tfemb import tf_internals

TableVariables = Dict[str, tf.Variable]  # {"parameters": .., slot: ..}
_OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
_VALUE_KEY = "VARIABLE_VALUE"


def slot_names(table) -> List[str]:
  """The names of the table's optimizer's slots, in its order."""
  return optimizers.slot_names(table.optimizer)


class TableStore:
  """Creates and guards the variables of `tables` for one engine.

  Args:
    tables: the resolved `TableConfig`s (`tfemb.resolution`).
    strategy: the strategy the engine was created under.
    options: the engine's `tfemb.options.Options`.
    slot_initializers: by table name, its slots' initializers where they
      are not the optimizer's (`tfemb.sparsecore.stacked_variables`).
  """

  def __init__(self, tables: List[Any], strategy, options,
               slot_initializers: Optional[Dict[str, List[Any]]] = None):
    self._tables = tables
    self._strategy = strategy
    self._options = options
    self._slot_initializers = slot_initializers or {}
    self.partitioner = None  # `TPUEmbedding.table_partitioner`

  def like(self, tables: List[Any],
           slot_initializers: Optional[Dict[str, List[Any]]] = None
          ) -> "TableStore":
    """A store of `tables` under this one's strategy and options."""
    return TableStore(tables, self._strategy, self._options,
                      slot_initializers)

  @property
  def partitioned(self) -> bool:
    """True under ParameterServerStrategy (tables may be sharded)."""
    return tf_internals.is_parameter_server_strategy(self._strategy)

  @contextlib.contextmanager
  def _partitioning(self):
    """The strategy's variable partitioner, or `partitioner`."""
    if self.partitioner is None:
      yield
      return
    with tf_internals.variable_partitioner(self._strategy, self.partitioner):
      yield

  def create(self, owner) -> Dict[str, TableVariables]:
    """Every table's variables, as children of the trackable `owner`."""
    with tf.init_scope(), self._strategy.scope(), self._partitioning():
      return {t.name: self._create(owner, t) for t in self._tables}

  def _advise_huge_pages(self, variable):
    """2 MiB pages for a table created empty, before it is filled; not on
    parameter servers, which lack the kernels."""
    if not self.partitioned:
      kernel_ops.advise_huge_pages(variable, self._options)

  def _create(self, owner, table) -> TableVariables:
    """Same object graph and names as TensorFlow's `TPUEmbeddingBase`.

    Where `tfemb.interleaved_tables` wants it, the parameters and slots are
    column views of one variable, under the same names and initializers
    (`interleaved_tables.create`).
    """
    names = slot_names(table)
    inits = self._slot_initializers.get(table.name) or (
        optimizers.slot_initializers(table.optimizer))
    track = functools.partial(self._track, owner, table)
    if interleaved_tables.wanted(table, self.partitioned, self._options):
      return interleaved_tables.create(table, names, inits, track,
                                       self._options)
    plain = functools.partial(self._plain, table)
    parameters = track(table.name, table.initializer, plain)
    slots = {}
    if table.optimizer is not None:
      if table.optimizer.slot_variable_creation_fn is not None:
        slots = table.optimizer.slot_variable_creation_fn(
            parameters, names, inits)
      else:
        slots = {
            name: track(table.name + "/" + name, init, plain,
                        trainable=False)
            for name, init in zip(names, inits)
        }
    slots["parameters"] = parameters
    return slots

  def _track(self, owner, table, name, initializer, make, trainable=True):
    """`owner`'s child `name`, a variable of `table` (its parameters or a
    slot), made by `make(name, dtype, initializer, trainable, blocks)` when
    TensorFlow's tracking asks for it: with a checkpoint's value as its
    initializer when a restore of it is pending, and `blocks` the rows of
    each block of its initialization (`tfemb.initialization`), or None."""
    table_shape = (table.vocabulary_size, table.dim)
    shapes = _shapes(table)

    def getter(name, shape, dtype, initializer, trainable):
      del shape  # The tracking code may clear it; use the table's.
      blocks = None
      if not self.partitioned and shapes[name] == table_shape:
        blocks = initialization.block_rows(initializer, table_shape, dtype)
      try:
        return make(name, dtype, initializer, trainable, blocks)
      except ValueError as e:  # a restored value of another shape
        raise ValueError(
            f"Table {table.name!r} ({name}): expected shape "
            f"{shapes[name]} (vocabulary_size, dim); the "
            f"checkpoint being restored holds another: {e}") from None

    return tf_internals.add_variable_with_custom_getter(
        owner,
        name=name,
        initializer=initializer,
        shape=shapes[name],
        dtype=tf.float32,
        getter=getter,
        trainable=trainable,
        overwrite=True)  # a build that failed part way may be retried

  def _plain(self, table, name, dtype, initializer, trainable, blocks):
    """A variable of its own for `table`'s parameters or slot `name`."""
    shape = _shapes(table)[name]
    if blocks:
      initial_value = initialization.uninitialized(shape, dtype)
    elif self.partitioned and initialization.is_elementwise(initializer):
      initial_value = _per_shard(initializer, shape, dtype)
    else:
      initial_value = functools.partial(initializer, shape, dtype=dtype)
    variable = tf.Variable(
        name=name,
        initial_value=initial_value,
        shape=shape,
        dtype=dtype,
        trainable=trainable)
    if blocks:
      self._advise_huge_pages(variable)
      initialization.fill_in_blocks(
          functools.partial(initialization.scatter_rows, variable),
          (table.vocabulary_size, table.dim), dtype, initializer, blocks)
    return variable

  @property
  def shapes(self) -> Dict[str, Tuple[int, ...]]:
    """The shape of every table's and slot's variable, by checkpoint name."""
    return {n: s for t in self._tables for n, s in _shapes(t).items()}

  def check_checkpoint(self, path: str) -> None:
    """Refuses, before anything is restored, a checkpoint whose embedding
    object holds a table or slot this configuration does not have, or one
    of another shape (TensorFlow asks the engine for its
    `_checkpoint_adapter(path)` before it restores or defers any child)."""
    check_checkpoint_nodes(path, {t.name for t in self._tables},
                           self.check_checkpoint_node)

  def check_checkpoint_node(self, children: Dict[str, Any]) -> None:
    """Refuses an embedding object's checkpoint children (`{name: shape
    held}`, as `check_checkpoint_nodes` gives them) that are not this
    configuration's tables and slots, or of another shape."""
    shapes = self.shapes
    for name, held in children.items():
      if name not in shapes:
        self.check_checkpoint_child(name)  # raises: not a table or slot here
      if held is not None and held != shapes[name]:
        raise ValueError(
            f"Table {name.partition('/')[0]!r} ({name}): expected shape "
            f"{shapes[name]} (vocabulary_size, dim); the checkpoint being "
            f"restored holds {held}. Nothing was restored.")

  def check_checkpoint_child(self, name: str) -> None:
    """Refuses a checkpoint child this configuration does not have: the
    checkpoint was saved with other tables or another optimizer."""
    slots = {t.name: slot_names(t) for t in self._tables}
    table, _, slot = name.partition("/")
    if table not in slots:
      raise ValueError(
          f"The checkpoint holds embedding table {table!r}, which this "
          f"TPUEmbedding does not have (its tables: {sorted(slots)}): it was "
          "saved with another configuration.")
    if slot and slot not in slots[table]:
      opt = next(t.optimizer for t in self._tables if t.name == table)
      raise ValueError(
          f"The checkpoint holds slot {slot!r} of table {table!r}, but this "
          f"TPUEmbedding trains the table with {type(opt).__name__} (slots "
          f"{slots[table]}): it was saved with another optimizer.")


@contextlib.contextmanager
def unreadable_restore_dropped(owner):
  """Creating `owner`'s tables, which reads a checkpoint restored into it
  before they existed: where that checkpoint cannot be read (damaged or
  missing files), the error says so and the restore is dropped, so the
  next build creates the tables as if it had not been tried (a restore is
  all or nothing)."""
  try:
    yield
  except (tf.errors.DataLossError, tf.errors.NotFoundError) as e:
    pending = tf_internals.deferred_dependencies(owner)
    if not pending:
      raise
    pending.clear()
    raise type(e)(e.node_def, e.op, (
        "The checkpoint restored into this embedding object before its "
        "tables were created cannot be read, so nothing of it was restored "
        "and the restore is dropped: the next build() creates the tables "
        f"from their initializers. The error: {e.message}")) from None


def check_checkpoint_nodes(path: str, names, check_node) -> None:
  """Refuses a checkpoint before anything of it is restored: `check_node(
  children)` raises a ValueError for an embedding object's children it
  refuses, `{local name: the shape its value holds, None where it holds
  none}`.

  The engine's own node in the checkpoint is one with a child holding a
  value named in `names`; when several look so and one of them fits,
  nothing is refused here (the children are still checked one by one as
  they are restored). A checkpoint without an object graph is not checked
  here either.
  """
  graph = trackable_object_graph_pb2.TrackableObjectGraph()
  try:
    reader = tf.train.load_checkpoint(path)
    graph.ParseFromString(reader.get_tensor(_OBJECT_GRAPH_KEY))
  except (tf.errors.OpError, ValueError, TypeError):
    return
  shapes = reader.get_variable_to_shape_map()
  errors = []
  for node in graph.nodes:
    children = {c.local_name: _value_key(graph.nodes[c.node_id])
                for c in node.children if not c.local_name.startswith("_")}
    if not any(name in names and key for name, key in children.items()):
      continue  # not an embedding object of these tables
    # A table or slot holds a value of rank 1 or 2; other children are not
    # the engine's (`tf.train.Checkpoint(root=engine)` adds its `save_counter`
    # and a `root` without one).
    held = {name: tuple(shapes[key]) if key in shapes else None
            for name, key in children.items() if key}
    try:
      check_node({name: shape for name, shape in held.items()
                  if shape is None or len(shape) in (1, 2)})
    except ValueError as e:
      errors.append(e)
    else:
      return  # a node that fits
  if errors:
    raise errors[0]


def _value_key(node) -> Optional[str]:
  """The checkpoint key of a checkpointed variable's value, if it is one."""
  return next((a.checkpoint_key for a in node.attributes
               if a.name == _VALUE_KEY), None)


def _shapes(table) -> Dict[str, Tuple[int, ...]]:
  """The shape of the table's variable and of each slot's, by name (the
  names of their checkpoint children); a CustomOptimizer's 1-D slots
  (`slot_dims`) hold one value per row."""
  table_shape = (table.vocabulary_size, table.dim)
  names = slot_names(table)
  dims = getattr(table.optimizer, "slot_dims", ()) or ()
  dims = list(dims) + [2] * (len(names) - len(dims))
  shapes = {table.name: table_shape}
  shapes.update({f"{table.name}/{n}": (table.vocabulary_size,) if d == 1
                 else table_shape for n, d in zip(names, dims)})
  return shapes


def _per_shard(initializer, shape, dtype):
  """The initial value of a table or slot that ParameterServerStrategy may
  shard: it asks each shard's value with `partition_shape` and
  `partition_offset`. An elementwise initializer gives that shard's rows
  alone, on its parameter server (the same law, or for `RowIdInitializer`
  the same values), instead of the whole table there, sliced."""
  def value(partition_shape=None, partition_offset=None):
    if partition_shape is None:
      return initializer(shape, dtype=dtype)
    return initialization.from_row(initializer, partition_offset[0])(
        partition_shape, dtype=dtype)
  return value


class ByTableConfig(dict):
  """Keyed by the resolved `TableConfig`s; the user's own `TableConfig`
  objects and the tables' names are accepted as keys too."""

  def __init__(self, items, aliases: Optional[Dict[int, Any]] = None):
    super().__init__(items)
    self._aliases = aliases or {}  # id(user's TableConfig) -> resolved

  def _key(self, key):
    if isinstance(key, str):
      return next((table for table in self if table.name == key), None)
    return self._aliases.get(id(key))

  def __missing__(self, key):
    resolved = self._key(key)
    if resolved is None or not dict.__contains__(self, resolved):
      raise KeyError(key)
    return self[resolved]

  def __contains__(self, key):
    return dict.__contains__(self, key) or self._key(key) is not None


def gather_rows(variable, ids):
  """Rows `ids` of a table or slot, in the order of `ids`.

  A `ShardedVariable` (tables over parameter servers) is read per shard
  with TensorFlow's "div" routing; its own `sparse_read` would return the
  rows grouped by shard, not in the order asked for. A mirrored variable
  is read from the replica's own copy.
  """
  if isinstance(variable, sharded_variable.ShardedVariable):
    return tf.nn.embedding_lookup(variable, ids)
  # On a mirrored variable (no sparse_read of its own) tf.gather would read
  # the whole table: a resource gather of the replica's copy instead.
  return tf.gather(replicas.local_copy(variable), ids)
