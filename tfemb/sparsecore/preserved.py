"""What `TPUEmbeddingV2`'s lookup hands to `apply_gradients`."""

import weakref
from typing import Any, List, Optional, Tuple

from tensorflow.python.util import nest  # pylint: disable=g-direct-tensorflow-import

from tfemb.host.core import Engine as _Engine

# Each live `Preserved` made by a lookup, by the ids of its tensors: a copy
# of the same tensors (`strategy.run` passing it to one replica, `tf.nest`
# rebuilding it) is that lookup's batch.
_LOOKUPS = weakref.WeakValueDictionary()


def _tensor_ids(tables: Any) -> Tuple[int, ...]:
  return tuple(id(t) for t in nest.flatten(dict(tables)))


class Preserved(dict):
  """Keyed by stacked table name (as TensorFlow's partitioned tensors), each
  value the distinct rows the batch looks up, per table of the stack (rows
  of the table's own variable).

  Attributes: `owner`, the object that looked the batch up; `kept`, each
  feature's ids as looked up; `batch`, the step's gathered tables; after
  `dequeue` (or a lookup), `rows`, each feature's rows, and `applied`,
  which holds True once the batch's update ran (None before `dequeue`:
  an `enqueue`'s output cannot be applied).

  Made from a mapping alone, as `tf.nest` and `strategy.run` rebuild a
  dict (a function's outputs, every replica's regrouped): a copy of a
  live lookup's own tensors is that lookup's batch (its `applied` shared,
  so the batch updates once); of other tensors (a function's outputs), it
  holds the tables only, which no `dequeue` or `apply_gradients` takes."""

  def __init__(self, owner=None, kept=None, batch=None, tables=(), rows=None,
               applied: Optional[List[bool]] = None):
    copied = (not isinstance(owner, (type(None), _Engine)) and
              kept is None and batch is None)
    if copied:
      owner, tables = None, owner  # a mapping, or its items
    super().__init__(tables)
    self.owner, self.kept, self.batch = owner, kept, batch
    self.rows: Any = rows
    self.applied = applied
    if copied:
      self._link()
    elif self:
      _LOOKUPS[_tensor_ids(self)] = self

  def __setitem__(self, key, value):
    # `tf.nest` rebuilds a mutable mapping item by item.
    super().__setitem__(key, value)
    if self.owner is None:
      self._link()

  def _link(self) -> None:
    """A copy of a live lookup's own tensors: that lookup's batch."""
    original = _LOOKUPS.get(_tensor_ids(self)) if self else None
    if original is not None:
      self.owner, self.kept, self.batch = (original.owner, original.kept,
                                           original.batch)
      self.rows, self.applied = original.rows, original.applied

  def check_owner(self, engine, name: str) -> None:
    """Refuses a batch looked up by another object than `engine`: its rows
    are of that object's tables."""
    if self.owner is None:
      raise ValueError(
          f"{name} are a copy of a lookup's tables holding other tensors "
          "(as a tf.function returns them, or strategy.run splits them over "
          "replicas); expected the output of this object's enqueue or "
          "embedding lookup, or a copy holding its own tensors.")
    if self.owner is not engine:
      raise ValueError(
          f"{name} come from another TPUEmbeddingV2 object (tables "
          f"{sorted(self.owner.embedding_layouts)}); expected the output of "
          "this object's enqueue or embedding lookup (tables "
          f"{sorted(engine.embedding_layouts)}).")
