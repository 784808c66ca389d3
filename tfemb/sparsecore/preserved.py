"""What `TPUEmbeddingV2`'s lookup hands to `apply_gradients`."""

from typing import Any, List, Optional

from tfemb.host.core import Engine as _Engine


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
  dict (a function's outputs, every replica's regrouped), it holds the
  tables only: no `apply_gradients` takes it."""

  def __init__(self, owner=None, kept=None, batch=None, tables=(), rows=None,
               applied: Optional[List[bool]] = None):
    if not isinstance(owner, (type(None), _Engine)) and kept is None and (
        batch is None):
      owner, tables = None, owner  # a mapping, or its items
    super().__init__(tables)
    self.owner, self.kept, self.batch = owner, kept, batch
    self.rows: Any = rows
    self.applied = applied

  def check_owner(self, engine, name: str) -> None:
    """Refuses a batch looked up by another object than `engine`: its rows
    are of that object's tables."""
    if self.owner is None:
      raise ValueError(
          f"{name} are a copy of a lookup's tables (as a function returns "
          "them, or strategy.run passes or returns them); expected the "
          "output of this object's enqueue or embedding lookup itself.")
    if self.owner is not engine:
      raise ValueError(
          f"{name} come from another TPUEmbeddingV2 object (tables "
          f"{sorted(self.owner.embedding_layouts)}); expected the output of "
          "this object's enqueue or embedding lookup (tables "
          f"{sorted(engine.embedding_layouts)}).")
