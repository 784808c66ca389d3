"""Restoring checkpoints of other layouts into the host `TPUEmbeddingV2`.

The host's stacked variables restore, slots included, from:

* a checkpoint of unstacked tables, `<table>` and `<table>/<slot>` as
  tfemb's `TPUEmbedding`, TensorFlow's `TPUEmbedding` on the CPU and
  `TPUEmbeddingForServing` write them;
* a checkpoint of stacked tables laid out for another SparseCore count (a
  TPU with another number of chips, the host under another strategy): the
  layouts it was saved with are in its `_sparse_core_table_layouts`.

Each stacked variable (and each of its slots) is assembled from the
checkpoint's tables as the SparseCore lays them out (`tfemb.sparsecore.
table_stacking`), as TensorFlow's `TpuEmbeddingV3CheckpointAdapter` does on
a TPU. TensorFlow's adapter is not used here: it defers a slot under its
parameters' name (so the slots do not restore) and names the tables of a
stack by replacing substrings of checkpoint keys. The layouts a checkpoint
was saved with are read by `tfemb.sparsecore.checkpoint_layouts`; what it
refuses is refused as the first generation refuses it
(`tfemb.checkpoint_refusals`).

As with TensorFlow's adapter, the values are rearranged only while the
variables are created: restore such a checkpoint before the first lookup or
`build()`. A restore into built variables of another layout is refused.
"""

import functools
from typing import Any, Dict, List, Optional, Sequence

import tensorflow as tf
from tensorflow.core.tpu.kernels import sparse_core_layout_pb2
from tensorflow.python.checkpoint import checkpoint_adapter
from tensorflow.python.trackable import trackable_utils

from tfemb import checkpoint_refusals
from tfemb import optimizers
from tfemb.sparsecore import checkpoint_layouts
from tfemb.sparsecore import combiner as combiner_lib
from tfemb.sparsecore import table_stacking

_Layout = sparse_core_layout_pb2.SparseCoreTableLayout
_ATTRIBUTES = "/" + trackable_utils.OBJECT_ATTRIBUTES_NAME + "/"


def _by_stack(layouts: Sequence[_Layout]) -> Dict[str, List[_Layout]]:
  """Layouts grouped by stacked table, each group in row-offset order."""
  stacks: Dict[str, List[_Layout]] = {}
  for layout in layouts:
    stacks.setdefault(layout.stacked_table_name, []).append(layout)
  return {name: sorted(group, key=lambda l: l.sparse_core_shard_row_offset)
          for name, group in stacks.items()}


class _Restack(checkpoint_adapter.ReshardCallback):
  """Builds one stacked variable (or one of its slots) from `sources`, the
  checkpoint's variables holding its tables (unstacked tables, or stacked
  tables of `source_layouts`)."""

  def __init__(self, target: str, sources: Sequence[str], slot: str,
               target_layouts: Sequence[_Layout],
               source_layouts: Optional[Dict[str, List[_Layout]]],
               keys: frozenset, initializer: Optional[Any] = None):
    self._target = target
    self._sources = list(sources)
    self._slot = slot
    self._initializer = initializer  # of the padding; None: zeros
    self._target_layouts = list(target_layouts)
    self._source_layouts = source_layouts
    self._keys = keys

  def object_name(self) -> str:
    return self._target

  def update_restore_inputs(self, checkpoint_key: str,
                            shape_and_slice_spec: str):
    """The keys of every source variable, read whole."""
    del shape_and_slice_spec
    trigger = trackable_utils.escape_local_name(self._sources[0]) + _ATTRIBUTES
    prefix, found, attribute = checkpoint_key.rpartition(trigger)
    if not found:
      raise ValueError(f"Unexpected checkpoint key {checkpoint_key!r} for "
                       f"{self._sources[0]!r}.")
    keys = []
    for source in self._sources:
      key = (prefix + trackable_utils.escape_local_name(source) + _ATTRIBUTES +
             attribute)
      if key not in self._keys:
        raise ValueError(
            f"Stacked table {self._target!r} needs {source!r} from the "
            f"checkpoint, which does not hold it (it holds "
            f"{self._sources[0]!r}): it was saved with another "
            "configuration.")
      keys.append(key)
    return keys, [""] * len(keys)

  def check(self, children: Dict[str, Optional[Sequence[int]]],
            shape: Sequence[int]) -> None:
    """Refuses, before anything is restored, a checkpoint whose embedding
    object's `children` (`{name: shape held}`) hold some of this variable's
    sources but not all, or a table of another shape than this variable's
    (of `shape`) holds."""
    present = [s for s in self._sources if s in children]
    if not present:
      return  # not restored: a slot the checkpoint does not have
    missing = [s for s in self._sources if s not in children]
    if missing:
      raise ValueError(
          f"Stacked table {self._target!r} needs {missing[0]!r} from the "
          f"checkpoint, which does not hold it (it holds {present[0]!r}): it "
          "was saved with another configuration or optimizer. Nothing was "
          "restored.")
    rank = len(shape)
    suffix = "/" + self._slot if self._slot else ""
    if self._source_layouts is None:
      held = {l.table_name: children[l.table_name + suffix]
              for l in self._target_layouts}
    else:
      held = {}
      for source in self._sources:
        for layout in self._source_layouts[source.partition("/")[0]]:
          stacked = _stacked_shape(layout, rank)
          if children[source] not in (None, tuple(stacked)):
            raise ValueError(
                f"The checkpoint's stacked table {source!r} holds shape "
                f"{list(children[source])}; its layouts say {stacked}. "
                "Nothing was restored.")
          held[layout.table_name] = tuple(layout.unsharded_shape[:rank])
    for layout in self._target_layouts:
      expected = tuple(layout.unsharded_shape[:rank])
      got = held[layout.table_name]
      if got is not None and tuple(got) != expected:
        raise checkpoint_refusals.wrong_shape(
            layout.table_name, suffix, list(expected),
            f"holds {list(got)}." + checkpoint_refusals.NOTHING_RESTORED)

  def _tables(self, values: Sequence[tf.Tensor]) -> Dict[str, tf.Tensor]:
    """The checkpoint's values as unstacked tables, by table name."""
    if self._source_layouts is None:
      return {l.table_name: v for l, v in zip(self._target_layouts, values)}
    tables = {}
    for name, value in zip(self._sources, values):
      stack = name.partition("/")[0]
      for layout in self._source_layouts[stack]:
        rows, dim = layout.unsharded_shape
        table = tf.gather(value, layout_rows(layout, rows))
        tables[layout.table_name] = table if table.shape.rank == 1 else (
            table[:, :dim])
    return tables

  def reshard(self, checkpoint_values, shape_and_slice: str) -> tf.Tensor:
    values = checkpoint_values
    if not isinstance(values, (list, tuple)):
      values = [values]
    tables = self._tables(values)
    shape = _stacked_shape(self._target_layouts[0], values[0].shape.rank)
    # Padding rows and columns as a new object has them: zero parameters, a
    # slot's initial value (an Adagrad accumulator of 0 would turn the
    # padding columns of a touched row into NaN).
    stacked = (tf.zeros(shape, values[0].dtype) if self._initializer is None
               else tf.cast(self._initializer(shape, dtype=tf.float32),
                            values[0].dtype))
    for layout in self._target_layouts:
      table = tables[layout.table_name]
      expected = list(layout.unsharded_shape[:table.shape.rank])
      if table.shape.as_list() != expected:
        raise checkpoint_refusals.wrong_shape(
            layout.table_name, "/" + self._slot if self._slot else "",
            expected, f"holds {table.shape.as_list()}.")
      rows = layout_rows(layout, expected[0])
      if table.shape.rank == 2 and shape[1] > expected[1]:
        table = tf.concat(
            [table, tf.gather(stacked, rows)[:, expected[1]:]], axis=1)
      stacked = tf.tensor_scatter_nd_update(stacked, rows[:, None], table)
    if shape_and_slice:  # one partition's part
      offsets = shape_and_slice.split(" ")[-1].split(":")
      begin, size = zip(*(map(int, o.split(",")) for o in offsets))
      stacked = tf.slice(stacked, begin, size)
    return stacked


def _stacked_shape(layout: _Layout, rank: int) -> List[int]:
  """The shape of the stacked variable (rank 2) or 1-D slot (rank 1) that
  holds `layout`'s table."""
  rows = layout.total_rows_per_sparse_core_shard * layout.num_sparse_cores
  return [rows] if rank == 1 else [rows, layout.unsharded_padded_shape[1]]


def layout_rows(layout: _Layout, rows: int) -> tf.Tensor:
  return table_stacking.layout_rows(layout, tf.range(rows, dtype=tf.int64))


class Adapter(checkpoint_adapter.AbstractCheckpointAdapter):
  """Restores a checkpoint of other layouts into the stacked variables of
  `stacking`, whose stacked tables have the slots of `slots`.

  Args:
    path: the checkpoint.
    stacking: the host's `table_stacking.Stacking`.
    slots: per stacked table name, its slots' initializers by slot name.
  """

  def __init__(self, path: str, stacking, slots: Dict[str, Dict[str, Any]]):
    self._saved = checkpoint_layouts.saved_layouts(path)
    self._keys = frozenset(
        tf.train.load_checkpoint(path).get_variable_to_dtype_map())
    self._stacking = stacking
    self._slots = slots
    self._callbacks: Dict[str, _Restack] = {}
    self._known = set()
    self._plan()

  @classmethod
  def create_from_checkpoint(cls, path: str):
    """TensorFlow's factory takes only the path; this adapter also needs
    the embedding's layouts and slots (`TPUEmbeddingV2._checkpoint_adapter`
    creates it)."""
    raise TypeError("Adapter needs the embedding: Adapter(path, stacking, "
                    "slots).")

  @property
  def unstacked(self) -> bool:
    """True for a checkpoint of unstacked tables."""
    return self._saved is None

  @property
  def needed(self) -> bool:
    """False when the checkpoint holds this very layout."""
    if self._saved is None:
      return True
    ours = self._stacking.embedding_layouts()
    return set(ours) != set(self._saved) or any(
        ours[name] != layout for name, layout in self._saved.items())

  def _plan(self):
    """One callback per stacked variable and slot, keyed by the first
    checkpoint variable it reads (the one whose restore triggers it)."""
    source_stacks = None if self._saved is None else _by_stack(
        self._saved.values())
    for name, stacked in self._stacking.stacked_tables.items():
      targets = sorted((self._stacking.tables[t].layout
                        for t in stacked.table_names),
                       key=lambda l: l.sparse_core_shard_row_offset)
      if source_stacks is None:
        sources = [l.table_name for l in targets]
      else:
        missing = [l.table_name for l in targets
                   if l.table_name not in self._saved]
        if missing:
          raise ValueError(
              f"The checkpoint holds no table {missing[0]!r} (its tables: "
              f"{sorted(self._saved)}): it was saved with another "
              "configuration.")
        sources = sorted({self._saved[l.table_name].stacked_table_name
                          for l in targets})
      initializers = {"": None, **self._slots.get(name, {})}
      for slot, initializer in initializers.items():
        suffix = "/" + slot if slot else ""
        named = [s + suffix for s in sources]
        if named[0] in self._callbacks:
          raise NotImplementedError(
              f"The checkpoint's stacked table {sources[0]!r} feeds more than "
              "one stacked table of this TPUEmbeddingV2; restore it into a "
              "configuration that stacks its tables alike.")
        self._callbacks[named[0]] = _Restack(name + suffix, named, slot,
                                             targets, source_stacks,
                                             self._keys, initializer)
        self._known.update(named)
        self._known.add(name + suffix)  # the variable's own name

  def is_applicable(self, trackable) -> bool:
    del trackable
    return self.needed

  def get_reshard_callback(self, name: str):
    return self._callbacks.get(name)

  @property
  def names(self) -> frozenset:
    """The checkpoint children it restores from, and the stacked
    variables' own names."""
    return frozenset(self._known)

  def check_node(self, children: Dict[str, Optional[Sequence[int]]],
                 shapes: Dict[str, Sequence[int]]) -> None:
    """Refuses, before anything is restored, the checkpoint's embedding
    object whose `children` (`{name: shape held}`) this configuration
    cannot restore whole: a table or slot it does not have, a stacked
    variable some of whose tables it holds but not all, or a table of
    another shape. `shapes`: the stacked variables', by name."""
    for name in children:
      self.check_child(name)
    if self._saved is not None:
      for name, layout in sorted(self._saved.items()):
        if (name not in self._stacking.tables and
            layout.stacked_table_name in children):
          self.check_child(name)  # raises: not a table here
    for callback in self._callbacks.values():
      callback.check(children, shapes[callback.object_name()])

  def check_child(self, name: str) -> None:
    """Refuses a checkpoint child this configuration cannot restore (the
    names of the stacked variables themselves are accepted)."""
    if name in self._known:
      return
    slots: Dict[str, set] = {}
    for known in self._known:
      table, _, slot = known.partition("/")
      slots.setdefault(table, set()).update([slot] if slot else [])
    checkpoint_refusals.check_child(name, slots, "TPUEmbeddingV2",
                                    tables=self._stacking.tables)


def checked_adapter(path: str, stacking, store, stacked_tables,
                    user_tables, built: bool) -> Optional[Adapter]:
  """`TPUEmbeddingV2._checkpoint_adapter`: refuses, before anything of it
  is restored or deferred, a checkpoint the engine cannot restore whole;
  returns the `Adapter` of a checkpoint of unstacked tables or another
  layout, None for one of this layout (`store`, a `TableStore`, checks
  that)."""
  slots = {t.name: dict(zip(optimizers.slot_names(t.optimizer),
                            optimizers.slot_initializers(t.optimizer)))
           if t.optimizer else {} for t in stacked_tables}
  adapter = Adapter(path, stacking, slots)
  if not adapter.needed:
    adapter = None
  if adapter is None:
    names, check = stacking.stacked_tables, store.check_checkpoint_node
  else:
    names, check = adapter.names, functools.partial(adapter.check_node,
                                                    shapes=store.shapes)
  # First what no restore could take (naming the table and shapes), then
  # what only a restore before the tables exist can.
  checkpoint_refusals.check_nodes(
      path, names,
      functools.partial(_check_combiner_weights, user_tables, check))
  if adapter is not None and built:
    held = ("unstacked" if adapter.unstacked else
            "stacked for another SparseCore layout")
    raise ValueError(
        f"The checkpoint {path!r} holds the tables {held}; they fit this "
        "configuration, but this TPUEmbeddingV2 rearranges them only as it "
        "creates its tables: restore it before the first lookup or build() "
        "(e.g. into a new object of this configuration). Nothing was "
        "restored.")
  return adapter


def _check_combiner_weights(user_tables, check, children) -> None:
  """Refuses CustomCombiner weights the engine does not have, or not as
  many; `check` refuses the other children (`{name: shape held}`)."""
  weights = {f"{t.name}/{combiner_lib.SLOT}": (t.combiner.num_weights,)
             for t in user_tables
             if combiner_lib.is_custom(t.combiner) and
             t.combiner.num_weights > 0}
  for name, held in children.items():
    if not name.endswith("/" + combiner_lib.SLOT):
      continue
    table = name.rpartition("/")[0]
    if name not in weights:
      raise ValueError(
          f"The checkpoint holds CustomCombiner weights of table {table!r}, "
          "which has none here: it was saved with another configuration. "
          "Nothing was restored.")
    if held is not None and held != weights[name]:
      raise ValueError(
          f"Table {table!r}: expected {weights[name][0]} CustomCombiner "
          f"weights; the checkpoint holds shape {list(held)}. Nothing was "
          "restored.")
  check({name: held for name, held in children.items()
         if not name.endswith("/" + combiner_lib.SLOT)})
