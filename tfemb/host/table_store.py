"""The tables and slots of the host engine, created as TensorFlow does.

`TableStore` creates every table's parameters and slots with the object
graph and names of TensorFlow's `TPUEmbedding` / `TPUEmbeddingForServing`
(children of the engine object named `<table>` and `<table>/<slot>`), so
checkpoints move between them. It initializes big tables in blocks of rows
(`tfemb.initialization`), keeps a table's slots beside its parameters in
one variable where the fused kernels train it (`tfemb.interleaved_tables`),
shards tables over parameter servers when asked, and refuses checkpoints of
another configuration (`tfemb.checkpoint_refusals`).

Under a host TPUStrategy (`tfemb.patch(tpu=TYPE)`: for the host engine,
any TPU strategy is one) a table is one variable on the host, not a copy
per replica: as a TPU's embedding memory serves every core, the replicas
look their batches up in it and one update per step writes the global
batch's gradient (`one_copy`, `tfemb.host.step`).
"""

import contextlib
import functools
from typing import Any, Dict, List, Optional, Tuple

import tensorflow as tf

from tfemb import checkpoint_refusals
from tfemb import initialization
from tfemb import interleaved_tables
from tfemb import optimizers
from tfemb import tf_internals
from tfemb import tpu_strategies
from tfemb.kernels import fused_ops

TableVariables = Dict[str, tf.Variable]  # {"parameters": .., slot: ..}


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
    trainable: whether the tables' parameters are trainable variables
      (slots never are). TensorFlow's SparseCore engine makes none
      trainable: its step trains them, and code that looks them up under
      `tf.custom_gradient` (keras-rs) needs them so.
  """

  def __init__(self, tables: List[Any], strategy, options,
               slot_initializers: Optional[Dict[str, List[Any]]] = None,
               trainable: bool = True):
    self._tables = tables
    self._strategy = strategy
    self._options = options
    self._slot_initializers = slot_initializers or {}
    self._trainable = trainable
    self.partitioner = None  # `TPUEmbedding.table_partitioner`

  def like(self, tables: List[Any],
           slot_initializers: Optional[Dict[str, List[Any]]] = None,
           trainable: bool = True) -> "TableStore":
    """A store of `tables` under this one's strategy and options."""
    return TableStore(tables, self._strategy, self._options,
                      slot_initializers, trainable)

  @property
  def strategy(self):
    """The strategy the engine was created under."""
    return self._strategy

  @property
  def partitioned(self) -> bool:
    """True under ParameterServerStrategy (tables may be sharded)."""
    return tf_internals.is_parameter_server_strategy(self._strategy)

  @property
  def one_copy(self) -> bool:
    """True where every replica shares one variable per table (a host
    TPU's), which one update per step writes; else each replica of a
    mirrored strategy has its copy."""
    return tpu_strategies.is_tpu_strategy(self._strategy)

  @contextlib.contextmanager
  def _copies(self):
    """Variables as the strategy makes them, or with `one_copy` a plain
    variable on the host, made past the strategy's own creator (which
    would mirror it on every replica's device)."""
    if not self.one_copy:
      yield
      return

    def one_variable(next_creator, **kwargs):
      del next_creator
      return tf_internals.plain_variable(**kwargs)

    with tf.variable_creator_scope(one_variable), tf.device(
        tf_internals.HOST_CPU):
      yield

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
    with tf.init_scope(), self._strategy.scope(), self._partitioning(), (
        self._copies()):
      return {t.name: self._create(owner, t) for t in self._tables}

  def _advise_huge_pages(self, variable):
    """2 MiB pages for a table created empty, before it is filled; not on
    parameter servers, which lack the kernels."""
    if not self.partitioned:
      fused_ops.advise_huge_pages(variable, self._options)

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
    if self.partitioned:
      track = _placed_alike(self._strategy, track)
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
        raise checkpoint_refusals.wrong_shape(
            table.name, f" ({name})", shapes[name],
            f"being restored holds another: {e}") from None

    return tf_internals.add_variable_with_custom_getter(
        owner,
        name=name,
        initializer=initializer,
        shape=shapes[name],
        dtype=tf.float32,
        getter=getter,
        trainable=trainable and self._trainable,
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
    checkpoint_refusals.check_nodes(path, {t.name for t in self._tables},
                                    self.check_checkpoint_node)

  def check_checkpoint_node(self, children: Dict[str, Any]) -> None:
    """Refuses an embedding object's checkpoint children (`{name: shape
    held}`, as `checkpoint_refusals.check_nodes` gives them) that are not
    this configuration's tables and slots, or of another shape."""
    checkpoint_refusals.check_shapes(children, self.shapes,
                                     self.check_checkpoint_child)

  def check_checkpoint_child(self, name: str) -> None:
    """Refuses a checkpoint child this configuration does not have: the
    checkpoint was saved with other tables or another optimizer."""
    checkpoint_refusals.check_child(
        name, {t.name: slot_names(t) for t in self._tables}, "TPUEmbedding",
        optimizers={t.name: t.optimizer for t in self._tables})


def _shapes(table) -> Dict[str, Tuple[int, ...]]:
  """The shape of the table's variable and of each slot's, by name (the
  names of their checkpoint children); a CustomOptimizer's 1-D slots
  (`optimizers.slot_dims`) hold one value per row."""
  table_shape = (table.vocabulary_size, table.dim)
  names = slot_names(table)
  dims = optimizers.slot_dims(table.optimizer)
  shapes = {table.name: table_shape}
  shapes.update({f"{table.name}/{n}": (table.vocabulary_size,) if d == 1
                 else table_shape for n, d in zip(names, dims)})
  return shapes


def _placed_alike(strategy, track):
  """`track`, each variable it creates placed on the parameter servers as
  the first one was: ParameterServerStrategy places variables and their
  shards round robin, so a slot's shard i would otherwise land on another
  server than the parameters' shard i whenever a table has fewer shards
  than there are servers. Alike, each shard's update reads and writes one
  server only (`tfemb.host.sharded`)."""
  start = tf_internals.round_robin_position(strategy)

  def placed(*args, **kwargs):
    tf_internals.set_round_robin_position(strategy, start)
    return track(*args, **kwargs)

  return placed


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
