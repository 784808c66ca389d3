"""What an engine's object graph holds in a SavedModel.

A SavedModel holds the variables its functions read. A checkpoint holds
other objects for some tables, so the engines' `_trackable_children` call
`children` when the save is a SavedModel:

* an interleaved table (`tfemb.interleaved_tables`): its storage, the one
  variable its `ColumnView`s read (the views save their columns in a
  checkpoint and nothing in a SavedModel);
* a host `TPUEmbeddingV2`: each table's own variables, which its functions
  read (`tfemb.serving.sparsecore_export`), in place of the stacked views
  over them that a checkpoint holds.
"""

from typing import Any, Dict, Optional, Protocol, runtime_checkable

Tables = Dict[str, Dict[str, Any]]  # {table name: {"parameters": .., slot: ..}}


@runtime_checkable
class View(Protocol):
  """A variable over part of a larger storage: `tfemb.variable_view.
  VariableView`, whose `interleaved_storage` (None for a view of several
  variables) is declared there. This module imports nothing of tfemb, so
  it names the interface here."""

  @property
  def interleaved_storage(self) -> Optional[Any]:
    """The variable whose whole rows hold the view, or None."""


def _storage(variable) -> Optional[Any]:
  """The interleaved storage that holds `variable`, or None."""
  return variable.interleaved_storage if isinstance(variable, View) else None


def children(checkpointed: Dict[str, Any], tables: Tables,
             stacked: Optional[Tables] = None) -> Dict[str, Any]:
  """An engine's children in a SavedModel.

  Args:
    checkpointed: its children in a checkpoint, by name.
    tables: its tables' variables, by table name.
    stacked: None, or a stacked engine's stacked views (by stacked table
      name), which give way to the tables' own variables.
  """
  views = {id(v) for slots in (stacked or {}).values() for v in slots.values()}
  result = {name: child for name, child in checkpointed.items()
            if id(child) not in views}
  for table, variables in tables.items():
    for slot, variable in variables.items():
      if stacked is not None and _storage(variable) is None:
        result[f"_tables/{table}/{slot}"] = variable
  for table, variables in tables.items():
    storage = _storage(variables.get("parameters"))
    if storage is not None:
      result[f"_interleaved/{table}"] = storage
  return result
