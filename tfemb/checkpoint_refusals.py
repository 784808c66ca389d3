"""Refusing a checkpoint of another configuration, for both generations.

A restore is all or nothing: before anything of a checkpoint is restored
(or deferred until the tables exist), the engines read what its embedding
object holds and refuse it, naming the table and what was expected, when it
was saved with other tables, another optimizer or other shapes. Here is
what both generations share:

* `check_nodes`: the checkpoint's object graph read once, each embedding
  object's children (`{name: the shape it holds}`) handed to a check;
* `check_child`: the refusal of a table or slot this configuration does
  not have;
* `check_shapes`: the first generation's check of a node, one variable
  per table and slot (the SparseCore's too, for a checkpoint of its own
  layout), and `wrong_shape`, every refusal of a shape;
* `unreadable_restore_dropped`: a deferred restore whose files cannot be
  read, dropped with an error that says so.

The host engine's `TableStore` (`tfemb.host.table_store`) checks its tables
with them; the host `TPUEmbeddingV2`'s checks of a checkpoint of unstacked
tables or of another layout are its adapter's
(`tfemb.sparsecore.checkpoint_adapter`), on the same pieces.
"""

import contextlib
from typing import Any, Callable, Collection, Dict, Iterable, Mapping, Optional

import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2

from tfemb import tf_internals

_OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
_VALUE_KEY = "VARIABLE_VALUE"
NOTHING_RESTORED = " Nothing was restored."

Children = Dict[str, Optional[tuple]]  # {local name: shape held, or None}


def check_nodes(path: str, names,
                check_node: Callable[[Children], None]) -> None:
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


def check_child(name: str, slots: Mapping[str, Collection[str]],
                engine: str, tables: Optional[Iterable[str]] = None,
                optimizers: Optional[Mapping[str, Any]] = None) -> None:
  """Refuses a checkpoint child `name` (`<table>` or `<table>/<slot>`)
  that is not a table of `slots` (`{table: its slots}`) or one of its
  slots: the checkpoint was saved with other tables or another optimizer.

  Args:
    name: the child's name in the checkpoint.
    slots: the tables and slots this configuration has.
    engine: the engine's class name, for the messages.
    tables: the tables the message lists (default: those of `slots`).
    optimizers: by table, the optimizer the message of a slot names, with
      its slots; None: the message names neither.
  """
  table, _, slot = name.partition("/")
  if table in slots and (not slot or slot in slots[table]):
    return
  if slot and table in slots:
    if optimizers is None:
      raise ValueError(
          f"The checkpoint holds slot {slot!r} of table {table!r}, which "
          f"this {engine}'s optimizer does not have: it was saved with "
          "another optimizer.")
    raise ValueError(
        f"The checkpoint holds slot {slot!r} of table {table!r}, but this "
        f"{engine} trains the table with {type(optimizers[table]).__name__} "
        f"(slots {slots[table]}): it was saved with another optimizer.")
  listed = sorted(slots if tables is None else tables)
  raise ValueError(
      f"The checkpoint holds embedding table {table!r}, which this "
      f"{engine} does not have (its tables: {listed}): it was saved with "
      "another configuration.")


def wrong_shape(table: str, variable: str, expected, holds: str
               ) -> ValueError:
  """The refusal of a value of another shape than `expected` for table
  `table`'s variable, which `variable` names after the table's name (" (t/
  slot)", "/slot", or ""); `holds`: what the checkpoint holds, said to the
  end of the message."""
  return ValueError(
      f"Table {table!r}{variable}: expected shape {expected} "
      f"(vocabulary_size, dim); the checkpoint {holds}")


def check_shapes(children: Children, shapes: Mapping[str, tuple],
                 check_unknown: Callable[[str], None]) -> None:
  """Refuses an embedding object's checkpoint `children` (`{name: shape
  held}`, as `check_nodes` gives them) that are not variables of `shapes`
  (`check_unknown(name)` raises for them), or of another shape."""
  for name, held in children.items():
    if name not in shapes:
      check_unknown(name)  # raises: not a table or slot here
    if held is not None and held != shapes[name]:
      raise wrong_shape(
          name.partition("/")[0], f" ({name})", shapes[name],
          f"being restored holds {held}." + NOTHING_RESTORED)


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
