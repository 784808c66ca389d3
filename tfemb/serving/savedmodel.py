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

from typing import Any, Dict, Optional

Tables = Dict[str, Dict[str, Any]]  # {table name: {"parameters": .., slot: ..}}


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
      if stacked is not None and not hasattr(variable, "interleaved_storage"):
        result[f"_tables/{table}/{slot}"] = variable
  for table, variables in tables.items():
    storage = getattr(variables.get("parameters"), "interleaved_storage",
                      None)
    if storage is not None:
      result[f"_interleaved/{table}"] = storage
  return result
